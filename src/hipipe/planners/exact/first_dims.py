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

Refining a multiset that will not settle: with ``refine_after_s``, a MIP still open after
that long is split again by the next dim of every chunk's order (the chunks sharing a
prefix take a sorted multiset of the dims they have not visited, by the same symmetry
argument), down to fully fixed orders, which get whatever time is left. On libra-4d at
256 MiB (AllReduce, K = 5, nothing below 1.5314 ms) the multiset (0, 0, 0, 0, 1) stayed
open after 600 s; its 45 second-dim MIPs settled 33 within 30 s each (size symmetry), and the two
fixed-order MIPs tried under the rest settled in 4-8 s with the model's ``sequence``
symmetry. It is no cure-all: that whole proof settled 259 of 370 regions in an hour, and on
8 chunks a single fixed-order MIP can take the rest of the limit (``refine_after_s`` does
not bound the leaves, whose answer decides the proof).
"""

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np

from hipipe.planners.exact.model import ExactModel, Order, hold_order_prefixes, new_solver, solver_values


@dataclass(frozen=True, kw_only=True, slots=True)
class SplitSolve:
    """What the split MIPs proved, in the model's time units."""

    values: np.ndarray | None
    """The best solution found below the incumbent's makespan; None if none was."""
    makespan: float
    """Its makespan, or the incumbent's when nothing better was found."""
    dual_bound: float
    """A lower bound on every schedule with at most K chunks."""
    proven: bool
    """Every region was pruned, solved to optimality, or refined into regions that were."""
    nodes: int
    subproblems: int
    """Regions (first-dim multisets and, with refinement, longer order prefixes) created."""
    settled: int
    """Regions whose MIP was pruned or solved (the others hit their time limit, were
    refined, or were never reached)."""
    refined: int = 0
    """Regions split by the next dim of the orders after their MIP stayed open."""


def first_dim_multisets(num_dims: int, num_chunks: int, first: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """Every sorted multiset of ``num_chunks`` first dims, the one ``first`` (the
    incumbent's first dims) fits put first so that its region is searched first."""
    multisets = list(itertools.combinations_with_replacement(range(num_dims), num_chunks))
    if first:
        padded = tuple(sorted(first)) + (num_dims - 1,) * (num_chunks - len(first))
        multisets.sort(key=lambda m: m != padded)
    return multisets


def refinements(prefixes: Sequence[Order], num_dims: int) -> list[tuple[Order, ...]]:
    """Every way to extend each chunk's order prefix (sorted) by one more dim.

    Chunks sharing a prefix take a sorted multiset of the dims it has not visited, so the
    prefixes stay sorted as the model's symmetry rows keep used chunks' orders, and unused
    chunks (free orders, last) fit the largest extension: no schedule is lost.
    """
    groups: list[tuple[Order, int]] = [
        (tuple(prefix), len(list(run))) for prefix, run in itertools.groupby(prefixes)
    ]
    per_group = [
        [
            [(*prefix, dim) for dim in dims]
            for dims in itertools.combinations_with_replacement(
                [d for d in range(num_dims) if d not in prefix], count
            )
        ]
        for prefix, count in groups
    ]
    return [tuple(p for part in parts for p in part) for parts in itertools.product(*per_group)]


@dataclass(kw_only=True, slots=True)
class _Search:
    """The running totals of one split solve (local to a call)."""

    best: float
    best_values: np.ndarray | None = None
    open_bounds: list[float] = field(default_factory=list)
    nodes: int = 0
    subproblems: int = 0
    settled: int = 0
    refined: int = 0


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
    refine_after_s: float | None = None,
) -> SplitSolve:
    """Solve the model one first-dim multiset at a time within ``time_limit_s`` in all.

    ``incumbent`` is the best known makespan (time units); each MIP only looks for a
    schedule below it by more than ``relative_gap``. ``floor`` (time units) is a lower
    bound valid for every schedule, used for the regions the time limit leaves unsolved.
    ``stop_when_found``: return as soon as one schedule below the incumbent is found (a
    floor proof is then disproved; the regions left count as open). ``refine_after_s``:
    give a region's MIP this long, then split it by the next dim of the orders (None:
    every multiset runs until the overall limit).
    """
    deadline_s = time.perf_counter() + time_limit_s
    num_dims = model.topology.num_dims
    search = _Search(best=incumbent)

    def visit(prefixes: Sequence[Order], parent_bound: float) -> None:
        search.subproblems += 1
        remaining_s = deadline_s - time.perf_counter()
        if remaining_s <= 0 or (stop_when_found and search.best_values is not None):
            search.open_bounds.append(parent_bound)
            return
        leaf = refine_after_s is None or len(prefixes[0]) >= num_dims - 1
        limit_s = remaining_s if leaf or refine_after_s is None else min(remaining_s, refine_after_s)
        cutoff = search.best * (1.0 - relative_gap)
        solver = new_solver(model, {**settings, "time_limit": limit_s, "objective_bound": cutoff})
        hold_order_prefixes(solver, model, prefixes)
        solver.run()
        status = solver.getModelStatus()
        info = solver.getInfo()
        search.nodes += int(info.mip_node_count)
        if int(info.primal_solution_status) != 0:
            values = solver_values(solver)
            if float(values[model.makespan_col]) < cutoff:
                search.best, search.best_values = float(values[model.makespan_col]), values
        if status in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible):
            search.settled += 1
            return
        bound = max(parent_bound, float(info.mip_dual_bound))
        if leaf or (stop_when_found and search.best_values is not None):
            search.open_bounds.append(bound)
            return
        search.refined += 1
        for child in refinements(prefixes, num_dims):
            visit(child, bound)

    for multiset in first_dim_multisets(num_dims, model.num_chunks, incumbent_first_dims):
        visit([(dim,) for dim in multiset], floor)
    return SplitSolve(
        values=search.best_values,
        makespan=search.best,
        dual_bound=min([search.best * (1.0 - relative_gap), *search.open_bounds]),
        proven=search.settled + search.refined == search.subproblems,
        nodes=search.nodes,
        subproblems=search.subproblems,
        settled=search.settled,
        refined=search.refined,
    )
