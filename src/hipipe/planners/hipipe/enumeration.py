"""Every assignment of orders to a few chunks, where there are few enough to try them all.

On generated networks the exact planner found hipipe up to 5.8% behind the proven
optimum at K = 2 and 3 (a 4-dim network at 64 MiB, K = 2: hipipe 0.2423 ms with one order
twice, the optimum 0.2341 ms with two different orders). The climb (:mod:`.local_search`)
changes one chunk's order at a time and judges each change by list-scheduled sequences,
and those optima were two changes away, through plans that look worse before their
sequences are nested. Chunks are interchangeable, so the candidates are the multisets of
K orders: 300 pairs on 4 dims, 56 triples on 3 dims, and on 4 dims triples and quadruples
of the orders that make the best pairs.

Each multiset is first *screened* without an LP: list-scheduled (the nested and the basic
rule) at equal chunk sizes, then the nested descent at those op durations, judged by the
longest path (:func:`.local_search.nested_descent_timed`). Judged by LP-sized list
schedules instead, the proven optimum's triple ranked 5th to 17th of 120 on two 4-dim
networks (its sequences are nested, with chunks entering each dim in different orders);
screened, it ranked 2nd on one of them. The :data:`SCREENED` best are sized by LP, their
nested sequences chosen again at those sizes and re-sized, and the fastest few go through
the binding-pair swaps and the nested descent; the search then re-solves their sequences
by MIP (:mod:`.sequence_mip`).
"""

import itertools
import math
from dataclasses import replace

import numpy as np

from hipipe.planners.hipipe.candidates import Candidate, SearchLog, SearchOptions, better, optimize_structure
from hipipe.planners.hipipe.local_search import nested_descent, nested_descent_timed, swap_critical_pairs
from hipipe.planners.hipipe.sequencing import (
    NESTED_RULES,
    Rule,
    list_schedule,
    longest_path_s,
    mirrored_list_schedule,
)
from hipipe.planners.hipipe.structure import OpTable, Order, Structure, op_table
from hipipe.topology import Topology

MAX_COMBINATIONS = 300
"""Enumerate only when there are at most this many order multisets (300 pairs on 4 dims
screen in about 0.2 s on a 2-core host)..."""

MAX_CHUNKS = 3
"""...and at most this many chunks: K = 4 on 3 dims (126 multisets, then a MIP per kept
one) took plan time from 1-2 s to 5-7 s and moved none of the generated networks."""

SCREENED = 32
"""Screened multisets sized by LP, their nested sequences chosen again for those sizes and
sized again (up to four LPs each; before the screen every multiset had its LP: 300 pairs
cost about 1 s on a 2-core host, their screen 0.2 s). Equal sizes are a rough guide: on a
generated 4-dim network the proven optimum's triple (sizes 0.37, 0.26, 0.37) ranked 21st
screened and 1st once re-sized."""

KEPT = 4
"""The fastest sized multisets that go on to the local search and the sequence MIP."""

POOL_ORDERS = 10
"""Orders pooled from the best screened pairs where all multisets would be too many (220
multisets of 3 out of 10). On a generated 4-dim network the best triple known has an
order that comes 9th in the screened pairs."""

RULES: tuple[Rule, ...] = (Rule.NESTED, Rule.FIFO)
"""The screen's list schedules: nested (the proven optima at K <= 4 are mostly nested on
every dim; the descent starts from it) and FIFO (some are not: one 4-dim optimum runs
``1R 1A 2R 2A 0R 0A`` on a dim). The four climb rules found nothing these two did not."""


def _rule_schedules(
    table: OpTable, durations_s: np.ndarray
) -> list[tuple[Rule, tuple[tuple[int, ...], ...]]]:
    """The screen's list schedules of :data:`RULES`; for an AllGather (a half chain of
    gathers) also those run backwards in time (:func:`.sequencing.mirrored_list_schedule`),
    which list it as the ReduceScatter it mirrors."""
    schedules = [(rule, list_schedule(table, durations_s, rule)) for rule in RULES]
    if table.chain_length == table.num_dims and bool(table.gathers.all()):
        schedules += [(rule, mirrored_list_schedule(table, durations_s, rule)) for rule in RULES]
    return schedules


MAX_DISTINCT_FIRST = 1296
"""Enumerate the *distinct-first* assignments (K = D chunks, each starting on its own dim,
:func:`distinct_first_assignments`) when there are at most this many: ((D-1)!)^D, 1296 on
4 dims, where all multisets of 4 orders would be 17550."""

KEPT_BEYOND = 1
"""Past :data:`MAX_CHUNKS`, the multisets of each family (pooled, distinct-first) that go on
to the local search and the sequence MIP: each 4-dim MIP costs about 0.5 s, and keeping four
(:data:`KEPT`) distinct-first ones made 4-dim K = 4 plans 1.75-1.9x slower (one: 1.4-1.5x)."""

DESCENDED = 128
"""Of each K = 4 family's multisets (:func:`enumerated_candidates`), the best this many by
list schedules alone go on to the screen's nested descent (on all 1296 distinct-first
assignments it took 5 s on a 2-core host; this, 0.7 s)."""


def combinations(num_orders: int, num_chunks: int) -> int:
    """How many multisets of ``num_chunks`` orders there are out of ``num_orders``."""
    return math.comb(num_orders + num_chunks - 1, num_chunks)


def enumerates_every_multiset(num_dims: int, num_chunks: int) -> bool:
    """Whether :func:`enumerated_candidates` tries every order multiset of ``num_chunks``
    chunks (rather than those of a pool of orders, or none)."""
    return num_chunks <= MAX_CHUNKS and combinations(math.factorial(num_dims), num_chunks) <= MAX_COMBINATIONS


def enumerated_candidates(
    topology: Topology,
    message_bytes: int,
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[Candidate]:
    """The :data:`KEPT` fastest order multisets of ``num_chunks`` chunks after the local
    search, fastest first; at K = D = 4, the fastest (:data:`KEPT_BEYOND`) of two families:
    the multisets of 4 of the pooled orders below (715) and the distinct-first assignments
    (:func:`distinct_first_assignments`, 1296); else [].

    At K = 4 on generated 4-dim networks the exact planner found schedules 3.3% and 5.0%
    faster than the search's (#34 and #27 of seed 7, not proven optimal) whose orders all
    come from the pool, three of them the same (1.391 -> 1.302 ms with the pooled family).

    The orders are all D! of them when that makes at most :data:`MAX_COMBINATIONS`
    multisets; otherwise (K = 3 on 4 dims: 2600) the :data:`POOL_ORDERS` orders of the
    best screened pairs: the proven optima at K = 3 on 4 dims are made of orders that also
    pair well (libra-4d at 1 GiB, and the generated networks checked: all three among the
    10 of the best pairs).
    """
    num_dims = topology.num_dims
    orders = list(itertools.permutations(range(num_dims)))
    kept: list[Candidate]
    if 2 <= num_chunks <= MAX_CHUNKS:
        if combinations(len(orders), num_chunks) > MAX_COMBINATIONS:
            if combinations(len(orders), 2) > MAX_COMBINATIONS:
                return []
            orders = _pool(topology, message_bytes, orders, options=options, log=log)
        combos = list(itertools.combinations_with_replacement(orders, num_chunks))
        sized = _sized(
            topology,
            message_bytes,
            ("multisets", tuple(orders), num_chunks),
            combos,
            options=options,
            unit_s=unit_s,
            log=log,
        )
        kept = sized[:KEPT]
    elif num_chunks == num_dims == MAX_CHUNKS + 1 and combinations(len(orders), 2) <= MAX_COMBINATIONS:
        pool = _pool(topology, message_bytes, orders, options=options, log=log)
        pooled: list[tuple[Order, ...]] = list(itertools.combinations_with_replacement(pool, num_chunks))
        families: list[tuple[tuple[object, ...], list[tuple[Order, ...]]]] = [
            (("pooled", tuple(pool)), pooled)
        ]
        if math.factorial(num_dims - 1) ** num_dims <= MAX_DISTINCT_FIRST:
            families.append((("distinct-first", num_dims), distinct_first_assignments(num_dims)))
        kept = []
        for key, family in families:
            sized = _sized(
                topology,
                message_bytes,
                key,
                family,
                options=options,
                unit_s=unit_s,
                log=log,
                descend_best=DESCENDED,
            )
            kept += [
                c for c in sized[:KEPT_BEYOND] if all(c.structure.orders != k.structure.orders for k in kept)
            ]
    else:
        return []
    finished = [
        nested_descent(
            topology,
            message_bytes,
            swap_critical_pairs(topology, message_bytes, candidate, unit_s=unit_s, log=log),
            unit_s=unit_s,
            log=log,
        )
        for candidate in kept
    ]
    return sorted(finished, key=lambda c: c.makespan_s)


def sized_pairs(
    topology: Topology,
    message_bytes: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[Candidate]:
    """Every pair of orders screened, the :data:`SCREENED` best sized by LP, fastest first
    (as :func:`enumerated_candidates` ranks them at K = 2; kept in ``log``)."""
    orders = list(itertools.permutations(range(topology.num_dims)))
    pairs: list[tuple[Order, ...]] = list(itertools.combinations_with_replacement(orders, 2))
    return _sized(
        topology,
        message_bytes,
        ("multisets", tuple(orders), 2),
        pairs,
        options=options,
        unit_s=unit_s,
        log=log,
    )


def distinct_first_assignments(num_dims: int) -> list[tuple[Order, ...]]:
    """Every assignment of one order per dim to ``num_dims`` chunks where chunk ``f`` starts
    on dim ``f``: each dim is some chunk's first, so none idles while the pipeline fills,
    and only the tails differ (``(D-1)!`` per chunk).

    On a generated 4-dim network at 1 GiB, K = 4 (fully connected 4 and switch 4 at 25
    GB/s, ring 2 at 25 GB/s, fully connected 4 at 50 GB/s), the proven optimum (17.49 ms)
    and the search's plan (18.49 ms) both start their chunks on four different dims, with
    every tail different: no one-order climb connects them. The fastest of these
    assignments, screened, sized and polished, comes to 17.76 ms.
    """
    tails = [
        [(first, *rest) for rest in itertools.permutations([d for d in range(num_dims) if d != first])]
        for first in range(num_dims)
    ]
    return list(itertools.product(*tails))


def screened_order(
    topology: Topology,
    message_bytes: int,
    combos: list[tuple[Order, ...]],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    sizes_bytes: list[np.ndarray] | None = None,
) -> list[tuple[Order, ...]]:
    """``combos`` in the order cheap screens rank them, taking turns between the screens
    (first of each, then second of each, ...; each combo once). At equal sizes: the time of
    their nested-descended list schedules, and one LP sizing those sequences. With
    ``sizes_bytes`` (each combo's sizes, one per chunk): those two screens at those sizes,
    then the descent at equal sizes as a third.

    Neither screen alone ranks the order substitutions well whose MIP-optimal sequences are
    faster (:func:`.sequence_mip.substitute_orders`). From the polished K = 4 plans of four
    generated 4-dim networks and three reference instances (rfs-3d at 64 MiB, libra-3d and
    libra-4d at 256 MiB), the first improving neighbour ranked 1st to 4th by the LP and 1st
    or 2nd by the descent in six of the seven; on libra-4d the only one (0.16%) ranked 10th
    and 8th of 10. The reshaping steps (:func:`.sequence_mip.reshape_orders`) add small
    chunks, which equal sizes make look slow (the best addition on a held-out 4-dim network
    ranked 29th of 70 by the equal-size descent, 1st at the plan's sizes), but move chunks to
    another first dim too, which one held-out network's optimum needed (2nd by the
    equal-size descent, 6th and 19th at the plan's sizes).
    """
    if not combos:
        return []
    single_lp = replace(options, max_rounds=0)
    screens: list[list[tuple[float, int]]] = [[], []] if sizes_bytes is None else [[], [], []]
    for index, combo in enumerate(combos):
        table = op_table(topology, combo, options.collective)
        equal = np.full(len(combo), message_bytes / len(combo))
        listed, descended, descended_s = _listed_and_descended(
            table, table.durations_s(equal if sizes_bytes is None else sizes_bytes[index])
        )
        sized = _lp_sized(
            topology, message_bytes, combo, [descended, *listed], options=single_lp, unit_s=unit_s, log=log
        )
        screens[0].append((descended_s, index))
        screens[1].append((sized.makespan_s, index))
        if sizes_bytes is not None:
            screens[2].append((_listed_and_descended(table, table.durations_s(equal))[2], index))
    ranked: list[int] = []
    for turn in zip(*(sorted(screen) for screen in screens), strict=True):
        for _, index in turn:
            if index not in ranked:
                ranked.append(index)
    return [combos[index] for index in ranked]


def _listed_and_descended(
    table: OpTable, durations_s: np.ndarray
) -> tuple[list[tuple[tuple[int, ...], ...]], tuple[tuple[int, ...], ...], float]:
    """The screen's list schedules at ``durations_s`` (:func:`_rule_schedules`), and the nested
    descent from the fastest of them with its makespan: :func:`screened_order`'s screens."""
    listed = [sequences for _, sequences in _rule_schedules(table, durations_s)]
    start = min(listed, key=lambda sequences: longest_path_s(table, durations_s, sequences))
    descended, descended_s = nested_descent_timed(table, durations_s, start)
    return listed, descended, descended_s


def _screened(
    topology: Topology,
    message_bytes: int,
    key: tuple[object, ...],
    combos: list[tuple[Order, ...]],
    *,
    options: SearchOptions,
    log: SearchLog,
    descend_best: int | None = None,
) -> list[Candidate]:
    """Every one of ``combos`` with its best screened sequences at equal sizes (no LP:
    ``lp_makespan_s`` is None), fastest first, ties in enumeration order. The nested
    descent runs on every combo, or with ``descend_best`` on that many of the best by
    list schedules alone (the others keep their list schedules' times). Kept in ``log``
    under ``key``: K = 2's pairs also choose the pool of K = 3."""
    if ("screened", *key) not in log.enumerated:
        num_chunks = len(combos[0])
        equal = np.full(num_chunks, message_bytes / num_chunks)
        screened: list[Candidate] = []
        for combo in combos:
            table = op_table(topology, combo, options.collective)
            durations = table.durations_s(equal)
            best: tuple[float, tuple[tuple[int, ...], ...]] | None = None
            for rule, sequences in _rule_schedules(table, durations):
                if rule in NESTED_RULES and descend_best is None:
                    sequences, makespan_s = nested_descent_timed(table, durations, sequences)
                else:
                    makespan_s = longest_path_s(table, durations, sequences)
                if best is None or makespan_s < best[0]:
                    best = (makespan_s, sequences)
            assert best is not None
            screened.append(_unsized(combo, best[1], equal, best[0], options))
        screened.sort(key=lambda c: c.makespan_s)
        if descend_best is not None:
            for i, candidate in enumerate(screened[:descend_best]):
                table = op_table(topology, candidate.structure.orders, options.collective)
                sequences, makespan_s = nested_descent_timed(
                    table, table.durations_s(equal), candidate.structure.sequences
                )
                if makespan_s < candidate.makespan_s:
                    screened[i] = _unsized(candidate.structure.orders, sequences, equal, makespan_s, options)
            screened.sort(key=lambda c: c.makespan_s)
        log.enumerated[("screened", *key)] = screened
    return log.enumerated[("screened", *key)]


def _unsized(
    orders: tuple[Order, ...],
    sequences: tuple[tuple[int, ...], ...],
    sizes_bytes: np.ndarray,
    makespan_s: float,
    options: SearchOptions,
) -> Candidate:
    """A screened candidate: its sequences timed at ``sizes_bytes``, no LP."""
    structure = Structure(
        orders=orders, sequences=sequences, source="enumerated", collective=options.collective
    )
    return Candidate(structure=structure, sizes_bytes=sizes_bytes, makespan_s=makespan_s, lp_makespan_s=None)


def _sized(
    topology: Topology,
    message_bytes: int,
    key: tuple[object, ...],
    combos: list[tuple[Order, ...]],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    descend_best: int | None = None,
) -> list[Candidate]:
    """The :data:`SCREENED` best screened ``combos``, each sized by LP on its screened
    sequences and the screen's list schedules (:func:`_rule_schedules`), then its nested sequences chosen
    again at those sizes (:func:`.local_search.nested_descent_timed`) and re-sized;
    fastest first."""
    if ("sized", *key) not in log.enumerated:
        single_lp = replace(options, max_rounds=0)
        sized = []
        screened_all = _screened(
            topology, message_bytes, key, combos, options=options, log=log, descend_best=descend_best
        )
        for screened in screened_all[:SCREENED]:
            orders_of = screened.structure.orders
            num_chunks = len(orders_of)
            table = op_table(topology, orders_of, options.collective)
            durations = table.durations_s(screened.sizes_bytes)
            first = [screened.structure.sequences, *(seq for _, seq in _rule_schedules(table, durations))]
            candidate = _lp_sized(
                topology, message_bytes, orders_of, first, options=single_lp, unit_s=unit_s, log=log
            )
            if candidate.structure.num_chunks == num_chunks:
                # The screen's sequences were chosen for equal sizes: choose again for these.
                resequenced, _ = nested_descent_timed(
                    table, table.durations_s(candidate.sizes_bytes), candidate.structure.sequences
                )
                if resequenced != candidate.structure.sequences:
                    again = _lp_sized(
                        topology,
                        message_bytes,
                        orders_of,
                        [resequenced],
                        options=single_lp,
                        unit_s=unit_s,
                        log=log,
                    )
                    candidate = again if better(candidate, again) else candidate
            sized.append(candidate)
        log.enumerated[("sized", *key)] = sorted(sized, key=lambda c: c.makespan_s)
    return log.enumerated[("sized", *key)]


def _lp_sized(
    topology: Topology,
    message_bytes: int,
    orders: tuple[Order, ...],
    sequences: list[tuple[tuple[int, ...], ...]],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """The best of ``sequences`` (duplicates dropped), each sized by one LP."""
    return optimize_structure(
        topology,
        message_bytes,
        orders,
        list(dict.fromkeys(sequences)),
        source="enumerated",
        options=options,
        unit_s=unit_s,
        log=log,
        resequence=False,
    )


def _pool(
    topology: Topology,
    message_bytes: int,
    orders: list[Order],
    *,
    options: SearchOptions,
    log: SearchLog,
) -> list[Order]:
    """The first :data:`POOL_ORDERS` distinct orders of the best screened pairs."""
    pool: list[Order] = []
    pairs: list[tuple[Order, ...]] = list(itertools.combinations_with_replacement(orders, 2))
    for candidate in _screened(
        topology, message_bytes, ("multisets", tuple(orders), 2), pairs, options=options, log=log
    ):
        for order in candidate.structure.orders:
            if order not in pool:
                pool.append(order)
        if len(pool) >= POOL_ORDERS:
            break
    return pool[:POOL_ORDERS]
