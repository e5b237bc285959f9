"""Local search: chunk orders for few-chunk plans, then binding sequence pairs.

With few chunks every order matters, and the families (:mod:`.families`) only propose
a handful of layouts: on libra-3d at 256 MiB the best of all 6^4 order assignments for
four chunks is 10% faster than the best family. Trying them all is too slow, so this
climbs: change one chunk's order, re-sequence, re-size by LP, keep the change if the
makespan drops; until no single change helps or the budget is spent.

Then :func:`swap_critical_pairs` polishes the sequences: the LP's duals name the dim
orderings that bind, and swapping one such pair is a one-row change that HiGHS
re-solves warm (libra-3d 1 GiB, libra-4d 4 GiB: +1.6%).
"""

import itertools
from dataclasses import replace

import numpy as np

from hipipe.planners.hipipe.candidates import (
    CLIMB_SHARE,
    CLIMB_STEP_SHARE,
    IMPROVEMENT,
    Candidate,
    SearchLog,
    SearchOptions,
    better,
    candidate_for,
)
from hipipe.planners.hipipe.sequencing import Deadlock, Rule, longest_path_s
from hipipe.planners.hipipe.sizing import SizingModel
from hipipe.planners.hipipe.structure import OpTable, Structure
from hipipe.topology import Topology

MAX_CHUNKS = 6
"""Only plans with at most this many chunks are climbed (each move costs a few LPs)."""

MAX_ORDERS = 24
"""Only networks with at most this many orders (D <= 4): the neighbourhood is K x D!."""

NEAR_FLOOR = 0.002
"""A plan within this of the chunked latency floor for its K is not climbed."""

CLIMB_RULES: tuple[Rule, ...] = (Rule.FIFO, Rule.TAIL, Rule.NESTED, Rule.NESTED_TAIL)
"""Sequencing rules of a climb trial: the basic two and the nested ones (what the proven
optima look like); ag-first and shortest rarely win on their own, and a climb makes
dozens of trials."""

SWAP_TRIALS = 40
"""Warm LP re-solves the sequence polish may spend."""

SWAP_MAX_OPS = 128
"""Plans with more ops are not polished: each trial's LP grows, gains there were ~0.01%."""

SWAP_CANDIDATES = 8
"""Binding pairs tried per round, most binding first."""


def climb_orders(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """First-improvement hill climbing on single-chunk order changes from ``start``.

    Each trial re-sequences and re-sizes with one round (cheaper trials, with no round,
    missed the improvements on libra-3d).
    """
    orders_all = list(itertools.permutations(range(topology.num_dims)))
    if start.structure.num_chunks > MAX_CHUNKS or len(orders_all) > MAX_ORDERS:
        return start
    floor_s = log.floor_s(topology, message_bytes, start.structure.num_chunks, options.collective)
    if start.makespan_s <= floor_s * (1 + NEAR_FLOOR):
        return start  # no order change can gain more than NEAR_FLOOR at this K
    quick = replace(options, max_rounds=1)
    log.allow(CLIMB_SHARE, step_share=CLIMB_STEP_SHARE)
    best = start
    tried: set[tuple[tuple[int, ...], ...]] = {best.structure.orders}
    improved = True
    while improved:
        improved = False
        orders = best.structure.orders
        for j, order in itertools.product(range(len(orders)), orders_all):
            if log.over_budget:
                return best
            trial = (*orders[:j], order, *orders[j + 1 :])
            if trial in tried:
                continue
            tried.add(trial)
            candidate = candidate_for(
                topology,
                message_bytes,
                "climb",
                trial,
                options=quick,
                unit_s=unit_s,
                log=log,
                rules=CLIMB_RULES,
            )
            if better(best, candidate):
                best, improved = candidate, True
                break
    log.improved(start, best, "climb")
    return best


def swap_critical_pairs(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    unit_s: float,
    log: SearchLog,
    max_trials: int = SWAP_TRIALS,
) -> Candidate:
    """Swap adjacent ops on a dim where the LP says the order binds; keep what helps.

    Each trial changes one or two sequence rows, so HiGHS re-solves from the previous
    basis in a few pivots: this is where the warm start pays. Swaps that would make the
    sequences contradict the chains (a cycle) are skipped before any LP.
    """
    orders = start.structure.orders
    collective = start.structure.collective
    if start.lp_makespan_s is None or len(orders) * start.structure.chain_length > SWAP_MAX_OPS:
        return start
    floor_s = log.floor_s(topology, message_bytes, len(orders), collective)
    if start.makespan_s <= floor_s * (1 + IMPROVEMENT):
        return start  # at the floor: nothing to gain with this many chunks
    model = SizingModel(topology, message_bytes, orders, collective=collective, time_unit_s=unit_s)
    table = model.table
    best = start
    sizing = model.solve(best.structure.sequences)
    log.record(table.num_ops, sizing.iterations)
    trials = 0
    tried: set[tuple[tuple[int, ...], ...]] = {best.structure.sequences}
    improved = True
    while improved and trials < max_trials:
        improved = False
        model.solve(best.structure.sequences)  # back to the best's basis and duals
        for p, q in model.critical_pairs()[:SWAP_CANDIDATES]:
            dim = int(table.dim[p])
            sequence = list(best.structure.sequences[dim])
            i = sequence.index(p)
            if i + 1 >= len(sequence) or sequence[i + 1] != q:
                continue
            sequence[i], sequence[i + 1] = q, p
            trial = tuple(tuple(sequence) if k == dim else s for k, s in enumerate(best.structure.sequences))
            if trial in tried:
                continue
            tried.add(trial)
            try:
                longest_path_s(table, table.durations_s(best.sizes_bytes), trial)
            except Deadlock:
                continue  # the swap contradicts the chains
            trials += 1
            sizing = model.solve(trial)
            log.record(table.num_ops, sizing.iterations)
            makespan = longest_path_s(table, table.durations_s(sizing.sizes_bytes), trial)
            candidate = Candidate(
                structure=Structure(
                    orders=orders, sequences=trial, source=best.structure.source, collective=collective
                ),
                sizes_bytes=sizing.sizes_bytes,
                makespan_s=makespan,
                lp_makespan_s=sizing.makespan_s,
            )
            if better(best, candidate):
                best, improved = candidate, True
                break
            if trials >= max_trials:
                break
    return best


NEST_MAX_CHUNKS = 4
"""Nested descent runs on plans of at most this many chunks: a pass tries D x K! sequences."""

NEST_MAX_PASSES = 3
"""Passes over the dims; on the reference grid the descent settles in two."""


def nested_dim_sequences(table: OpTable, dim: int) -> list[tuple[int, ...]]:
    """Every nested sequence of one dim: the chunks' ReduceScatters in some order, then their
    AllGathers in the reverse order (the last chunk in is the first out)."""
    chain_length = table.chain_length
    num_chunks = table.num_ops // chain_length
    scatters: list[int] = []
    gathers: list[int] = []
    for j in range(num_chunks):
        ops = [op for op in range(j * chain_length, (j + 1) * chain_length) if table.dim[op] == dim]
        scatter, gather = (ops[0], ops[1]) if not table.gathers[ops[0]] else (ops[1], ops[0])
        scatters.append(scatter)
        gathers.append(gather)
    return [
        (*(scatters[j] for j in perm), *(gathers[j] for j in reversed(perm)))
        for perm in itertools.permutations(range(num_chunks))
    ]


def nested_descent_timed(
    table: OpTable, durations_s: np.ndarray, sequences: tuple[tuple[int, ...], ...]
) -> tuple[tuple[tuple[int, ...], ...], float]:
    """:func:`nested_descent` at fixed op durations: the same moves, judged by the longest
    path alone (no LP), so it costs microseconds a trial. Returns the best sequences and
    their makespan. The enumeration screens every order multiset with it: the nested optima
    it must find rank far down when judged by list schedules, even LP-sized ones.
    """
    best_s = longest_path_s(table, durations_s, sequences)
    if (
        table.chain_length != 2 * table.num_dims
        or not 2 <= table.num_ops // table.chain_length <= NEST_MAX_CHUNKS
    ):
        return sequences, best_s
    choices = [nested_dim_sequences(table, dim) for dim in range(table.num_dims)]
    best = sequences
    for _ in range(NEST_MAX_PASSES):
        improved = False
        for dim, options in enumerate(choices):
            for sequence in options:
                trial = (*best[:dim], sequence, *best[dim + 1 :])
                try:
                    makespan_s = longest_path_s(table, durations_s, trial)
                except Deadlock:
                    continue
                if makespan_s < best_s * (1 - IMPROVEMENT):
                    best, best_s, improved = trial, makespan_s, True
        if not improved:
            break
    return best, best_s


def nested_descent(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """Coordinate descent over nested per-dim sequences: one dim at a time, every order of
    its ReduceScatters with the AllGathers mirrored; keep the best; repeat over the dims.

    The proven optima of the exact planner at K <= 4 are often nested on every dim with
    chunks that enter each dim in a different order (rfs-3d, K = 3: d0 ``1R 0R 2R 2A 0A 1A``,
    d1 ``2R 0R 1R 1A 0A 2A``, d2 ``1R 2R 0R 0A 2A 1A``). The list scheduler picks which chunk
    enters a dim first from the ops' ready times, and neither a rule nor one adjacent swap
    reaches these; changing one dim's sequence is a few rows, which HiGHS re-solves warm.
    AllReduce only (a half chain visits each dim once: nothing to nest).
    """
    structure = start.structure
    if (
        start.lp_makespan_s is None
        or structure.num_chunks > NEST_MAX_CHUNKS
        or structure.num_chunks < 2
        or structure.chain_length != 2 * len(structure.sequences)
    ):
        return start
    floor_s = log.floor_s(topology, message_bytes, structure.num_chunks, structure.collective)
    if start.makespan_s <= floor_s * (1 + NEAR_FLOOR):
        return start  # no sequence can gain more than NEAR_FLOOR with this many chunks
    model = SizingModel(
        topology, message_bytes, structure.orders, collective=structure.collective, time_unit_s=unit_s
    )
    table = model.table
    choices = [nested_dim_sequences(table, dim) for dim in range(table.num_dims)]
    best = start
    tried: set[tuple[tuple[int, ...], ...]] = {structure.sequences}
    for _ in range(NEST_MAX_PASSES):
        improved = False
        for dim, options in enumerate(choices):
            for sequence in options:
                sequences = best.structure.sequences
                trial = (*sequences[:dim], sequence, *sequences[dim + 1 :])
                if trial in tried:
                    continue
                tried.add(trial)
                try:
                    longest_path_s(table, table.durations_s(best.sizes_bytes), trial)
                except Deadlock:
                    continue
                sizing = model.solve(trial)
                log.record(table.num_ops, sizing.iterations)
                candidate = Candidate(
                    structure=replace(best.structure, sequences=trial),
                    sizes_bytes=sizing.sizes_bytes,
                    makespan_s=longest_path_s(table, table.durations_s(sizing.sizes_bytes), trial),
                    lp_makespan_s=sizing.makespan_s,
                )
                if better(best, candidate):
                    best, improved = candidate, True
        if not improved:
            break
    return best
