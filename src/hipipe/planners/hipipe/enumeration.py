"""Every assignment of orders to a few chunks, where there are few enough to try them all.

On generated networks the exact planner found hipipe up to 5.8% behind the proven
optimum at K = 2 and 3 (a 4-dim network at 64 MiB, K = 2: hipipe 0.2423 ms with one order
twice, the optimum 0.2341 ms with two different orders). The climb (:mod:`.local_search`)
changes one chunk's order at a time and judges each change by list-scheduled sequences,
and those optima were two changes away, through plans that look worse before their
sequences are nested. Chunks are interchangeable, so the candidates are the multisets of
K orders: 300 pairs on 4 dims, 56 triples on 3 dims, and on 4 dims triples of the orders
that make the best pairs.

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
from hipipe.planners.hipipe.sequencing import NESTED_RULES, Rule, list_schedule, longest_path_s
from hipipe.planners.hipipe.structure import Order, Structure, op_table
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


def combinations(num_orders: int, num_chunks: int) -> int:
    """How many multisets of ``num_chunks`` orders there are out of ``num_orders``."""
    return math.comb(num_orders + num_chunks - 1, num_chunks)


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
    search, fastest first; [] beyond :data:`MAX_CHUNKS`.

    The orders are all D! of them when that makes at most :data:`MAX_COMBINATIONS`
    multisets; otherwise (K = 3 on 4 dims: 2600) the :data:`POOL_ORDERS` orders of the
    best screened pairs: the proven optima at K = 3 on 4 dims are made of orders that also
    pair well (libra-4d at 1 GiB, and the generated networks checked: all three among the
    10 of the best pairs).
    """
    if not 2 <= num_chunks <= MAX_CHUNKS:
        return []
    orders = list(itertools.permutations(range(topology.num_dims)))
    if combinations(len(orders), num_chunks) > MAX_COMBINATIONS:
        if combinations(len(orders), 2) > MAX_COMBINATIONS:
            return []
        orders = _pool(topology, message_bytes, orders, options=options, log=log)
    sized = _sized(topology, message_bytes, orders, num_chunks, options=options, unit_s=unit_s, log=log)
    finished = [
        nested_descent(
            topology,
            message_bytes,
            swap_critical_pairs(topology, message_bytes, candidate, unit_s=unit_s, log=log),
            unit_s=unit_s,
            log=log,
        )
        for candidate in sized[:KEPT]
    ]
    return sorted(finished, key=lambda c: c.makespan_s)


def _screened(
    topology: Topology,
    message_bytes: int,
    orders: list[Order],
    num_chunks: int,
    *,
    options: SearchOptions,
    log: SearchLog,
) -> list[Candidate]:
    """Every multiset of ``num_chunks`` of ``orders`` with its best screened sequences at
    equal sizes (no LP: ``lp_makespan_s`` is None), fastest first, ties in enumeration
    order. Kept in ``log``: K = 2's pairs also choose the pool of K = 3."""
    key = ("screened", tuple(orders), num_chunks)
    if key not in log.enumerated:
        equal = np.full(num_chunks, message_bytes / num_chunks)
        screened: list[Candidate] = []
        for combo in itertools.combinations_with_replacement(orders, num_chunks):
            table = op_table(topology, combo, options.collective)
            durations = table.durations_s(equal)
            best: tuple[float, tuple[tuple[int, ...], ...]] | None = None
            for rule in RULES:
                sequences = list_schedule(table, durations, rule)
                if rule in NESTED_RULES:
                    sequences, makespan_s = nested_descent_timed(table, durations, sequences)
                else:
                    makespan_s = longest_path_s(table, durations, sequences)
                if best is None or makespan_s < best[0]:
                    best = (makespan_s, sequences)
            assert best is not None
            structure = Structure(
                orders=combo, sequences=best[1], source="enumerated", collective=options.collective
            )
            screened.append(
                Candidate(structure=structure, sizes_bytes=equal, makespan_s=best[0], lp_makespan_s=None)
            )
        log.enumerated[key] = sorted(screened, key=lambda c: c.makespan_s)
    return log.enumerated[key]


def _sized(
    topology: Topology,
    message_bytes: int,
    orders: list[Order],
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[Candidate]:
    """The :data:`SCREENED` best screened multisets, each sized by LP on its screened
    sequences and the list schedules of :data:`RULES`, then its nested sequences chosen
    again at those sizes (:func:`.local_search.nested_descent_timed`) and re-sized;
    fastest first."""
    key = ("sized", tuple(orders), num_chunks)
    if key not in log.enumerated:
        single_lp = replace(options, max_rounds=0)
        sized = []
        for screened in _screened(topology, message_bytes, orders, num_chunks, options=options, log=log)[
            :SCREENED
        ]:
            orders_of = screened.structure.orders
            table = op_table(topology, orders_of, options.collective)
            durations = table.durations_s(screened.sizes_bytes)
            first = [screened.structure.sequences, *(list_schedule(table, durations, r) for r in RULES)]
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
        log.enumerated[key] = sorted(sized, key=lambda c: c.makespan_s)
    return log.enumerated[key]


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
    for candidate in _screened(topology, message_bytes, orders, 2, options=options, log=log):
        for order in candidate.structure.orders:
            if order not in pool:
                pool.append(order)
        if len(pool) >= POOL_ORDERS:
            break
    return pool[:POOL_ORDERS]
