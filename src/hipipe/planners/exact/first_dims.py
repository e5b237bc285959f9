"""The exact MIP split by the chunks' first dims: one smaller MIP per multiset of them.

Why: beyond four chunks on three or four dims the whole MIP's dual bound stalls at the
pipeline bound and branch-and-bound does not move it. On libra-4d at 256 MiB
(ReduceScatter, K = 5) it stopped at a 24.6% gap after 48 s. Fixing which dim every
chunk starts on removes most of the order binaries (6 of 24 orders left per chunk on 4
dims) and, with them, the weak part of the relaxation: the 56 first-dim MIPs of that
instance, each cut off at hipipe's makespan, were all pruned (most at the root, the
slowest after 18 s; 80 s in all), which proves hipipe's 5-chunk plan optimal.

Why the split loses nothing: the model lists used chunks first and in order-index
order (:meth:`ExactModel._symmetry_rows`), and orders are permutations in lexicographic
order, so the used chunks' first dims never decrease. A schedule with m <= K chunks
therefore fits the multiset of its first dims padded with K - m copies of the last dim
(unused chunks' orders are free). Every multiset is solved with the best makespan so far
as its cutoff (HiGHS' ``objective_bound``), so a pruned multiset costs little and an
improving one tightens the rest.
"""

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from hipipe.planners.exact.model import ExactModel, hold_first_dims, new_solver, solver_values


@dataclass(frozen=True, kw_only=True, slots=True)
class SplitSolve:
    """What the first-dim MIPs proved, in the model's time units."""

    values: np.ndarray | None
    """The best solution found below the incumbent's makespan; None if none was."""
    makespan: float
    """Its makespan, or the incumbent's when nothing better was found."""
    dual_bound: float
    """A lower bound on every schedule with at most K chunks."""
    proven: bool
    """Every multiset was pruned or solved to optimality."""
    nodes: int
    subproblems: int
    settled: int
    """Multisets pruned or solved (the others hit the time limit or were never reached)."""


def first_dim_multisets(num_dims: int, num_chunks: int, first: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """Every sorted multiset of ``num_chunks`` first dims, the one ``first`` (the
    incumbent's first dims) fits put first so that its region is searched first."""
    multisets = list(itertools.combinations_with_replacement(range(num_dims), num_chunks))
    if first:
        padded = tuple(sorted(first)) + (num_dims - 1,) * (num_chunks - len(first))
        multisets.sort(key=lambda m: m != padded)
    return multisets


def solve_by_first_dims(
    model: ExactModel,
    settings: Mapping[str, Any],
    *,
    incumbent: float,
    incumbent_first_dims: Sequence[int],
    floor: float,
    relative_gap: float,
    time_limit_s: float,
    stop_when_found: bool = False,
) -> SplitSolve:
    """Solve the model one first-dim multiset at a time within ``time_limit_s`` in all.

    ``incumbent`` is the best known makespan (time units); each multiset's MIP only looks
    for a schedule below it by more than ``relative_gap``. ``floor`` (time units) is a
    lower bound valid for every schedule, used for the multisets the time limit leaves
    unsolved. ``stop_when_found``: return as soon as one schedule below the incumbent is
    found (a floor proof is then disproved; the multisets left count as open).
    """
    deadline_s = time.perf_counter() + time_limit_s
    multisets = first_dim_multisets(model.topology.num_dims, model.num_chunks, incumbent_first_dims)
    best, best_values = incumbent, None
    open_bounds: list[float] = []
    nodes = settled = 0
    for multiset in multisets:
        remaining_s = deadline_s - time.perf_counter()
        if remaining_s <= 0 or (stop_when_found and best_values is not None):
            open_bounds.append(floor)
            continue
        solver = new_solver(
            model, {**settings, "time_limit": remaining_s, "objective_bound": best * (1.0 - relative_gap)}
        )
        hold_first_dims(solver, model, multiset)
        solver.run()
        status = solver.getModelStatus()
        info = solver.getInfo()
        nodes += int(info.mip_node_count)
        if int(info.primal_solution_status) != 0:
            values = solver_values(solver)
            if float(values[model.makespan_col]) < best * (1.0 - relative_gap):
                best, best_values = float(values[model.makespan_col]), values
        if status in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible):
            settled += 1
        else:
            open_bounds.append(max(floor, float(info.mip_dual_bound)))
    return SplitSolve(
        values=best_values,
        makespan=best,
        dual_bound=min([best * (1.0 - relative_gap), *open_bounds]),
        proven=settled == len(multisets),
        nodes=nodes,
        subproblems=len(multisets),
        settled=settled,
    )
