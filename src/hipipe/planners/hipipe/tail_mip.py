"""Every chunk's order below its first dim, chosen by the exact planner's MIP.

The polish (:mod:`.sequence_mip`) judges order multisets one at a time, each by a MIP over
its sequences, and moves one chunk's order per step. On libra-4d (ReduceScatter, K = 4)
the proven optimum was three such steps away from the polished plan, each alone no
faster: the plan's orders ``(0,1,2,3) (0,1,3,2) (1,3,0,2) (2,0,1,3)`` against the
optimum's ``(0,1,2,3) (0,3,1,2) (1,0,2,3) (2,0,3,1)``, +1.01% at 1 GiB and +0.96% at
256 MiB. The two share every chunk's first dim, and that is what makes the step cheap:
the exact model (:mod:`hipipe.planners.exact.model`) with each chunk held to its first dim
in the plan (6 orders of 24 on 4 dims) and the plan as its start proves both optima in
300-400 nodes (under a second), where the free model takes 20-30 s.

The MIP runs to a node count, not a clock (:data:`TAIL_MAX_NODES`), so a plan is the same
on every machine; its orders and sequences are then re-sized by the sizing LP (which only
moves the makespan down), so the candidate is timed by the planner's own cost model.
"""

import numpy as np

from hipipe.planners.exact.model import (
    ExactModel,
    hold_first_dims,
    models_overheads,
    new_solver,
    solver_values,
)
from hipipe.planners.hipipe.candidates import (
    IMPROVEMENT,
    Candidate,
    SearchLog,
    SearchOptions,
    better,
    optimize_structure,
)
from hipipe.planners.hipipe.structure import to_chunks
from hipipe.simulator import Policy, simulate_chunks
from hipipe.topology import Topology

TAIL_MAX_CHUNKS = 4
"""Plans of up to this many chunks (the few-chunk range the polish covers)."""

TAIL_DIMS = (3, 4)
"""Networks with this many dims: on 2 dims a first dim fixes the order, and beyond 4 the
exact model is too large (5! orders per chunk)."""

TAIL_MAX_NODES = 1_000
"""Branch-and-bound nodes per solve. The ReduceScatter optima above were proven within 400;
an AllReduce on libra-4d at 1 GiB (K = 4, 64 ops) gets its improving incumbent within 1,000
(5.5716 -> 5.4930 ms, 1.5 s on a 2-core host; the restricted optimum, 5.4718 ms, takes
14,000), and 256 MiB none within 3,000 (its restricted optimum is 0.4% faster, after 28,000)."""

SOLVER_SETTINGS: dict[str, object] = {
    "mip_max_nodes": TAIL_MAX_NODES,
    "mip_feasibility_tolerance": 1e-9,
    "primal_feasibility_tolerance": 1e-9,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_effort": 0.0,
}
"""The plan is already a good start: with the primal heuristics on, the solves above found
the same incumbents in twice the time."""


def applies(topology: Topology, num_chunks: int, options: SearchOptions) -> bool:
    """Whether :func:`free_tails` runs for a plan of ``num_chunks`` chunks: not in the
    ablations, and only where the exact model charges every term the planner does."""
    return (
        options.climb
        and options.lp_sizes
        and 2 <= num_chunks <= TAIL_MAX_CHUNKS
        and topology.num_dims in TAIL_DIMS
        and models_overheads(topology)
    )


def free_tails(
    topology: Topology,
    message_bytes: int,
    best: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``best``, or a faster plan whose chunks keep their first dims and may take any order
    below them, with any sequences and sizes: the exact MIP's incumbent within
    :data:`TAIL_MAX_NODES` from ``best``, re-sized by the sizing LP."""
    num_chunks = best.structure.num_chunks
    if not applies(topology, num_chunks, options):
        return best
    key = (best.structure.orders, best.structure.sequences, tuple(best.sizes_bytes.tolist()))
    if key not in log.free_tails:
        log.free_tails[key] = _solved(topology, message_bytes, best, options=options, unit_s=unit_s, log=log)
        log.improved(best, log.free_tails[key], "free tails")
    return log.free_tails[key]


def _solved(
    topology: Topology,
    message_bytes: int,
    best: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """The solve behind :func:`free_tails` (``best`` when it finds nothing faster)."""
    num_chunks = best.structure.num_chunks
    start = simulate_chunks(
        topology,
        message_bytes,
        to_chunks(best.structure.orders, best.sizes_bytes),
        policy=Policy.FIXED,
        sequences=best.structure.sequences,
        collective=options.collective,
    )
    model = ExactModel(topology, message_bytes, num_chunks, options.collective, time_unit_s=start.makespan_s)
    values = model.values_of(start)
    if values is None:
        return best
    solver = new_solver(model, SOLVER_SETTINGS)
    # The model orders chunks by order index, so by first dim: chunk j keeps the j-th
    # smallest of the plan's first dims.
    hold_first_dims(solver, model, sorted(order[0] for order in best.structure.orders))
    solver.setSolution(model.num_cols, np.arange(model.num_cols, dtype=np.int32), values)
    solver.run()
    if int(solver.getInfo().primal_solution_status) == 0:
        return best
    solution = solver_values(solver)
    if not float(solution[model.makespan_col]) < 1.0 - IMPROVEMENT:
        return best  # the start itself, or no better than it
    orders, _, sequences = model.decode(solution)
    candidate = optimize_structure(
        topology,
        message_bytes,
        tuple(orders),
        [model.op_sequences(orders, sequences)],
        source=best.structure.source,
        options=options,
        unit_s=unit_s,
        log=log,
        resequence=False,
    )
    return candidate if better(best, candidate) else best
