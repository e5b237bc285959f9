"""The ``exact`` planner: the best schedule with at most K chunks, proven by a MIP.

A yardstick for the heuristic planners on small instances (:mod:`.model` has the
formulation). The MIP starts from known schedules with K chunks (the ``pipelined``
baseline, and ``hipipe`` when it plans the collective): the best of them bounds the
makespan, which is both the time unit and the big-M, and HiGHS only has to improve on
it. After the solve, the simulator re-times the MIP's orders, sizes and sequences
(``fixed`` policy) and must agree with the MIP's makespan, and the checker must prove the
schedule. From 5 chunks on 3-4 dims the MIP is split into one per multiset of the chunks'
first dims (:mod:`.first_dims`). ``info`` records whether optimality was proven, the final
gap, and how the time went: the seed planners first (``seed_time_s``), then the MIP, whose
time the limit bounds.
"""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import highspy
import numpy as np

from hipipe.bounds import best_bound_s
from hipipe.checker import check_or_raise
from hipipe.errors import HipipeError, SolverError
from hipipe.planners.exact.first_dims import solve_by_first_dims
from hipipe.planners.exact.model import ExactModel, models_overheads, new_solver, solver_values
from hipipe.planners.hipipe.search import AT_MOST_MAX_CHUNKS
from hipipe.schedule import Chunk, Collective, Schedule
from hipipe.simulator import Policy, simulate_chunks
from hipipe.topology import Topology

MAX_DIMS = 4
"""Beyond 4 dims the 120+ orders per chunk make the MIP far too large to prove."""
MAX_CHUNKS = 6
"""Beyond 6 chunks the sequencing binaries (quadratic in K) stop the proof in practice."""
DEFAULT_TIME_LIMIT_S = 60.0
METHODS: tuple[str, ...] = ("auto", "whole", "first-dims")
"""``whole``: one MIP over everything; ``first-dims``: one MIP per multiset of the chunks'
first dims (:mod:`.first_dims`); ``auto``: first-dims from :data:`SPLIT_FROM_CHUNKS` chunks
on 3 or more dims, whole otherwise."""
SPLIT_FROM_CHUNKS = 5
"""From here on the whole MIP's dual bound stalls at the pipeline bound on 3-4 dims
(libra-4d 256 MiB ReduceScatter, K = 5: 24.6% gap after 48 s), while the first-dim MIPs
prove the same instance in 80-100 s. At K <= 4 the whole MIP proves every reference
ReduceScatter and AllGather instance within the optimality benchmark's 40 s and stays the
default (its AllReduce on libra-4d at 256 MiB, K = 4, is the exception: 24.7% gap after 56 s
whole, proven in 177 s split; ``method="first-dims"`` asks for it)."""
MIP_RELATIVE_GAP = 1e-6
"""Stop once the incumbent is proven within this of the optimum (HiGHS' default is 1e-4)."""
MIP_ABSOLUTE_GAP = 1e-9
"""In units of the seed's makespan."""
FEASIBILITY_TOLERANCE = 1e-9
"""Tight, so the MIP's makespan and the simulator's agree to 1e-6 along long chains."""
AGREEMENT_RELATIVE = 1e-6
DEFAULT_SEEDS: tuple[str, ...] = ("pipelined", "hipipe")
"""Planners whose K-chunk schedules start the MIP (any that plans the collective)."""
AT_MOST_SEEDS: dict[str, int] = {"hipipe": AT_MOST_MAX_CHUNKS}
"""Seed planners whose forced K is already the best they find with at most K chunks, up to
this K: hipipe settles every K' <= 4 inside a forced K, and a forced K above 4 is never
worse than a forced 4. Their fewer-chunk schedules would only be slower starts, and they
cost the most: on libra-4d at 256 MiB hipipe plans K = 3 and 4 in 7 and 14 s, so seeding
K = 6 with every count took 51 s before the MIP began, and 29 s with K = 5 and 6 alone."""


def plan_exact(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    seeds: Sequence[str] = DEFAULT_SEEDS,
    method: str = "auto",
    jobs: int = 1,
) -> Schedule:
    """The makespan-optimal hierarchical schedule with at most ``num_chunks`` chunks.

    Single-dim ops, every chunk visits every dim once, one op per dim at a time. On the
    time limit, returns the best schedule found with its proven gap (``info``).
    ``method`` is one of :data:`METHODS`; ``jobs``: first-dims MIPs solved at once, one
    worker process each (the whole method is one MIP and runs alone).
    """
    collective = Collective.parse(collective)
    if num_chunks is None:
        raise HipipeError("the exact planner needs a number of chunks (--chunks K)")
    validate_instance(
        topology, message_bytes, num_chunks, time_limit_s, method, max_chunks_allowed=MAX_CHUNKS, jobs=jobs
    )
    started = time.perf_counter()
    seed_schedules = _seed_schedules(topology, message_bytes, num_chunks, collective, seeds)
    seed_time_s = time.perf_counter() - started
    best_seed = min(seed_schedules, key=lambda s: s.makespan_s)
    model = ExactModel(topology, message_bytes, num_chunks, collective, time_unit_s=best_seed.makespan_s)
    if method == "auto":
        method = "first-dims" if num_chunks >= SPLIT_FROM_CHUNKS and topology.num_dims >= 3 else "whole"
    bound_s = best_bound_s(topology, message_bytes, collective)
    if method == "whole":
        solved = _solve_whole(model, seed_schedules, best_seed, time_limit_s=time_limit_s, bound_s=bound_s)
    else:
        solved = _solve_by_first_dims(model, best_seed, time_limit_s=time_limit_s, bound_s=bound_s, jobs=jobs)
    mip_makespan_s: float | None = None
    incumbent = "mip"
    if solved.values is None:
        # No MIP solution below the seeds' (HiGHS refused every start and found nothing
        # within the limit, or no first-dim MIP beat the best seed): keep the best seed.
        schedule, incumbent = _as_exact(best_seed), best_seed.planner
    else:
        mip_makespan_s = float(solved.values[model.makespan_col]) * model.time_unit_s
        schedule = schedule_from_values(model, solved.values)
        if abs(schedule.makespan_s - mip_makespan_s) > AGREEMENT_RELATIVE * schedule.makespan_s:
            raise SolverError(
                f"the exact MIP predicted {mip_makespan_s:.9g} s but the simulator times its plan at "
                f"{schedule.makespan_s:.9g} s: the MIP solution is not trustworthy"
            )
        if schedule.makespan_s > best_seed.makespan_s * (1 + AGREEMENT_RELATIVE):
            if solved.proven:
                raise SolverError(
                    f"the exact MIP claims {schedule.makespan_s:.9g} s is optimal but {best_seed.planner}"
                    f" found {best_seed.makespan_s:.9g} s: the MIP is wrong"
                )
            schedule, incumbent = _as_exact(best_seed), best_seed.planner  # a start HiGHS did not take
    check_or_raise(schedule)  # the checker proves all three collectives
    info: dict[str, Any] = {
        "num_chunks": schedule.num_chunks,
        "chunks_allowed": num_chunks,
        "method": method,
        "proven_optimal": solved.proven,
        "mip_status": solved.status,
        "mip_gap": _finite_or_none(max(0.0, solved.gap)),
        "incumbent": incumbent,
        "mip_makespan_s": mip_makespan_s,
        "mip_dual_bound_s": _finite_or_none(solved.dual_bound * model.time_unit_s),
        "mip_nodes": solved.nodes,
        "solve_time_s": time.perf_counter() - started,
        "seed_time_s": seed_time_s,
        "time_limit_s": time_limit_s,
        "seeds_makespan_s": {s.planner: s.makespan_s for s in seed_schedules},
        "orders_used": [list(c.dims_order()) for c in schedule.chunks],
        "best_bound_s": bound_s,
        **solved.extra,
    }
    return replace(schedule, info=info)


def validate_instance(
    topology: Topology,
    message_bytes: int,
    num_chunks: int,
    time_limit_s: float,
    method: str,
    *,
    max_chunks_allowed: int,
    jobs: int = 1,
) -> None:
    """One-line :class:`HipipeError` for an instance the MIP does not take: a size that is
    not a positive whole number of bytes, too many chunks or dims, an unknown method, a
    time limit that is not a positive number, a number of worker processes that is not a
    whole number from 1, or calibrated overheads the model lacks."""
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, int) or message_bytes <= 0:
        raise HipipeError(f"message size must be a positive whole number of bytes, got {message_bytes!r}")
    if num_chunks < 1 or num_chunks > max_chunks_allowed:
        raise HipipeError(f"the exact planner handles 1..{max_chunks_allowed} chunks, got {num_chunks}")
    if topology.num_dims > MAX_DIMS:
        raise HipipeError(
            f"the exact planner handles up to {MAX_DIMS} dimensions, this network has {topology.num_dims}"
        )
    if method not in METHODS:
        raise HipipeError(f"the exact planner's method is one of {', '.join(METHODS)}, got {method!r}")
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise HipipeError(f"the time limit must be a positive number of seconds, got {time_limit_s!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise HipipeError(f"jobs must be a whole number of processes, 1 or more, got {jobs!r}")
    if not models_overheads(topology):
        raise HipipeError(
            "the exact planner models latency, bandwidth and a per-op cost only; this topology also"
            f" has calibrated overheads ({topology.overheads.describe()})"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Solved:
    """One method's answer, in the model's time units (the best seed's makespan is 1)."""

    values: np.ndarray | None
    """A MIP solution (None: the whole MIP found nothing, not even a start it accepted; the
    first-dim MIPs found nothing below the best seed)."""
    proven: bool
    status: str
    gap: float
    dual_bound: float
    nodes: int
    extra: dict[str, Any] = field(default_factory=dict)
    """Method-specific ``info`` entries."""


def mip_settings() -> dict[str, Any]:
    """The HiGHS options of every exact MIP: tight gaps and feasibility tolerances."""
    return {
        "mip_rel_gap": MIP_RELATIVE_GAP,
        "mip_abs_gap": MIP_ABSOLUTE_GAP,
        "mip_feasibility_tolerance": FEASIBILITY_TOLERANCE,
        "primal_feasibility_tolerance": FEASIBILITY_TOLERANCE,
    }


def _solve_whole(
    model: ExactModel, seeds: Sequence[Schedule], best_seed: Schedule, *, time_limit_s: float, bound_s: float
) -> _Solved:
    """One MIP over every order, sequence and size, started from every seed that fits
    (``bound_s`` is unused: HiGHS' own dual bound is reported)."""
    solver = new_solver(model, {**mip_settings(), "time_limit": float(time_limit_s)})
    for seed in sorted(seeds, key=lambda s: -s.makespan_s):
        values = model.values_of(seed)
        if values is not None:
            solver.setSolution(model.num_cols, np.arange(model.num_cols, dtype=np.int32), values)
    solver.run()
    status = solver.getModelStatus()
    info = solver.getInfo()
    found = int(info.primal_solution_status) != 0
    return _Solved(
        values=solver_values(solver) if found else None,
        proven=status == highspy.HighsModelStatus.kOptimal,
        status=solver.modelStatusToString(status),
        gap=float(info.mip_gap),
        dual_bound=float(info.mip_dual_bound),
        nodes=int(info.mip_node_count),
    )


def _solve_by_first_dims(
    model: ExactModel, best_seed: Schedule, *, time_limit_s: float, bound_s: float, jobs: int
) -> _Solved:
    """One MIP per multiset of first dims, each cut off at the best makespan so far (the
    seeds only set that cutoff: a start above it would be no use to a MIP)."""
    split = solve_by_first_dims(
        model,
        mip_settings(),
        incumbent=best_seed.makespan_s / model.time_unit_s,
        incumbent_first_dims=[c.dims_order()[0] for c in best_seed.chunks],
        floor=bound_s / model.time_unit_s,
        relative_gap=MIP_RELATIVE_GAP,
        time_limit_s=time_limit_s,
        jobs=jobs,
    )
    status = "Optimal" if split.proven else "Time limit reached"
    return _Solved(
        values=split.values,
        proven=split.proven,
        status=status,
        gap=(split.makespan - split.dual_bound) / split.makespan,
        dual_bound=split.dual_bound,
        nodes=split.nodes,
        extra={"first_dim_multisets": split.subproblems, "first_dim_multisets_settled": split.settled},
    )


def _seed_schedules(
    topology: Topology, message_bytes: int, num_chunks: int, collective: Collective, seeds: Sequence[str]
) -> list[Schedule]:
    """The seed planners' schedules with 1..K chunks, labelled ``planner@K``.

    Fewer chunks count too: the MIP allows up to K, and on a latency-heavy network a
    seed's K-1-chunk plan can beat its K-chunk one (``pipelined`` on libra-4d at 256 MiB:
    1.824 ms with 4 chunks, 1.898 ms with 5). A planner of :data:`AT_MOST_SEEDS` is asked
    for K alone up to its bound, and above it for every count past the bound. Seeds that refuse the instance are skipped.
    """
    from hipipe.planners import plan

    found = []
    for name in seeds:
        bound = AT_MOST_SEEDS.get(name)
        first = 1 if bound is None else num_chunks if num_chunks <= bound else bound + 1
        for count in range(first, num_chunks + 1):
            try:
                schedule = plan(topology, message_bytes, name, num_chunks=count, collective=collective)
            except HipipeError:
                break
            found.append(replace(schedule, planner=f"{name}@{count}"))
    fitting = [s for s in found if s.num_chunks <= num_chunks]
    if not fitting:
        raise HipipeError(
            f"no seed planner ({', '.join(seeds)}) made a schedule for the exact planner to improve"
        )
    return fitting


def _as_exact(seed: Schedule) -> Schedule:
    """A seed's chunks and sequences, re-timed and labelled as the exact planner's answer."""
    return simulate_chunks(
        seed.topology,
        seed.message_bytes,
        seed.chunks,
        policy=Policy.FIXED,
        sequences=seed.sequences,
        planner="exact",
        collective=seed.collective,
    )


def schedule_from_values(model: ExactModel, values: np.ndarray) -> Schedule:
    """Re-time the MIP's orders, sizes and per-dim sequences with the simulator."""
    orders, sizes, sequences = model.decode(values)
    chunks = [
        Chunk(index=j, size_bytes=sizes[j], order=tuple((k,) for k in order))
        for j, order in enumerate(orders)
    ]
    return simulate_chunks(
        model.topology,
        model.message_bytes,
        chunks,
        policy=Policy.FIXED,
        sequences=model.op_sequences(orders, sequences),
        planner="exact",
        collective=model.collective,
    )


def _finite_or_none(value: float) -> float | None:
    """JSON has no infinity: a gap or bound HiGHS never established is ``None``."""
    return value if math.isfinite(value) else None
