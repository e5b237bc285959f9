"""The chunk-number search (the cost model and bounds: docs/MODEL.md).

For each K on a geometric ladder, every order family (:mod:`.families`) is turned into
its best candidate (:mod:`.candidates`: list-scheduled sequences, LP sizes, re-sequencing
rounds, empty chunks dropped). The ladder stops when K stops improving, when the chunked
latency floor (:func:`hipipe.bounds.chunked_bound_s`) says no larger K can win, or when
the plan-time budget is spent. When its best has more than 4 chunks, a sweep builds every
K from 5 to 16 with every family and swaps the fastest (:func:`_sweep`); a K = 32 probe
then lets the LP pick which chunks to keep,
a few-chunk winner is polished by local search over its orders, binding sequence pairs are
swapped (warm LP re-solves) and per-dim sequences nested (:mod:`.local_search`). Every
K <= AT_MOST_MAX_CHUNKS is run in a log of its own, with the previous K's best plus a
filler chunk (:mod:`.filler`), and *settled* exactly as a forced K is (:func:`_settle`),
then *polished* (:func:`_polished`: every order multiset where few enough,
:mod:`.enumeration`, per-dim sequences re-solved by a small MIP, :mod:`.sequence_mip`, and
last every chunk's order below its first dim by the exact MIP, :mod:`.tail_mip`):
the search is never worse than those forced Ks. A forced K means "at most K chunks": up to
AT_MOST_MAX_CHUNKS every K' <= K settled and polished, above it the whole search confined to
K' <= K (:func:`_capped`). The best plan's chunks are then split while that
helps (:mod:`.splitting`: the ramp that Ks built from scratch cannot have), and a split
plan's binding pairs are swapped again; the polish comes after the splits, so that its LPs
do not eat into their budget. The best plan and the polished few-chunk plans near it then
get one chunk more in every order, built from scratch (:func:`_with_added_chunk`), and a
4-chunk one a chunk starting on each dim, sequenced by MIP (where none starts first:
:func:`.sequence_mip.add_sequenced_chunk`). A plan of 5 chunks (the first K past the
polish) then has its own orders re-sequenced by MIP (:func:`.sequence_mip.resequenced`).
Last, the baselines' own structures are re-sized where they would still win
(:mod:`.seeds`), so the result is never worse than a baseline. An AllReduce plan of 6 chunks
or more is then compared with the ReduceScatter search's plan followed by its mirror
(:mod:`.two_phase`), and the faster kept.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hipipe.bounds import OrderMix
from hipipe.errors import SolverError
from hipipe.planners.hipipe.candidates import (
    IMPROVEMENT,
    LADDER_SHARE,
    SPLIT_SHARE,
    Candidate,
    SearchLog,
    SearchOptions,
    SolvedMip,
    Trial,
    better,
    candidate_for,
    time_unit_s,
)
from hipipe.planners.hipipe.enumeration import KEPT as ENUMERATED_KEPT
from hipipe.planners.hipipe.enumeration import MAX_CHUNKS as ENUMERATED_MAX_CHUNKS
from hipipe.planners.hipipe.enumeration import enumerated_candidates
from hipipe.planners.hipipe.families import FEW_CHUNK_FAMILIES, families
from hipipe.planners.hipipe.filler import add_any_chunk, add_filler
from hipipe.planners.hipipe.local_search import NEAR_FLOOR, climb_orders, nested_descent, swap_critical_pairs
from hipipe.planners.hipipe.seeds import baseline_seeds, improve_with_seeds
from hipipe.planners.hipipe.sequence_mip import MAX_DIMS as POLISH_MAX_DIMS
from hipipe.planners.hipipe.sequence_mip import (
    add_sequenced_chunk,
    every_multiset,
    exhausts_multisets,
    extended_pairs,
    extends_pairs,
    polish_sequences,
    resequenced,
    reshape_orders,
    split_orders,
    substitute_orders,
)
from hipipe.planners.hipipe.splitting import refine_by_splitting
from hipipe.planners.hipipe.tail_mip import applies as tails_apply
from hipipe.planners.hipipe.tail_mip import free_tails
from hipipe.planners.hipipe.two_phase import MIN_CHUNKS as TWO_PHASE_MIN_CHUNKS
from hipipe.planners.hipipe.two_phase import two_phase_candidate
from hipipe.schedule import Collective
from hipipe.topology import Topology

FULL_ROUNDS_MAX_CHUNKS = 16
"""Above this K, no re-sequencing round: LPs grow with K, and on the reference grid the
rounds gained nothing there (the budget is better spent on the next K)."""

PROBE_CHUNKS: tuple[int, ...] = (32,)
"""Extra Ks tried after the ladder stops, when pipelining pays at all (see PROBE_MIN_CHUNKS)."""

PROBE_MIN_CHUNKS = 6
"""Probe only when the ladder's best K is at least this (a bandwidth-bound message)."""

FLOOR_SLACK = 0.001
"""Stop the ladder once the chunked latency floor of the next K is within this of the best
(relative): no larger K can gain more, and the LPs would cost plan time for nothing."""

MIN_GAIN = 0.002
"""Above FULL_ROUNDS_MAX_CHUNKS, stop the ladder once a K gains less than this (relative)."""

MAX_OPS = 512
"""Ks whose chunks would have more ops than this (K * chain length) are not tried: LP time grows
about quadratically with the ops, and so many chunks only pay off at zero latency,
where they gain well under 1%."""

RETIRE_MARGIN = 0.05
RETIRE_STRIKES = 2
"""An order family that trails the best of its K by 5% twice in a row is not tried at
larger K: its LPs are better spent on the families that work for this network."""


def _logged_candidate(
    topology: Topology,
    message_bytes: int,
    source: str,
    orders: tuple[tuple[int, ...], ...],
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """:func:`.candidates.candidate_for`, logged in ``log.tried`` under ``num_chunks`` (the
    K asked for); None when its LP failed: one structure's LP failing is no reason to fail
    the plan, so it is skipped and the error recorded."""
    try:
        candidate = candidate_for(
            topology, message_bytes, source, orders, options=options, unit_s=unit_s, log=log
        )
    except SolverError as error:
        log.tried.append(Trial(num_chunks=num_chunks, source=source, error=str(error)))
        return None
    log.tried.append(
        Trial(
            num_chunks=num_chunks,
            kept_chunks=candidate.structure.num_chunks,
            source=source,
            makespan_s=candidate.makespan_s,
        )
    )
    return candidate


def _best_for_chunks(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    pool: list[Candidate] | None = None,
    strikes: SearchLog | None = None,
    retire: bool = True,
) -> Candidate | None:
    """Best candidate over the order families for one K (logged in ``log.tried``); None if
    every LP failed. This K's results count towards retirement in ``strikes`` (default
    ``log``); families retired there are skipped unless ``retire`` is False."""
    strikes = log if strikes is None else strikes
    best_here: Candidate | None = None
    rounds = options.max_rounds if num_chunks <= FULL_ROUNDS_MAX_CHUNKS else 0
    results: dict[str, float] = {}
    # No schedule with this many chunks beats the chunked latency floor: once a family
    # reaches it with all its chunks, the others cannot do better with as many (switch-3d-512
    # and tpu-2d: the mix does at K = 3); plans with fewer chunks are the smaller Ks' business.
    floor_s = log.floor_s(topology, message_bytes, num_chunks, options.collective)
    for source, orders in families(
        topology,
        message_bytes,
        mix,
        num_chunks,
        ascending_only=options.ascending_only,
        collective=options.collective,
    ):
        if retire and source in strikes.retired:
            continue
        candidate = _logged_candidate(
            topology,
            message_bytes,
            source,
            orders,
            num_chunks,
            options=replace(options, max_rounds=rounds),
            unit_s=unit_s,
            log=log,
        )
        if candidate is None:
            continue
        results[source] = candidate.makespan_s
        if pool is not None:
            pool.append(candidate)
        if better(best_here, candidate):
            best_here = candidate
        if (
            best_here is not None
            and best_here.structure.num_chunks == num_chunks
            and best_here.makespan_s <= floor_s * (1 + IMPROVEMENT)
        ):
            break  # (a plan that dropped chunks is not held to this K's floor: fewer latencies)
    # The yardstick for retirement is the best of the families that go on to larger K: a
    # family tried at few chunks only (the rotations) must not retire the others (on libra-4d
    # at 1 GiB, ReduceScatter, it retired greedy at K = 4, the family that wins at K = 8).
    lasting = [m for source, m in results.items() if source not in FEW_CHUNK_FAMILIES]
    if lasting:
        yardstick_s = min(lasting)
        for source, makespan_s in results.items():
            behind = makespan_s > yardstick_s * (1 + RETIRE_MARGIN)
            strikes.strikes[source] = strikes.strikes.get(source, 0) + 1 if behind else 0
            if strikes.strikes[source] >= RETIRE_STRIKES and source != "mix":
                strikes.retired.add(source)
    return best_here


RUNNER_UP_MARGIN = 0.02
"""The runner-up is climbed too only when within this of the best (relative): further
behind, the climb has never closed the gap on the reference grid, and it costs plan time."""


def _runner_up(pool: list[Candidate], best: Candidate, margin: float = RUNNER_UP_MARGIN) -> list[Candidate]:
    """The fastest candidate of another structure than ``best``, if within ``margin`` (relative)."""
    others = [
        c
        for c in pool
        if c.structure.orders != best.structure.orders or c.structure.sequences != best.structure.sequences
    ]
    if not others:
        return []
    second = min(others, key=lambda c: c.makespan_s)
    return [second] if second.makespan_s <= best.makespan_s * (1 + margin) else []


def _requested_chunks(log: SearchLog, best: Candidate) -> int:
    """The K the ladder asked for when it found ``best`` (before empty chunks were dropped)."""
    for trial in log.tried:
        if trial.makespan_s == best.makespan_s and trial.kept_chunks is not None:
            return trial.num_chunks
    return best.structure.num_chunks


def _polish(
    step: Callable[..., Candidate],
    source: str,
    topology: Topology,
    message_bytes: int,
    best: Candidate,
    *,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``best`` after a local-search ``step`` (:func:`swap_critical_pairs`,
    :func:`nested_descent`), logged under ``source`` when it changed anything."""
    polished = step(topology, message_bytes, best, unit_s=unit_s, log=log)
    log.improved(best, polished, source)
    return polished


AT_MOST_MAX_CHUNKS = 4
"""Up to this K every K is *settled* the same way whether the user forced it or the search
came across it (:func:`_settle`): so the search is never worse than a forced K <= this, and a
forced K <= this is planned as every K' <= K settled and polished. Few-chunk plans are where
the local search moves a plan by percents and where it is cheap. A forced K above this is
the search itself confined to K' <= K (:func:`_capped`): either way a forced K means "at
most K chunks", as for the exact planner."""


def _capped(options: SearchOptions, limit: int) -> SearchOptions:
    """The search's options confined to at most ``limit`` chunks: its ladder's Ks below the
    limit, then the limit itself.

    A forced K above :data:`AT_MOST_MAX_CHUNKS` used to be planned with K chunks alone (every
    family at K, the forced 4's plans, a chunk added to those), which skipped the sweep and
    the added chunk that give the free search its plans: on libra-4d at 1 GiB forced K = 8
    came out at 5.2378 ms, against 4.7093 ms forced to 7 and 4.7048 ms (8 chunks) searched.
    """
    ladder = (*(k for k in options.chunk_counts if k < limit), limit)
    return replace(options, forced_chunks=None, chunk_counts=ladder, chunk_limit=limit)


TWO_CHUNK_RUNNER_UP_MARGIN = 0.04
"""At K <= 2 the runner-up is climbed when within this of the best: a climb there has only
2 D! neighbours, and on libra-4d at 1 GiB, K = 2, fastest-first (2.9% behind the rotated
orders) climbs to the proven optimum, 7.856 ms, where the rotations stay at 8.089 ms."""


@dataclass(kw_only=True, slots=True)
class _Step:
    """One K of the ladder run in a log of its own, so that what it finds does not depend on
    what the search spent before (a forced K and the search do the same work)."""

    num_chunks: int
    best: Candidate | None
    pool: list[Candidate]
    log: SearchLog
    filled: Candidate | None = None
    """The best of K - 1 (before its local search) plus a filler chunk (:mod:`.filler`);
    None at K = 1, at the floor of this K, or when the previous K was not run."""
    absorbed: tuple[int, int, int, int] = (0, 0, 0, 0)
    """How much of ``log`` (trials, LP solves, simplex iterations, LP work) the plan's log
    already holds."""


def _before(steps: list[_Step], num_chunks: int) -> Candidate | None:
    """The best of the step of ``num_chunks - 1`` if it is the last of ``steps``."""
    if steps and steps[-1].num_chunks == num_chunks - 1:
        return steps[-1].best
    return None


def _small_step(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    strikes: SearchLog | None,
    floors: dict[int, float],
    solved_mips: dict[tuple[object, ...], SolvedMip],
    previous: Candidate | None,
) -> _Step:
    """Every family at ``num_chunks`` (none retired) in a fresh log (sharing the plan's
    ``floors`` and ``solved_mips``); their results count towards retirement at larger K in
    ``strikes`` (the plan's log; None: nowhere). Then ``previous`` (the best of K - 1) plus
    a filler chunk, unless the families reach this K's floor.

    The proven optima at K = 4 are often a (K-1)-chunk pipeline with one small chunk that
    fills its start-up idle time, which neither the families nor the local search build.
    The filler's base is the previous K's best before its local search, which depends on
    that K's step alone: the search and a forced K add the same filler."""
    log = SearchLog(budget=options.lp_work_budget, floors=floors, solved_mips=solved_mips)
    log.allow(LADDER_SHARE)
    pool: list[Candidate] = []
    best = _best_for_chunks(
        topology,
        message_bytes,
        mix,
        num_chunks,
        options=options,
        unit_s=unit_s,
        log=log,
        pool=pool,
        strikes=strikes,
        retire=False,
    )
    filled: Candidate | None = None
    floor_s = log.floor_s(topology, message_bytes, num_chunks, options.collective)
    at_floor = best is not None and best.makespan_s <= floor_s * (1 + IMPROVEMENT)
    if previous is not None and options.climb and options.lp_sizes and not at_floor:
        filled = add_filler(topology, message_bytes, previous, unit_s=unit_s, log=log)
        if filled is not None:
            log.tried.append(
                Trial(
                    num_chunks=num_chunks,
                    kept_chunks=filled.structure.num_chunks,
                    source="filler",
                    makespan_s=filled.makespan_s,
                )
            )
    return _Step(num_chunks=num_chunks, best=best, pool=pool, log=log, filled=filled)


def _finish(
    topology: Topology,
    message_bytes: int,
    contenders: list[Candidate],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """The best of ``contenders`` after the local search: orders climbed, binding pairs
    swapped, per-dim sequences nested (:mod:`.local_search`).

    Before the local search the two best structures are often close, and climbing and
    polishing move each by a few percent: on libra-4d at 64 MiB, K = 3 led K = 2 by 0.7%
    but K = 2 climbs to 0.790 ms against K = 3's 0.805 ms. So each contender is searched.
    """
    finished = []
    for contender in contenders:
        climbed = climb_orders(topology, message_bytes, contender, options=options, unit_s=unit_s, log=log)
        polished = _polish(
            swap_critical_pairs, "swap", topology, message_bytes, climbed, unit_s=unit_s, log=log
        )
        finished.append(
            _polish(nested_descent, "nest", topology, message_bytes, polished, unit_s=unit_s, log=log)
        )
    return min(finished, key=lambda c: c.makespan_s)


def _settle(
    topology: Topology, message_bytes: int, step: _Step, *, options: SearchOptions, unit_s: float
) -> tuple[Candidate | None, dict[str, float]]:
    """What a forced K = ``step.num_chunks`` plans from this K alone: its best and runner-up
    through the local search, its filler plan, then the baselines' structures with this K
    (in the step's log)."""
    best = step.best
    if best is not None and options.climb:
        margin = TWO_CHUNK_RUNNER_UP_MARGIN if step.num_chunks <= 2 else RUNNER_UP_MARGIN
        contenders = [best, *_runner_up(step.pool, best, margin)]
        best = _finish(topology, message_bytes, contenders, options=options, unit_s=unit_s, log=step.log)
    if step.filled is not None and better(best, step.filled):
        best = step.filled
    baselines: dict[str, float] = {}
    if options.baseline_seeds:
        best, baselines = improve_with_seeds(
            topology, message_bytes, best, step.num_chunks, options=options, unit_s=unit_s, log=step.log
        )
    return best, baselines


def _absorb(log: SearchLog, step: _Step, *, work: bool = True) -> None:
    """Add what the step's log recorded since the last call to the plan's log: its trials,
    and (with ``work``) its LP solves, iterations and work."""
    own = step.log
    trials, solves, iterations, spent = step.absorbed
    log.tried.extend(own.tried[trials:])
    if work:
        log.lp_solves += own.lp_solves - solves
        log.simplex_iterations += own.simplex_iterations - iterations
        log.lp_work += own.lp_work - spent
        solves, iterations, spent = own.lp_solves, own.simplex_iterations, own.lp_work
    step.absorbed = (len(own.tried), solves, iterations, spent)


def _fastest(candidates: list[Candidate | None]) -> Candidate | None:
    """The fastest candidate (the first of equals); None if there is none."""
    best: Candidate | None = None
    for candidate in candidates:
        if candidate is not None and better(best, candidate):
            best = candidate
    return best


def _polished_in_turn(
    topology: Topology,
    message_bytes: int,
    settled: Sequence[tuple[Candidate | None, int]],
    *,
    lead_s: float = math.inf,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[Candidate | None]:
    """Each settled (plan, K), by increasing K, after :func:`_polished` with the polished plan
    of K - 1 as its ``fewer``; a plan more than ``lead_s`` behind is left out (None) unless the
    next K is in and takes it as ``fewer``.

    ``fewer`` is polished (on a held-out 3-dim network, seed 31 #3, the AllReduce optimum at
    K = 4 splits an order of the polished 3-chunk plan that the settled one did not have), and
    polished the same way whether K was forced or searched, so that the search stays no worse
    than a forced K: on libra-4d at 256 MiB that costs the search the polish of K = 3 (3 s),
    which it would otherwise skip."""
    polished: list[Candidate | None] = []
    for index, (plan, num_chunks) in enumerate(settled):
        next_plan, next_chunks = settled[index + 1] if index + 1 < len(settled) else (None, 0)
        # Past the enumeration's K, a polished K takes this plan as its ``fewer``.
        next_takes_this = next_chunks == num_chunks + 1 and next_chunks > ENUMERATED_MAX_CHUNKS
        needed = plan is not None and (
            plan.makespan_s <= lead_s
            or (next_takes_this and next_plan is not None and next_plan.makespan_s <= lead_s)
        )
        before = polished[-1] if index > 0 and settled[index - 1][1] == num_chunks - 1 else None
        polished.append(
            _polished(
                topology,
                message_bytes,
                plan,
                num_chunks,
                fewer=before,
                options=options,
                unit_s=unit_s,
                log=log,
            )
            if needed
            else None
        )
    return polished


def _small_steps(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[_Step]:
    """The steps of K' = 1 .. min(K, AT_MOST_MAX_CHUNKS), up to the first K' whose latency
    floor is not below the best so far (where the search's ladder stops too)."""
    steps: list[_Step] = []
    best: Candidate | None = None
    for k in range(1, min(num_chunks, AT_MOST_MAX_CHUNKS) + 1):
        floor_s = log.floor_s(topology, message_bytes, k, options.collective)
        if best is not None and floor_s >= best.makespan_s:
            steps[-1].log.tried.append(Trial(num_chunks=k, pruned="latency floor above the best"))
            break
        step = _small_step(
            topology,
            message_bytes,
            mix,
            k,
            options=options,
            unit_s=unit_s,
            strikes=None,
            floors=log.floors,
            solved_mips=log.solved_mips,
            previous=_before(steps, k),
        )
        steps.append(step)
        if step.best is not None and better(best, step.best):
            best = step.best
    return steps


def search(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    *,
    options: SearchOptions,
    log: SearchLog,
) -> tuple[Candidate, dict[str, float]]:
    """Best candidate over the K ladder and the baseline seeds; also the baselines' makespans."""
    unit_s = time_unit_s(topology, message_bytes, mix, options.collective)
    forced = options.forced_chunks
    if forced is not None and options.climb and forced <= AT_MOST_MAX_CHUNKS:
        # At most K chunks: the fastest settled plan of any K' <= K.
        steps = _small_steps(topology, message_bytes, mix, forced, options=options, unit_s=unit_s, log=log)
        settled = [_settle(topology, message_bytes, step, options=options, unit_s=unit_s) for step in steps]
        for step in steps:
            _absorb(log, step)
        baselines = settled[-1][1]
        if options.baseline_seeds and steps[-1].num_chunks != forced:
            # K itself was not run (its floor is above the best): report the baselines at K.
            seeds = baseline_seeds(topology, message_bytes, forced, options.collective)
            baselines = {seed.structure.source: seed.makespan_s for seed in seeds}
        polished = _polished_in_turn(
            topology,
            message_bytes,
            [(c, step.num_chunks) for (c, _), step in zip(settled, steps, strict=True)],
            options=options,
            unit_s=unit_s,
            log=log,
        )
        return _checked(_fastest(polished), log), baselines
    if forced is not None and options.climb:
        options = _capped(options, forced)
    best, baselines = _search_ladder(topology, message_bytes, mix, options=options, unit_s=unit_s, log=log)
    if (
        best is not None
        and options.collective is Collective.ALL_REDUCE
        and options.climb
        and options.lp_sizes
        and max(best.structure.num_chunks, options.chunk_limit or 0) >= TWO_PHASE_MIN_CHUNKS
    ):
        # Also when the user forced a K this long even if the best so far has fewer chunks:
        # on libra-4d at 1 GiB, forced to 6, it gives 5.1667 ms against 5.2378 ms (5 chunks).
        composed = two_phase_candidate(
            topology, message_bytes, mix, options=options, unit_s=unit_s, log=log, search=search
        )
        if better(best, composed):
            best = composed
    if (
        best is not None
        and options.chunk_limit is not None
        and best.structure.num_chunks > options.chunk_limit
    ):
        raise SolverError(
            f"internal: the search confined to {options.chunk_limit} chunks returned {best.structure.num_chunks}"
        )
    return _checked(best, log), baselines


POLISHED_STARTS = 1 + ENUMERATED_KEPT
"""Distinct order assignments whose sequences the MIP re-solves per settled K: the settled
plan and every kept enumerated one within :data:`POLISH_WINDOW` of the fastest (at K <= 3
a solve takes 0.01-0.3 s). On a generated 3-dim network the optimum's orders ranked 4th
before their MIP, 1.25% ahead after it."""

POLISH_WINDOW = 0.08
"""The search polishes a settled few-chunk plan (:func:`_polished`) unless its plan so far
leads it by more than this (relative), and :func:`_polished` skips starts this far behind
its fastest: the polish gained at most 5.8% on a plan on the generated networks first tried,
and each MIP costs 0.01-0.5 s. It can gain more: on generated network 2026 #12 (1 GiB) it
took the settled 4-chunk plan from 3.2726 to 2.6923 ms, which the search (best 2.6602 ms,
5 chunks) skips and ``--chunks 5`` grows to 2.6483 ms. Polishing every settled K would close
such gaps (2026 #10: 0.9084 -> 0.9022 ms, below ``--chunks 5``'s 0.9063), but on 20 wide
held-out networks (seed 2032) it changed no plan and took four from about 1 s to 8-11 s."""


def _polished(
    topology: Topology,
    message_bytes: int,
    best: Candidate | None,
    max_chunks: int,
    *,
    fewer: Candidate | None = None,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """:func:`_reordered`, then every chunk's order below its first dim by the exact MIP
    (:func:`.tail_mip.free_tails`), unless the plan is at its K's latency floor: the
    reordering moves one chunk's order per step, and each step is judged alone."""
    reordered = _reordered(
        topology, message_bytes, best, max_chunks, fewer=fewer, options=options, unit_s=unit_s, log=log
    )
    if reordered is None or reordered.structure.num_chunks > max_chunks:
        return reordered
    if not tails_apply(topology, reordered.structure.num_chunks, options):
        return reordered  # no floor LP for a step that would not run
    floor_s = log.floor_s(topology, message_bytes, reordered.structure.num_chunks, options.collective)
    if reordered.makespan_s <= floor_s * (1 + NEAR_FLOOR):
        return reordered
    return free_tails(topology, message_bytes, reordered, options=options, unit_s=unit_s, log=log)


def _reordered(
    topology: Topology,
    message_bytes: int,
    best: Candidate | None,
    max_chunks: int,
    *,
    fewer: Candidate | None = None,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """The fastest of ``best`` and the enumerated order multisets (:mod:`.enumeration`, where
    few enough), the :data:`POLISHED_STARTS` fastest of them after
    :func:`.sequence_mip.polish_sequences`; past the enumeration's K, the fastest then
    races ``fewer`` (the polished plan of K - 1, when given) with one of its orders split
    (:func:`.sequence_mip.split_orders`) and takes the order substitutions its MIP finds
    faster (:func:`.sequence_mip.substitute_orders`); within the enumeration's K, the
    reshaping steps (:func:`.sequence_mip.reshape_orders`).
    ``best`` itself when there is nothing to gain: no plan, the ablations, too many chunks
    or dims, or already at its K's latency floor."""
    if best is None or not (options.climb and options.lp_sizes) or max_chunks > AT_MOST_MAX_CHUNKS:
        return best
    if topology.num_dims > POLISH_MAX_DIMS or best.structure.num_chunks > max_chunks:
        return best
    floor_s = log.floor_s(topology, message_bytes, best.structure.num_chunks, options.collective)
    if best.makespan_s <= floor_s * (1 + NEAR_FLOOR):
        return best
    enumerated = enumerated_candidates(
        topology, message_bytes, max_chunks, options=options, unit_s=unit_s, log=log
    )
    if enumerated:
        log.tried.append(
            Trial(
                num_chunks=max_chunks,
                kept_chunks=enumerated[0].structure.num_chunks,
                source="enumerated",
                makespan_s=enumerated[0].makespan_s,
            )
        )
    ordered = sorted([best, *enumerated], key=lambda c: c.makespan_s)
    # A start further behind than the polish has ever gained is not worth its MIP.
    lead_s = ordered[0].makespan_s * (1 + POLISH_WINDOW)
    starts: list[Candidate] = []
    for candidate in ordered:
        if candidate.makespan_s <= lead_s and all(
            candidate.structure.orders != s.structure.orders for s in starts
        ):
            starts.append(candidate)
    polished = [
        polish_sequences(
            topology, message_bytes, start, max_chunks=max_chunks, options=options, unit_s=unit_s, log=log
        )
        for start in starts[:POLISHED_STARTS]
    ]
    fastest = _fastest([best, *polished])
    assert fastest is not None
    if (
        max_chunks > ENUMERATED_MAX_CHUNKS
        and fewer is not None
        and fewer.structure.num_chunks == max_chunks - 1
        and all(fewer.structure.orders != s.structure.orders for s in starts[:POLISHED_STARTS])
        and fastest.makespan_s > floor_s * (1 + NEAR_FLOOR)
    ):
        # The plan of K - 1 with an order split: the search's plan at K may have other orders.
        fastest = split_orders(
            topology, message_bytes, fewer, fastest, options=options, unit_s=unit_s, log=log
        )
    if (
        max_chunks > ENUMERATED_MAX_CHUNKS
        and fastest.structure.num_chunks == max_chunks
        and fastest.makespan_s > floor_s * (1 + NEAR_FLOOR)
    ):
        # Past the enumeration's K, its neighbours one order away, judged by their MIP.
        return substitute_orders(topology, message_bytes, fastest, options=options, unit_s=unit_s, log=log)
    if exhausts_multisets(topology.num_dims, max_chunks) and fastest.makespan_s > floor_s * (1 + NEAR_FLOOR):
        # Few enough multisets that each gets its MIP (the reshaping steps' too).
        return every_multiset(
            topology, message_bytes, fastest, max_chunks=max_chunks, options=options, unit_s=unit_s, log=log
        )
    if extends_pairs(topology.num_dims, max_chunks) and fastest.makespan_s > floor_s * (1 + NEAR_FLOOR):
        # Where triples are pooled: the best pairs with a chunk in any order, by their MIP.
        fastest = extended_pairs(topology, message_bytes, fastest, options=options, unit_s=unit_s, log=log)
    if max_chunks <= ENUMERATED_MAX_CHUNKS and fastest.makespan_s > floor_s * (1 + NEAR_FLOOR):
        # Within the enumeration's K, a few reshaping steps judged by their MIP: an order
        # replaced by any other, or a chunk added.
        return reshape_orders(
            topology, message_bytes, fastest, max_chunks=max_chunks, options=options, unit_s=unit_s, log=log
        )
    return fastest


SWEEP_CHUNKS: tuple[int, ...] = tuple(range(AT_MOST_MAX_CHUNKS + 1, FULL_ROUNDS_MAX_CHUNKS + 1))
"""The Ks the sweep builds with every family, when the ladder's best has more than
:data:`AT_MOST_MAX_CHUNKS` chunks. The ladder's geometric steps and the retirement of
families skip most of them, and the plans there are far apart: on libra-4d at 1 GiB the
Themis-greedy orders at K = 7 swap to 4.709 ms, while the ladder (K = 6, 8, 12, with
greedy retired at K = 4) and its splits ended at 5.182 ms; at K = 6 and 8 the same
family swaps to 5.31 and 5.64 ms."""

SWEEP_SWAPPED = 6
"""The sweep's fastest distinct structures (with the ladder's own at those Ks) whose
binding pairs are swapped: the winners on 24 generated networks ranked up to 5th before
their swaps (with three swapped and one re-sequencing round, 9 of their 12 gains were lost)."""


def _sweep(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    pool: list[Candidate],
    ladder: list[Trial],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """The fastest of :data:`SWEEP_SWAPPED` structures after :func:`swap_critical_pairs`:
    every family (retired ones too, but not :data:`FEW_CHUNK_FAMILIES`) at every K of
    :data:`SWEEP_CHUNKS` that the ladder did not build (its trials: ``ladder``), and the
    ladder's own candidates at those Ks (``pool``). Trials and LP work go to ``log``."""
    built = {(trial.num_chunks, trial.source) for trial in ladder if trial.makespan_s is not None}
    found = [c for c in pool if c.structure.num_chunks > AT_MOST_MAX_CHUNKS]
    built |= {(c.structure.num_chunks, c.structure.source) for c in found}
    for num_chunks in SWEEP_CHUNKS:
        if num_chunks * options.collective.moves_per_byte * topology.num_dims > MAX_OPS:
            break
        if options.chunk_limit is not None and num_chunks > options.chunk_limit:
            break
        for source, orders in families(
            topology,
            message_bytes,
            mix,
            num_chunks,
            ascending_only=options.ascending_only,
            collective=options.collective,
        ):
            if (num_chunks, source) in built or source in FEW_CHUNK_FAMILIES:
                continue
            candidate = _logged_candidate(
                topology, message_bytes, source, orders, num_chunks, options=options, unit_s=unit_s, log=log
            )
            if candidate is not None:
                found.append(candidate)
    distinct: list[Candidate] = []
    for candidate in sorted(found, key=lambda c: c.makespan_s):
        if all(
            candidate.structure.orders != c.structure.orders
            or candidate.structure.sequences != c.structure.sequences
            for c in distinct
        ):
            distinct.append(candidate)
    swapped: list[Candidate | None] = [
        _polish(swap_critical_pairs, "swap", topology, message_bytes, c, unit_s=unit_s, log=log)
        for c in distinct[:SWEEP_SWAPPED]
    ]
    return _fastest(swapped)


def _with_added_chunk(
    topology: Topology,
    message_bytes: int,
    best: Candidate,
    polished: list[Candidate],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``best``, or a faster plan with one chunk more (:func:`.filler.add_any_chunk`) added to
    it or to a polished few-chunk plan (``polished``: the plans the proven optima grow from),
    within a forced K; then, for those of AT_MOST_MAX_CHUNKS chunks (the first K past the
    polish), one chunk more starting on each dim (where none starts first), sequenced by MIP
    (:func:`.sequence_mip.add_sequenced_chunk`). Off in the ablations."""
    if not (options.climb and options.lp_sizes):
        return best
    limit = options.chunk_limit or math.inf  # a forced K reaches here as the search's limit
    bases: list[Candidate] = []
    for candidate in [best, *polished]:
        if candidate.makespan_s > best.makespan_s * (1 + POLISH_WINDOW):
            continue  # further behind than one small chunk has made up
        if all(candidate.structure.orders != b.structure.orders for b in bases):
            bases.append(candidate)
    for base in bases:
        if base.structure.num_chunks + 1 > limit:
            continue
        added = add_any_chunk(topology, message_bytes, base, options=options, unit_s=unit_s, log=log)
        if added is None:
            continue
        log.tried.append(
            Trial(
                num_chunks=base.structure.num_chunks + 1,
                kept_chunks=added.structure.num_chunks,
                source="added chunk",
                makespan_s=added.makespan_s,
            )
        )
        if better(best, added):
            best = added
    for base in bases:
        if base.structure.num_chunks != AT_MOST_MAX_CHUNKS or base.structure.num_chunks + 1 > limit:
            continue
        floor_s = log.floor_s(topology, message_bytes, base.structure.num_chunks + 1, options.collective)
        if best.makespan_s <= floor_s * (1 + NEAR_FLOOR):
            continue
        grown = add_sequenced_chunk(
            topology, message_bytes, base, incumbent=best, options=options, unit_s=unit_s, log=log
        )
        if grown is not None and better(best, grown):
            best = grown
    return best


def _checked(best: Candidate | None, log: SearchLog) -> Candidate:
    """``best``, or the last LP failure as a :class:`SolverError` if there is none."""
    if best is None:
        errors = [trial.error for trial in log.tried if trial.error is not None]
        raise SolverError(errors[-1] if errors else "no candidate schedule was found")
    return best


def _search_ladder(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> tuple[Candidate | None, dict[str, float]]:
    """The K ladder, the local search, splitting and the seeds (see the module docstring).

    When the full planner searches K, every K <= AT_MOST_MAX_CHUNKS on the ladder is run as
    a :class:`_Step` and settled as if forced (:func:`_settle`), so the search is never worse
    than a forced K <= AT_MOST_MAX_CHUNKS. The settling work is added to the record at the
    end: it does not eat into the budget of the ladder, the climb or the splits.
    """
    collective = options.collective
    chain_length = collective.moves_per_byte * topology.num_dims
    limit = options.chunk_limit
    """A forced K above the few-chunk range (:func:`_capped`); None: the search's own K."""
    best: Candidate | None = None
    pool: list[Candidate] = []
    """Every family's candidate at every K of the ladder: the runner-up is climbed too."""
    steps: list[_Step] = []
    """The Ks settled as if forced (their candidates are in ``pool`` too)."""
    settles = options.searches_chunks and options.climb
    misses = 0
    tried: set[int] = set()
    log.allow(LADDER_SHARE)
    for num_chunks in options.ladder:
        small = settles and num_chunks <= AT_MOST_MAX_CHUNKS
        if options.searches_chunks and num_chunks * chain_length > MAX_OPS:
            break
        if small and best is not None:
            # No K-chunk plan beats T_K; plans with fewer chunks are the smaller Ks'. A forced
            # K prunes alike (:func:`_small_steps`), so both settle the same Ks.
            floor_s = log.floor_s(topology, message_bytes, num_chunks, collective)
            if floor_s >= best.makespan_s:
                log.tried.append(Trial(num_chunks=num_chunks, pruned="latency floor above the best"))
                break
        elif not small and best is not None and log.over_budget:
            log.tried.append(Trial(num_chunks=num_chunks, pruned="plan-time budget spent"))
            break
        elif (
            not small
            and best is not None
            and log.floor_s(topology, message_bytes, num_chunks, collective)
            >= best.makespan_s * (1 - FLOOR_SLACK)
        ):
            log.tried.append(Trial(num_chunks=num_chunks, pruned="latency floor within 0.1% of best"))
            break  # the floor grows with K: no larger K can gain more than FLOOR_SLACK
        tried.add(num_chunks)
        if small:
            step = _small_step(
                topology,
                message_bytes,
                mix,
                num_chunks,
                options=options,
                unit_s=unit_s,
                strikes=log,
                floors=log.floors,
                solved_mips=log.solved_mips,
                previous=_before(steps, num_chunks),
            )
            steps.append(step)
            pool.extend(step.pool)
            # Its trials now; its LP work at the end, with the settling: the larger Ks keep
            # the ladder's budget they had before small Ks ran every family.
            _absorb(log, step, work=False)
            best_here = step.best
        else:
            best_here = _best_for_chunks(
                topology, message_bytes, mix, num_chunks, options=options, unit_s=unit_s, log=log, pool=pool
            )
        if best_here is not None and better(best, best_here):
            gain = 1 - best_here.makespan_s / best.makespan_s if best is not None else 1.0
            best = best_here
            # A K above the full-rounds range that gains almost nothing still counts as a
            # miss: the next K costs more than it can bring.
            misses = 1 if num_chunks > FULL_ROUNDS_MAX_CHUNKS and gain < MIN_GAIN else 0
            if misses >= 1 and num_chunks > FULL_ROUNDS_MAX_CHUNKS:
                break
        else:
            misses += 1
            if small and num_chunks < AT_MOST_MAX_CHUNKS:
                continue  # every small K is settled: no early stop before them
            if misses >= (options.patience if num_chunks <= FULL_ROUNDS_MAX_CHUNKS else 1):
                break
    side_logs: list[SearchLog] = []
    """Stages run in logs of their own (the sweep, a forced K's polish): their LP work is
    recorded at the end, so that it does not eat into the budget of the later stages."""
    if (
        best is not None
        and options.searches_chunks
        and options.climb
        and (limit is not None or _requested_chunks(log, best) > AT_MOST_MAX_CHUNKS)
    ):
        # Pipelining pays (or the user forced a K past the few-chunk range): every K between
        # the few-chunk range and the full-rounds range (or the forced K), every family, in a
        # log of its own (its LP work is recorded at the end, like the settling's, so the
        # splits keep their budget). The ladder retires families at small K that win at the
        # forced K: on libra-4d at 1 GiB Themis' greedy orders, retired at K = 4, give the
        # best plan forced to 7 chunks.
        sweep_log = SearchLog(budget=options.lp_work_budget, floors=log.floors, solved_mips=log.solved_mips)
        side_logs.append(sweep_log)
        # The whole plan budget, in its own log: at the default stage limit (half of it) the
        # sweep's last Ks were built without re-sequencing rounds, and on a generated 3-dim
        # network at 1 GiB the greedy orders at K = 16 came out at 3.666 ms instead of 3.283 ms.
        sweep_log.allow(SPLIT_SHARE)
        swept = _sweep(
            topology, message_bytes, mix, pool, log.tried, options=options, unit_s=unit_s, log=sweep_log
        )
        log.tried.extend(sweep_log.tried)
        if swept is not None and better(best, swept):
            best = swept
    if best is not None and options.searches_chunks and _requested_chunks(log, best) >= PROBE_MIN_CHUNKS:
        # Probes: many chunks, one round. The LP empties the chunks it does not want and
        # they are dropped, so a large K lets the LP choose which chunks to keep: it finds
        # structures the ladder's neighbours miss.
        for num_chunks in PROBE_CHUNKS:
            if num_chunks in tried or num_chunks * chain_length > MAX_OPS or log.over_budget:
                continue
            if options.chunk_limit is not None and num_chunks > options.chunk_limit:
                continue
            candidate = _best_for_chunks(
                topology, message_bytes, mix, num_chunks, options=options, unit_s=unit_s, log=log
            )
            if candidate is not None and better(best, candidate):
                best = candidate
    if (
        best is not None
        and limit is not None
        and limit not in tried
        and log.floor_s(topology, message_bytes, limit, collective) < best.makespan_s
    ):
        # The ladder stopped short of the forced K (patience, budget): "at most K" takes K
        # itself too, unless its latency floor says no K-chunk plan can win.
        tried.add(limit)
        candidate = _best_for_chunks(
            topology, message_bytes, mix, limit, options=options, unit_s=unit_s, log=log, pool=pool
        )
        if candidate is not None and better(best, candidate):
            best = candidate
    finished: Candidate | None = None
    if best is not None and options.climb:
        small_ids = {id(c) for step in steps for c in step.pool}
        contenders = [c for c in [best, *_runner_up(pool, best)] if id(c) not in small_ids]
        if contenders:
            finished = _finish(topology, message_bytes, contenders, options=options, unit_s=unit_s, log=log)
    # Then settle every small K, as a forced K would be: skipping those more than 5% behind
    # broke the guarantee, since the local search can move a few-chunk plan further (ring 8,
    # ring 2, switch 7 at 128 MiB: K = 4 went from 5.5% behind the ladder to 2.4% ahead).
    settled = [_settle(topology, message_bytes, step, options=options, unit_s=unit_s)[0] for step in steps]
    if options.climb:
        best = _fastest([*settled, finished]) or best
    if best is not None and options.climb and options.searches_chunks:
        refined = refine_by_splitting(
            topology,
            message_bytes,
            best,
            options=options,
            unit_s=unit_s,
            log=log,
            max_ops=MAX_OPS if limit is None else min(MAX_OPS, limit * chain_length),
            floor_slack=FLOOR_SLACK,
        )
        if refined is not best:  # new sequences: the binding pairs are worth another look
            best = _polish(
                swap_critical_pairs, "swap", topology, message_bytes, refined, unit_s=unit_s, log=log
            )
    if best is not None:
        # Each settled K is polished as a forced K is (so the search stays no worse than any
        # forced K), unless the plan so far leads it by more than the polish has ever gained;
        # last, so that its LPs do not eat into the budget of the splits. Confined to a forced
        # K, every one (never worse than a forced AT_MOST_MAX_CHUNKS, and its bases for the
        # added chunk below are the ones a forced AT_MOST_MAX_CHUNKS polishes), in a log of
        # its own: polishing what the search skips spent the budget that re-sequences the
        # added chunk (libra-4d, 1 GiB, forced to 8: the search's 7-chunk plan grew to 4.7048
        # ms on its own, not after the polish).
        polish_log = log
        if limit is not None:
            polish_log = SearchLog(budget=log.budget, floors=log.floors, solved_mips=log.solved_mips)
            polish_log.allow(SPLIT_SHARE)
            side_logs.append(polish_log)
        polished = _polished_in_turn(
            topology,
            message_bytes,
            [(c, step.num_chunks) for c, step in zip(settled, steps, strict=True)],
            lead_s=best.makespan_s * (1 + POLISH_WINDOW) if limit is None else math.inf,
            options=options,
            unit_s=unit_s,
            log=polish_log,
        )
        if polish_log is not log:
            log.tried.extend(polish_log.tried)
        best = _fastest([best, *polished])
        assert best is not None
        best = _with_added_chunk(
            topology,
            message_bytes,
            best,
            [c for c in polished if c is not None],
            options=options,
            unit_s=unit_s,
            log=log,
        )
        if options.climb and options.lp_sizes and best.structure.num_chunks == AT_MOST_MAX_CHUNKS + 1:
            # The first K past the polish: the plan's own orders, sequenced by MIP.
            best = resequenced(topology, message_bytes, best, options=options, unit_s=unit_s, log=log)
    baselines: dict[str, float] = {}
    if options.baseline_seeds:
        best, baselines = improve_with_seeds(
            topology,
            message_bytes,
            best,
            options.forced_chunks or limit,
            options=options,
            unit_s=unit_s,
            log=log,
        )
    for step in steps:
        _absorb(log, step)  # the LP work of the small Ks, settling included
    for side_log in side_logs:
        log.add_work(side_log)
    return best, baselines
