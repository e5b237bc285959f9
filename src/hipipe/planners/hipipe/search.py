"""The chunk-number search (the cost model and bounds: docs/MODEL.md).

For each K on a geometric ladder, every order family (:mod:`.families`) is turned into
its best candidate (:mod:`.candidates`: list-scheduled sequences, LP sizes, re-sequencing
rounds, empty chunks dropped). The ladder stops when K stops improving, when the chunked
latency floor (:func:`hipipe.bounds.chunked_bound_s`) says no larger K can win, or when
the plan-time budget is spent; a K = 32 probe then lets the LP pick which chunks to keep,
a few-chunk winner is polished by local search over its orders, and binding sequence
pairs are swapped (warm LP re-solves; :mod:`.local_search`); unless K is forced, the best
plan's chunks are then split while that helps (:mod:`.splitting`: the ramp that Ks built
from scratch cannot have), and a split plan's binding pairs are swapped again.
Last, the baselines' own structures are re-sized where they would still win
(:mod:`.seeds`), so the result is never worse than a baseline.
"""

from dataclasses import replace

from hipipe.bounds import OrderMix, chunked_bound_s, order_loads
from hipipe.errors import SolverError
from hipipe.planners.hipipe.candidates import (
    IMPROVEMENT,
    LADDER_SHARE,
    Candidate,
    SearchLog,
    SearchOptions,
    Trial,
    better,
    candidate_for,
    time_unit_s,
)
from hipipe.planners.hipipe.families import families
from hipipe.planners.hipipe.local_search import climb_orders, nested_descent, swap_critical_pairs
from hipipe.planners.hipipe.seeds import improve_with_seeds
from hipipe.planners.hipipe.splitting import refine_by_splitting
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
) -> Candidate | None:
    """Best candidate over the order families for one K (logged in ``log.tried``); None if
    every LP failed."""
    best_here: Candidate | None = None
    rounds = options.max_rounds if num_chunks <= FULL_ROUNDS_MAX_CHUNKS else 0
    results: dict[str, float] = {}
    # No schedule with this many chunks beats the chunked latency floor: once a family
    # reaches it with all its chunks, the others cannot do better with as many (switch-3d-512
    # and tpu-2d: the mix does at K = 3); plans with fewer chunks are the smaller Ks' business.
    floor_s = chunked_bound_s(topology, message_bytes, num_chunks, collective=options.collective)
    for source, orders in families(
        topology,
        message_bytes,
        mix,
        num_chunks,
        ascending_only=options.ascending_only,
        collective=options.collective,
    ):
        if source in log.retired:
            continue
        try:
            candidate = candidate_for(
                topology,
                message_bytes,
                source,
                orders,
                options=replace(options, max_rounds=rounds),
                unit_s=unit_s,
                log=log,
            )
        except SolverError as error:
            # One structure's LP failing is no reason to fail the plan: skip it, say so.
            log.tried.append(Trial(num_chunks=num_chunks, source=source, error=str(error)))
            continue
        log.tried.append(
            Trial(
                num_chunks=num_chunks,
                kept_chunks=candidate.structure.num_chunks,
                source=source,
                makespan_s=candidate.makespan_s,
            )
        )
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
    if best_here is not None:
        for source, makespan_s in results.items():
            behind = makespan_s > best_here.makespan_s * (1 + RETIRE_MARGIN)
            log.strikes[source] = log.strikes.get(source, 0) + 1 if behind else 0
            if log.strikes[source] >= RETIRE_STRIKES and source != "mix":
                log.retired.add(source)
    return best_here


RUNNER_UP_MARGIN = 0.02
"""The runner-up is climbed too only when within this of the best (relative): further
behind, the climb has never closed the gap on the reference grid, and it costs plan time."""


def _runner_up(pool: list[Candidate], best: Candidate) -> list[Candidate]:
    """The fastest candidate of another structure than ``best``, if within :data:`RUNNER_UP_MARGIN`."""
    others = [
        c
        for c in pool
        if c.structure.orders != best.structure.orders or c.structure.sequences != best.structure.sequences
    ]
    if not others:
        return []
    second = min(others, key=lambda c: c.makespan_s)
    return [second] if second.makespan_s <= best.makespan_s * (1 + RUNNER_UP_MARGIN) else []


def _requested_chunks(log: SearchLog, best: Candidate) -> int:
    """The K the ladder asked for when it found ``best`` (before empty chunks were dropped)."""
    for trial in log.tried:
        if trial.makespan_s == best.makespan_s and trial.kept_chunks is not None:
            return trial.num_chunks
    return best.structure.num_chunks


def _swap_polish(
    topology: Topology, message_bytes: int, best: Candidate, *, unit_s: float, log: SearchLog
) -> Candidate:
    """``best`` after :func:`swap_critical_pairs`, logged when it changed anything."""
    polished = swap_critical_pairs(topology, message_bytes, best, unit_s=unit_s, log=log)
    if polished is not best:
        log.tried.append(
            Trial(
                num_chunks=best.structure.num_chunks,
                kept_chunks=polished.structure.num_chunks,
                source="swap",
                makespan_s=polished.makespan_s,
            )
        )
    return polished


def _nest_polish(
    topology: Topology, message_bytes: int, best: Candidate, *, unit_s: float, log: SearchLog
) -> Candidate:
    """``best`` after :func:`nested_descent`, logged when it changed anything."""
    nested = nested_descent(topology, message_bytes, best, unit_s=unit_s, log=log)
    if nested is not best:
        log.tried.append(
            Trial(
                num_chunks=best.structure.num_chunks,
                kept_chunks=nested.structure.num_chunks,
                source="nest",
                makespan_s=nested.makespan_s,
            )
        )
    return nested


def search(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    *,
    options: SearchOptions,
    log: SearchLog,
) -> tuple[Candidate, dict[str, float]]:
    """Best candidate over the K ladder and the baseline seeds; also the baselines' makespans."""
    collective = options.collective
    unit_s = time_unit_s(topology, message_bytes, mix, collective)
    chain_length = collective.moves_per_byte * topology.num_dims
    best: Candidate | None = None
    pool: list[Candidate] = []
    """Every family's candidate at every K of the ladder: the runner-up is climbed too."""
    misses = 0
    tried: set[int] = set()
    loads = order_loads(topology)
    log.allow(LADDER_SHARE)
    for num_chunks in options.ladder:
        if options.searches_chunks and num_chunks * chain_length > MAX_OPS:
            break
        if best is not None and log.over_budget:
            log.tried.append(Trial(num_chunks=num_chunks, pruned="plan-time budget spent"))
            break
        if best is not None and chunked_bound_s(
            topology, message_bytes, num_chunks, loads=loads, collective=collective
        ) >= best.makespan_s * (1 - FLOOR_SLACK):
            log.tried.append(Trial(num_chunks=num_chunks, pruned="latency floor within 0.1% of best"))
            break  # the floor grows with K: no larger K can gain more than FLOOR_SLACK
        tried.add(num_chunks)
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
            if misses >= (options.patience if num_chunks <= FULL_ROUNDS_MAX_CHUNKS else 1):
                break
    if best is not None and options.searches_chunks and _requested_chunks(log, best) >= PROBE_MIN_CHUNKS:
        # Probes: many chunks, one round. The LP empties the chunks it does not want and
        # they are dropped, so a large K lets the LP choose which chunks to keep: it finds
        # structures the ladder's neighbours miss.
        for num_chunks in PROBE_CHUNKS:
            if num_chunks in tried or num_chunks * chain_length > MAX_OPS or log.over_budget:
                continue
            candidate = _best_for_chunks(
                topology, message_bytes, mix, num_chunks, options=options, unit_s=unit_s, log=log
            )
            if candidate is not None and better(best, candidate):
                best = candidate
    if best is not None and options.climb:
        # Before the local search the two best structures are often close, and climbing and
        # polishing move each by a few percent: on libra-4d at 64 MiB, K = 3 led K = 2 by
        # 0.7% but K = 2 climbs to 0.790 ms against K = 3's 0.805 ms. Both are searched.
        finished = []
        for contender in [best, *_runner_up(pool, best)]:
            climbed = climb_orders(
                topology, message_bytes, contender, options=options, unit_s=unit_s, log=log
            )
            polished = _swap_polish(topology, message_bytes, climbed, unit_s=unit_s, log=log)
            finished.append(_nest_polish(topology, message_bytes, polished, unit_s=unit_s, log=log))
        best = min(finished, key=lambda c: c.makespan_s)
    if best is not None and options.climb and options.searches_chunks:
        refined = refine_by_splitting(
            topology,
            message_bytes,
            best,
            options=options,
            unit_s=unit_s,
            log=log,
            max_ops=MAX_OPS,
            floor_slack=FLOOR_SLACK,
        )
        if refined is not best:  # new sequences: the binding pairs are worth another look
            best = _swap_polish(topology, message_bytes, refined, unit_s=unit_s, log=log)
    baselines: dict[str, float] = {}
    if options.baseline_seeds:
        best, baselines = improve_with_seeds(
            topology, message_bytes, best, options.forced_chunks, options=options, unit_s=unit_s, log=log
        )
    if best is None:
        errors = [trial.error for trial in log.tried if trial.error is not None]
        raise SolverError(errors[-1] if errors else "no candidate schedule was found")
    return best, baselines
