"""Every assignment of orders to a few chunks, where there are few enough to try them all.

On generated networks the exact planner found hipipe up to 5.8% behind the proven
optimum at K = 2 and 3 (a 4-dim network at 64 MiB, K = 2: hipipe 0.2423 ms with one order
twice, the optimum 0.2341 ms with two different orders). The climb (:mod:`.local_search`)
changes one chunk's order at a time and judges each change by list-scheduled sequences,
and those optima were two changes away, through plans that look worse before their
sequences are nested. Chunks are interchangeable, so the candidates are the multisets of
K orders: 300 pairs on 4 dims, 56 triples on 3 dims, and on 4 dims triples of the orders
that make the best pairs. Each is list-scheduled (the nested and the basic rules) and sized
by one LP, and the fastest few go through the binding-pair swaps and the nested descent;
the search then re-solves their sequences by MIP (:mod:`.sequence_mip`).
"""

import itertools
import math
from dataclasses import replace

from hipipe.planners.hipipe.candidates import Candidate, SearchLog, SearchOptions, candidate_for
from hipipe.planners.hipipe.local_search import nested_descent, swap_critical_pairs
from hipipe.planners.hipipe.sequencing import Rule
from hipipe.planners.hipipe.structure import Order
from hipipe.topology import Topology

MAX_COMBINATIONS = 300
"""Enumerate only when there are at most this many order multisets (one LP each, about
1 s for 300 on a 2-core host)..."""

MAX_CHUNKS = 3
"""...and at most this many chunks: K = 4 on 3 dims (126 multisets, then a MIP per kept
one) took plan time from 1-2 s to 5-7 s and moved none of the generated networks."""

KEPT = 4
"""The fastest multisets that go on to the local search (on the generated networks the
optimum's multiset ranked at most 4th before its sequences were nested and re-solved)."""

POOL_ORDERS = 8
"""Orders pooled from the best pairs where all multisets would be too many (120 multisets
of 3 out of 8)."""

RULES: tuple[Rule, ...] = (Rule.NESTED, Rule.FIFO)
"""Nested first (the proven optima at K <= 4 are mostly nested on every dim) and FIFO: on
the generated networks the four climb rules found nothing these two did not, at twice the LPs."""


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
    fastest pairs (K = 2, every pair): the proven optima at K = 3 on 4 dims are made of
    orders that also pair well (libra-4d at 1 GiB: all three among the 8 of the best pairs).
    """
    if not 2 <= num_chunks <= MAX_CHUNKS:
        return []
    orders = list(itertools.permutations(range(topology.num_dims)))
    if combinations(len(orders), num_chunks) > MAX_COMBINATIONS:
        if combinations(len(orders), 2) > MAX_COMBINATIONS:
            return []
        orders = _pool(topology, message_bytes, orders, options=options, unit_s=unit_s, log=log)
    scored = _scored(topology, message_bytes, orders, num_chunks, options=options, unit_s=unit_s, log=log)
    finished = [
        nested_descent(
            topology,
            message_bytes,
            swap_critical_pairs(topology, message_bytes, candidate, unit_s=unit_s, log=log),
            unit_s=unit_s,
            log=log,
        )
        for candidate in scored[:KEPT]
    ]
    return sorted(finished, key=lambda c: c.makespan_s)


def _scored(
    topology: Topology,
    message_bytes: int,
    orders: list[Order],
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[Candidate]:
    """Every multiset of ``num_chunks`` of ``orders``, list-scheduled and sized by one LP,
    fastest first (ties in enumeration order). Pairs are kept in ``log`` for the pool."""
    key = (tuple(orders), num_chunks)
    if key not in log.enumerated:
        single_lp = replace(options, max_rounds=0)
        scored = [
            candidate_for(
                topology,
                message_bytes,
                "enumerated",
                combo,
                options=single_lp,
                unit_s=unit_s,
                log=log,
                rules=RULES,
            )
            for combo in itertools.combinations_with_replacement(orders, num_chunks)
        ]
        log.enumerated[key] = sorted(scored, key=lambda c: c.makespan_s)
    return log.enumerated[key]


def _pool(
    topology: Topology,
    message_bytes: int,
    orders: list[Order],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> list[Order]:
    """The first :data:`POOL_ORDERS` distinct orders of the fastest pairs."""
    pool: list[Order] = []
    for candidate in _scored(topology, message_bytes, orders, 2, options=options, unit_s=unit_s, log=log):
        for order in candidate.structure.orders:
            if order not in pool:
                pool.append(order)
        if len(pool) >= POOL_ORDERS:
            break
    return pool[:POOL_ORDERS]
