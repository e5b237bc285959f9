"""The *filler chunk*: a (K-1)-chunk plan plus one chunk that fills its start-up idle time.

The exact planner's proven optima at K = 4 are often not nested (rfs-3d, 16 MiB: three
chunks in order (0, 1, 2) run first in, first out on every dim, plus a 7% chunk in order
(1, 2, 0)). That small chunk enters dims 1 and 2 *before* the big chunks (which reach
them only after crossing dim 0) and leaves them last: it gives the dims the big chunks
reach late work while the pipeline fills and drains. No order family or list-scheduling
rule builds it (a list scheduler starts the big chunks' ops as soon as they are ready),
and the nested descent only nests.

So the search takes the best plan with one chunk fewer, keeps its orders and sequences,
and adds one chunk whose order is a rotation of a base chunk's order (the same path,
started on a dim that chunk reaches later). The new chunk's ops go first and last on
every dim but the one where its chain turns; there its ReduceScatter and AllGather (two
consecutive ops of its chain) go side by side, at each position of the base's sequence
in turn. The LP sizes every chunk, the new one included (or empties it: then it is
dropped and the plan is the base's). AllReduce only: a half chain visits each dim once,
so there is no first in, last out to fill with.

On the reference grid, moving the filler's ops off first-and-last on the other dims too
(a coordinate descent over every dim's positions) and trying every order, not only the
rotations, found nothing more at the proven instances and cost about three times the LPs.
"""

import itertools

import numpy as np

from hipipe.planners.hipipe.candidates import (
    Candidate,
    SearchLog,
    SearchOptions,
    better,
    candidate_for,
    drop_empty_chunks,
)
from hipipe.planners.hipipe.sequencing import Deadlock, longest_path_s
from hipipe.planners.hipipe.sizing import SizingModel
from hipipe.planners.hipipe.structure import Order, Structure
from hipipe.schedule import Collective
from hipipe.topology import Topology

Sequences = tuple[tuple[int, ...], ...]


def filler_orders(orders: tuple[Order, ...]) -> list[Order]:
    """The rotations of the base's orders other than the orders themselves, in first-seen
    order: a filler in one starts on a dim its base chunk reaches late, then follows it."""
    rotations: dict[Order, None] = {}
    for order in orders:
        for shift in range(1, len(order)):
            rotations[order[shift:] + order[:shift]] = None
    return list(rotations)


def filler_sequences(sequences: Sequences, filler: int, order: Order) -> list[Sequences]:
    """Every placement of chunk ``filler`` (in ``order``, AllReduce chain) into the base's
    ``sequences``: first and last on every dim but its turning dim, and there side by side
    at each position."""
    num_dims = len(order)
    chain_length = 2 * num_dims
    turn = order[-1]
    around: list[tuple[int, ...]] = []
    for dim, sequence in enumerate(sequences):
        level = order.index(dim)
        scatter = filler * chain_length + level
        gather = filler * chain_length + chain_length - 1 - level
        around.append((scatter, *sequence, gather))
    base = sequences[turn]
    scatter = filler * chain_length + num_dims - 1
    return [
        (*around[:turn], (*base[:i], scatter, scatter + 1, *base[i:]), *around[turn + 1 :])
        for i in range(len(base) + 1)
    ]


def add_filler(
    topology: Topology,
    message_bytes: int,
    base: Candidate,
    *,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """The best plan ``base`` plus one filler chunk (module docstring), empty chunks
    dropped; None when ``base`` is not an AllReduce plan with LP sizes or every placement
    deadlocks."""
    structure = base.structure
    if structure.collective is not Collective.ALL_REDUCE or base.lp_makespan_s is None:
        return None
    filler = structure.num_chunks
    best: Candidate | None = None
    for order in filler_orders(structure.orders):
        orders = (*structure.orders, order)
        model = SizingModel(
            topology, message_bytes, orders, collective=structure.collective, time_unit_s=unit_s
        )
        table = model.table
        uniform = table.durations_s(np.full(len(orders), message_bytes / len(orders)))
        for trial in filler_sequences(structure.sequences, filler, order):
            try:
                longest_path_s(table, uniform, trial)
            except Deadlock:
                continue
            sizing = model.solve(trial)  # same orders: a warm re-solve
            log.record(table.num_ops, sizing.iterations)
            candidate = Candidate(
                structure=Structure(
                    orders=orders, sequences=trial, source="filler", collective=structure.collective
                ),
                sizes_bytes=sizing.sizes_bytes,
                makespan_s=longest_path_s(table, table.durations_s(sizing.sizes_bytes), trial),
                lp_makespan_s=sizing.makespan_s,
            )
            if better(best, candidate):
                best = candidate
    if best is None:
        return None
    return drop_empty_chunks(topology, message_bytes, best, unit_s=unit_s, log=log)


ADDED_MAX_CHUNKS = 32
"""No chunk is added to a plan with this many chunks or more: the list-scheduled candidates
grow with K, and a plan that large has no start-up idle time left for one chunk to fill."""


def add_any_chunk(
    topology: Topology,
    message_bytes: int,
    base: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """The fastest of ``base``'s orders plus one chunk in each of the ``D!`` orders, every
    collective: list-scheduled, LP-sized and re-sequenced from scratch (:func:`candidate_for`),
    so the new chunk's ops go wherever the rules put them. None when none is faster than ``base``.

    The placements of :func:`add_filler` assume an AllReduce chain (first in, last out). A
    ReduceScatter or AllGather plan also has idle time to fill, on the dims that no chunk
    starts on: on libra-4d at 256 MiB (ReduceScatter) the exact planner's best 5-chunk plan
    is the search's 4-chunk one (0.8867 ms) plus a 2.5% chunk that starts on dim 3, where no
    other chunk starts (0.8721 ms; the search's own best was 0.8851 ms with 5 chunks).
    Re-sequencing everything rather than placing the chunk keeps the step small. Where the LP
    empties the new chunk, what is left is the base built again from scratch, and that too
    is sometimes faster than the base (on held-out networks by up to 1.2%, at K = 24).
    """
    structure = base.structure
    num_chunks = structure.num_chunks + 1
    if base.lp_makespan_s is None or num_chunks > ADDED_MAX_CHUNKS:
        return None
    best: Candidate | None = None
    for order in itertools.permutations(range(topology.num_dims)):
        candidate = candidate_for(
            topology,
            message_bytes,
            "added chunk",
            (*structure.orders, order),
            options=options,
            unit_s=unit_s,
            log=log,
        )
        if better(best, candidate):
            best = candidate
    return best if best is not None and better(base, best) else None
