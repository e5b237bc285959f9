"""Local search over chunk orders, for the few-chunk plans of latency-bound messages.

With few chunks every order matters, and the families (:mod:`.families`) only propose
a handful of layouts: on libra-3d at 256 MiB the best of all 6^4 order assignments for
four chunks is 10% faster than the best family. Trying them all is too slow, so this
climbs: change one chunk's order, re-sequence, re-size by LP, keep the change if the
makespan drops; until no single change helps or the budget is spent.
"""

import itertools
from dataclasses import replace

from hipipe.bounds import chunked_bound_s
from hipipe.planners.hipipe.candidates import (
    Candidate,
    SearchLog,
    SearchOptions,
    better,
    candidate_for,
)
from hipipe.topology import Topology

MAX_CHUNKS = 6
"""Only plans with at most this many chunks are climbed (each move costs a few LPs)."""

MAX_ORDERS = 24
"""Only networks with at most this many orders (D <= 4): the neighbourhood is K x D!."""

NEAR_FLOOR = 0.002
"""A plan within this of the chunked latency floor for its K is not climbed."""

BUDGET = 3000
"""LP work (op-LPs, see :data:`.candidates.LP_WORK_BUDGET`) the climb may spend..."""

TOTAL_BUDGET = 8000
"""...as long as the whole plan stays under this much (about 0.25 s on 2 cores)."""


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
    floor_s = chunked_bound_s(topology, message_bytes, start.structure.num_chunks)
    if start.makespan_s <= floor_s * (1 + NEAR_FLOOR):
        return start  # no order change can gain more than NEAR_FLOOR at this K
    quick = replace(options, max_rounds=1)
    stop_at = min(log.lp_work + BUDGET, TOTAL_BUDGET)
    best = start
    tried: set[tuple[tuple[int, ...], ...]] = {best.structure.orders}
    improved = True
    while improved:
        improved = False
        orders = best.structure.orders
        for j, order in itertools.product(range(len(orders)), orders_all):
            if log.lp_work >= stop_at:
                return best
            trial = (*orders[:j], order, *orders[j + 1 :])
            if trial in tried:
                continue
            tried.add(trial)
            candidate = candidate_for(
                topology, message_bytes, "climb", trial, options=quick, unit_s=unit_s, log=log
            )
            if better(best, candidate):
                best, improved = candidate, True
                break
    if best is not start:
        log.tried.append(
            {
                "num_chunks": start.structure.num_chunks,
                "kept_chunks": best.structure.num_chunks,
                "source": "climb",
                "makespan_s": best.makespan_s,
            }
        )
    return best
