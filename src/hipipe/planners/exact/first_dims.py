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
symmetry. That whole proof settled 259 of 370 regions in an hour on one process; with two
regions solved at once (``jobs``, :mod:`~hipipe.planners.exact.regions`) it was proven in
3855 s (862 regions). On 8 chunks a single fixed-order MIP can take the rest of the limit:
``refine_after_s`` does not bound the leaves, whose answer decides the proof, but
``leaf_time_limit_s`` can, so that the search goes on and counts the leaves left open.
"""

import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hipipe.planners.exact.journal import ProofJournal
from hipipe.planners.exact.model import ExactModel, Order
from hipipe.planners.exact.regions import RegionRunner


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
    timed_out: int = 0
    """Regions whose MIP reached its time limit and were not split (the others left
    open were never reached before the overall limit or the first schedule found)."""
    resumed: int = 0
    """Regions answered from the journal of an earlier run (counted in ``settled`` or
    ``refined`` as it answered them) rather than solved again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SplitProgress:
    """How far a split search has come, after each region it answers: what a long proof
    shows its user (the libra-4d proofs run for an hour and more)."""

    answered: int
    """Regions answered so far: settled, split, at their time limit, or from the journal."""
    settled: int
    refined: int
    timed_out: int
    resumed: int
    multisets_searched: int
    """First-dim multisets none of whose regions is left to try."""
    multisets: int
    elapsed_s: float


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


@dataclass(frozen=True, kw_only=True, slots=True)
class _Region:
    """One region of the search: chunk j's order begins with ``prefixes[j]``."""

    prefixes: tuple[Order, ...]
    parent_bound: float
    """The dual bound the region inherits (its parent's, or the caller's floor)."""

    @property
    def roots(self) -> tuple[int, ...]:
        """The first-dim multiset the region belongs to."""
        return tuple(prefix[0] for prefix in self.prefixes)


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
    leaf_time_limit_s: float | None = None,
    jobs: int = 1,
    journal: ProofJournal | None = None,
    progress: Callable[[SplitProgress], None] | None = None,
) -> SplitSolve:
    """Solve the model one first-dim multiset at a time within ``time_limit_s`` in all.

    ``incumbent`` is the best known makespan (time units); each MIP only looks for a
    schedule below it by more than ``relative_gap``. ``floor`` (time units) is a lower
    bound valid for every schedule, used for the regions the time limit leaves unsolved.
    ``stop_when_found``: return as soon as one schedule below the incumbent is found (a
    floor proof is then disproved; the regions left count as open). ``refine_after_s``:
    give a region's MIP this long, then split it by the next dim of the orders (None:
    every multiset runs until the overall limit). ``leaf_time_limit_s``: the most a region
    that is not split further gets (None: whatever is left of the overall limit; a leaf
    left open leaves the search unproven either way, but a budget lets the search go on to
    the other regions). ``jobs``: regions solved at once, each in its own process (the
    regions are independent; a cutoff improved by one reaches the MIPs started after it).
    ``journal``: read the regions an earlier run answered from it, and write each answer
    given here to it (a leaf left open at its limit too, which a run giving it no longer
    a limit then counts open without solving it again); only for a fixed cutoff
    (``stop_when_found``, no relative gap: a floor proof), since a region pruned below one
    cutoff says nothing about a higher one.
    ``progress``: called with a :class:`SplitProgress` after every region answered.
    """
    if journal is not None and not (stop_when_found and relative_gap == 0):
        raise ValueError("a proof journal needs a fixed cutoff: stop_when_found and no relative gap")
    cutoff_s = incumbent * model.time_unit_s  # the floor every region is asked about
    started_s = time.perf_counter()
    deadline_s = started_s + time_limit_s
    num_dims = model.topology.num_dims
    best = incumbent
    best_values: np.ndarray | None = None
    open_bounds: list[float] = []
    nodes = subproblems = settled = refined = timed_out = resumed = 0
    # Depth first: a split region's children are searched before the regions after it.
    pending = [
        _Region(prefixes=tuple((dim,) for dim in multiset), parent_bound=floor)
        for multiset in reversed(first_dim_multisets(num_dims, model.num_chunks, incumbent_first_dims))
    ]
    left = Counter(region.roots for region in pending)
    """Regions still to try, by first-dim multiset."""

    def answered(region: _Region, children: Sequence[_Region] = ()) -> None:
        pending.extend(children)
        left[region.roots] += len(children) - 1
        if progress is not None:
            progress(
                SplitProgress(
                    answered=settled + refined + timed_out,
                    settled=settled,
                    refined=refined,
                    timed_out=timed_out,
                    resumed=resumed,
                    multisets_searched=sum(1 for count in left.values() if count == 0),
                    multisets=len(left),
                    elapsed_s=time.perf_counter() - started_s,
                )
            )

    def is_leaf(region: _Region) -> bool:
        return refine_after_s is None or len(region.prefixes[0]) >= num_dims - 1

    in_flight: list[_Region] = []
    limits_s: dict[tuple[Order, ...], float] = {}
    """The time limit each region was given."""
    with RegionRunner[_Region](jobs) as runner:
        while pending or in_flight:
            while pending and len(in_flight) < jobs:
                region = pending.pop()
                subproblems += 1
                earlier = None if journal is None else journal.outcome(region.prefixes, cutoff_s)
                if earlier is not None:
                    resumed += 1
                    if earlier == "settled":
                        settled += 1
                        answered(region)
                    else:
                        refined += 1
                        answered(region, _children(region, region.parent_bound, num_dims))
                    continue
                remaining_s = deadline_s - time.perf_counter()
                if remaining_s <= 0:
                    open_bounds.append(region.parent_bound)
                    continue
                budget_s = leaf_time_limit_s if is_leaf(region) else refine_after_s
                limit_s = remaining_s if budget_s is None else min(remaining_s, budget_s)
                left_open_s = (
                    journal.open_bound_s(region.prefixes, cutoff_s, limit_s)
                    if journal is not None and is_leaf(region)
                    else None
                )
                if left_open_s is not None:
                    # An earlier run gave this leaf as long or longer at this floor or a
                    # lower one and it stayed open: it would again.
                    resumed += 1
                    timed_out += 1
                    open_bounds.append(max(region.parent_bound, left_open_s / model.time_unit_s))
                    answered(region)
                    continue
                cutoff = best * (1.0 - relative_gap)
                runner.submit(region, (model, settings, region.prefixes, limit_s, cutoff))
                in_flight.append(region)
                limits_s[region.prefixes] = limit_s
            if not in_flight:
                continue
            region, result = runner.next_result()
            in_flight.remove(region)
            nodes += result.nodes
            if result.values is not None and float(result.values[model.makespan_col]) < best:
                best, best_values = float(result.values[model.makespan_col]), result.values
            if result.settled:
                settled += 1
                if journal is not None and result.values is None:
                    journal.record(region.prefixes, "settled", cutoff_s)
                answered(region)
            elif stop_when_found and best_values is not None:
                open_bounds.append(max(region.parent_bound, result.dual_bound))
            elif is_leaf(region):
                timed_out += 1
                bound = max(region.parent_bound, result.dual_bound)
                open_bounds.append(bound)
                if journal is not None:
                    journal.record_open(
                        region.prefixes, cutoff_s, limits_s[region.prefixes], bound * model.time_unit_s
                    )
                answered(region)
            else:
                refined += 1
                if journal is not None:
                    journal.record(region.prefixes, "refined", cutoff_s)
                answered(region, _children(region, max(region.parent_bound, result.dual_bound), num_dims))
            if stop_when_found and best_values is not None:
                break  # leaving the runner stops the MIPs still running
    # Regions not solved: never started, or stopped early by a schedule found elsewhere.
    subproblems += len(pending)
    open_bounds.extend(region.parent_bound for region in (*pending, *in_flight))
    return SplitSolve(
        values=best_values,
        makespan=best,
        dual_bound=min([best * (1.0 - relative_gap), *open_bounds]),
        proven=settled + refined == subproblems,
        nodes=nodes,
        subproblems=subproblems,
        settled=settled,
        refined=refined,
        timed_out=timed_out,
        resumed=resumed,
    )


def _children(region: _Region, bound: float, num_dims: int) -> list[_Region]:
    """``region`` split by the next dim of the orders, to be pushed on the depth-first
    stack (so the first refinement is searched first)."""
    return [
        _Region(prefixes=child, parent_bound=bound)
        for child in reversed(refinements(region.prefixes, num_dims))
    ]
