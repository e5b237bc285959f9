"""Proving a floor: no schedule with at most K chunks is faster than a given time.

Why a second question for the same MIP: closing the exact planner's gap needs the optimum
*and* a dual bound that meets it, and past four chunks on 3-4 dims the dual bound stalls
far below (libra-4d at 256 MiB, AllReduce, K = 5: a 30% gap after 300 s). A floor asks
less: "is there a schedule below X?". Every MIP runs with X as its cutoff (HiGHS'
``objective_bound``) and X as the time unit, so ``T <= 1`` excludes the slower schedules
from the start and a node whose relaxation reaches X is pruned. Below the optimum the
answer is "no" and the MIPs often end at the root. Measured on the 2-core host
(AllReduce, first-dims split): rfs-3d at 256 MiB, no schedule with at most 5 chunks below
1.7848 ms, all 21 multisets settled in 6.8 s (the full K = 5 solve: 13% gap after 318 s);
libra-4d at 256 MiB, at most 5 chunks below 1.5315 ms, proven in 3855 s with two worker
processes (``jobs=2``), 862 regions after splitting.

The proof's MIPs tell chunks sharing an order apart by when they run (the model's
``sequence`` symmetry), and a first-dim MIP still open after :data:`REFINE_AFTER_S` is split
by the next dim of the orders (:func:`~hipipe.planners.exact.first_dims.refinements`).

With :func:`hipipe.bounds.pipeline_bound_s` counting ``K + 1`` chunks, a proven floor at
most K bounds every schedule: it has at most K chunks (at least X) or more (at least that
``T_pipe``).
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import highspy

from hipipe.errors import HipipeError
from hipipe.planners.exact.first_dims import SplitProgress, solve_by_first_dims
from hipipe.planners.exact.journal import REGION_CONVENTION, ProofJournal
from hipipe.planners.exact.model import ExactModel, new_solver, solver_values
from hipipe.planners.exact.planner import (
    DEFAULT_TIME_LIMIT_S,
    MIP_RELATIVE_GAP,
    SPLIT_FROM_CHUNKS,
    mip_settings,
    schedule_from_values,
    validate_instance,
)
from hipipe.schedule import Collective
from hipipe.topology import Topology

MAX_FLOOR_CHUNKS = 8
"""A floor asks less than an optimum, so it reaches a few more chunks than
:data:`~hipipe.planners.exact.planner.MAX_CHUNKS`; beyond 8 the sequencing binaries
(``K (2K - 1)`` pairs per dim for AllReduce) make even the root relaxations slow."""

REFINE_AFTER_S = 30.0
"""How long a first-dim (or longer-prefix) MIP of a floor proof runs before it is split by
the next dim of the orders; fully fixed orders run until the overall limit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FloorProof:
    """The answer to "is any schedule with at most ``max_chunks`` chunks faster than ``floor_s``?"."""

    floor_s: float
    """The time asked about."""
    max_chunks: int
    proven: bool
    """No schedule with at most ``max_chunks`` chunks is faster than ``floor_s`` (to HiGHS'
    relative gap, :data:`MIP_RELATIVE_GAP`): every MIP was pruned or found infeasible."""
    faster_s: float | None
    """A schedule the MIPs found below ``floor_s``, re-timed by the simulator (the floor is
    then disproved), or None."""
    method: str
    """``whole`` (one MIP) or ``first-dims`` (one per multiset of the chunks' first dims,
    refined by longer order prefixes where one stays open)."""
    subproblems: int
    settled: int
    refined: int
    """Subproblems split into longer order prefixes (``first-dims`` only)."""
    timed_out: int
    """Subproblems whose MIP reached its time limit unsettled and was not split (the
    rest of the unsettled ones were never reached)."""
    nodes: int
    solve_s: float
    resumed: int = 0
    """Regions answered from the journal of an earlier run, not solved again (counted in
    ``settled`` or ``refined``)."""

    @property
    def proven_floor_s(self) -> float | None:
        """``floor_s`` less the MIP's relative gap when proven: the floor this answer
        guarantees for every schedule with at most ``max_chunks`` chunks."""
        return self.floor_s * (1 - MIP_RELATIVE_GAP) if self.proven else None


def prove_floor(
    topology: Topology,
    message_bytes: int,
    floor_s: float,
    *,
    max_chunks: int,
    collective: Collective | str = Collective.ALL_REDUCE,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    method: str = "auto",
    refine_after_s: float | None = REFINE_AFTER_S,
    leaf_time_limit_s: float | None = None,
    jobs: int = 1,
    journal_path: str | Path | None = None,
    progress: Callable[[SplitProgress], None] | None = None,
) -> FloorProof:
    """Prove, within ``time_limit_s``, that no hierarchical schedule with at most
    ``max_chunks`` chunks (single-dim ops, one op per dim at a time) finishes before
    ``floor_s``; or find one that does. ``method`` as for the exact planner (``auto``:
    first-dims from five chunks on 3-4 dims); ``refine_after_s``: how long a first-dims
    subproblem runs before it is split further (None: never split); ``leaf_time_limit_s``:
    the most one fixed-order subproblem gets (None: the rest of the limit), so that one
    hard leaf cannot hold the whole limit and the report shows how many stay open;
    ``jobs``: first-dims subproblems solved at once, one process each (answers do not
    depend on it; the whole method is one MIP and runs alone); ``journal_path``: a file
    that keeps every region this proof answers and that a later call with the same
    instance resumes from (:mod:`~hipipe.planners.exact.journal`; None: keep nothing);
    ``progress``: called after every region of a first-dims proof (the whole method is one
    MIP and reports nothing until it ends)."""
    collective = Collective.parse(collective)
    validate_instance(
        topology,
        message_bytes,
        max_chunks,
        time_limit_s,
        method,
        max_chunks_allowed=MAX_FLOOR_CHUNKS,
        jobs=jobs,
    )
    if not (floor_s > 0 and math.isfinite(floor_s)):
        raise HipipeError(f"the floor to prove must be a positive number of seconds, got {floor_s!r}")
    for name, value in (("refine_after_s", refine_after_s), ("leaf_time_limit_s", leaf_time_limit_s)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise HipipeError(f"{name} must be a positive number of seconds or None, got {value!r}")
    started = time.perf_counter()
    journal = None
    if journal_path is not None:
        journal = ProofJournal(journal_path, floor_instance(topology, message_bytes, max_chunks, collective))
    model = ExactModel(
        topology, message_bytes, max_chunks, collective, time_unit_s=floor_s, symmetry="sequence"
    )
    if method == "auto":
        method = "first-dims" if max_chunks >= SPLIT_FROM_CHUNKS and topology.num_dims >= 3 else "whole"
    # One schedule below the floor disproves it: each MIP stops at the first one it finds.
    settings = {**mip_settings(), "mip_max_improving_sols": 1}
    answered = journal is not None and journal.outcome((), floor_s) == "settled"
    if answered:
        # An earlier run proved the whole question (the region of no prefixes).
        values, settled, subproblems, nodes, refined, timed_out, proven = None, 1, 1, 0, 0, 0, True
        resumed = 1
    elif method == "first-dims":
        split = solve_by_first_dims(
            model,
            settings,
            incumbent=1.0,
            incumbent_first_dims=(),
            floor=0.0,
            relative_gap=0.0,
            time_limit_s=time_limit_s,
            stop_when_found=True,
            refine_after_s=refine_after_s,
            leaf_time_limit_s=leaf_time_limit_s,
            jobs=jobs,
            journal=journal,
            progress=progress,
        )
        resumed = split.resumed
        values, subproblems, settled, nodes = split.values, split.subproblems, split.settled, split.nodes
        refined, timed_out = split.refined, split.timed_out
        proven = split.proven and values is None
    else:
        resumed = 0
        solver = new_solver(model, {**settings, "time_limit": float(time_limit_s), "objective_bound": 1.0})
        solver.run()
        status = solver.getModelStatus()
        info = solver.getInfo()
        found = int(info.primal_solution_status) != 0
        values = solver_values(solver) if found else None
        if values is not None and float(values[model.makespan_col]) >= 1.0:
            values = None  # a schedule at the floor itself does not disprove it
        settled = int(status in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible))
        subproblems, nodes, refined = 1, int(info.mip_node_count), 0
        timed_out = int(not settled and values is None)
        proven = bool(settled) and values is None
    if journal is not None and proven and not answered:
        journal.record((), "settled", floor_s)  # the whole question, whichever way it was proven
    faster_s = None if values is None else schedule_from_values(model, values).makespan_s
    return FloorProof(
        floor_s=floor_s,
        max_chunks=max_chunks,
        proven=proven,
        faster_s=faster_s,
        method=method,
        subproblems=subproblems,
        settled=settled,
        refined=refined,
        timed_out=timed_out,
        nodes=nodes,
        solve_s=time.perf_counter() - started,
        resumed=resumed,
    )


def floor_instance(
    topology: Topology, message_bytes: int, max_chunks: int, collective: Collective
) -> dict[str, Any]:
    """What a floor proof asks about but the floor, as its journal records it: a journal
    answers only the same instance (the topology in full, so a changed rate or latency is
    another instance); its lines say which floor each region was settled at."""
    return {
        "topology_name": topology.name,
        "topology": repr(topology),
        "message_bytes": int(message_bytes),
        "collective": collective.value,
        "max_chunks": int(max_chunks),
        "region_convention": REGION_CONVENTION,
    }
