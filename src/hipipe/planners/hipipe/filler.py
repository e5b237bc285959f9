"""The *filler chunk*: a (K-1)-chunk plan plus one chunk that fills its start-up idle time.

The exact planner's proven optima at K = 4 are often not nested (rfs-3d, 16 MiB: three
chunks in order (0, 1, 2) run first in, first out on every dim, plus a 7% chunk in order
(1, 2, 0)). That small chunk enters its first dims *before* the big ones (which reach
those dims only after crossing dim 0) and leaves them last: it gives dims 1 and 2 work
while the pipeline fills and drains. No order family or list-scheduling rule builds it
(a list scheduler starts the big chunks' ops as soon as they are ready), and the nested
descent only nests.

So the search takes the best plan with one chunk fewer, keeps its orders and sequences,
and adds one chunk in each order in turn. The new chunk's ops go:

- on its first dim: its ReduceScatter first, its AllGather last (it fills and drains);
- on each other dim: either the same (first and last), or its ReduceScatter and AllGather
  side by side at some position of the base sequence (on the dim where its chain turns,
  they are consecutive ops of the chain anyway).

The placements are chosen by coordinate descent over the dims (each trial an LP on the
same orders: a warm re-solve), and the LP sizes every chunk, the new one included (or
empties it: then it is dropped and the plan is the base's). AllReduce only: a half chain
visits each dim once, so there is no first-in, last-out to fill with.
"""

import itertools

import numpy as np

from hipipe.planners.hipipe.candidates import Candidate, SearchLog, better, drop_empty_chunks
from hipipe.planners.hipipe.sequencing import Deadlock, longest_path_s
from hipipe.planners.hipipe.sizing import SizingModel
from hipipe.planners.hipipe.structure import Order, Structure
from hipipe.schedule import Collective
from hipipe.topology import Topology

FILLER_PASSES = 3
"""Passes of the coordinate descent over the dims, per filler order; on the reference grid
the placements settle in two."""

Sequences = tuple[tuple[int, ...], ...]


def placements(
    base: tuple[int, ...], scatter: int, gather: int, *, first: bool, turn: bool
) -> list[tuple[int, ...]]:
    """The sequences one dim may run with the filler's ReduceScatter ``scatter`` and AllGather
    ``gather`` added to ``base``: around it (first and last; not on the dim where the chain
    turns, which would hold the dim for the whole plan), or, off its first dim, side by side
    at each position of ``base``."""
    around = [] if turn else [(scatter, *base, gather)]
    if first:
        return around
    side_by_side = [(*base[:i], scatter, gather, *base[i:]) for i in range(len(base) + 1)]
    return around + side_by_side


def add_filler(
    topology: Topology,
    message_bytes: int,
    base: Candidate,
    *,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """The best plan ``base`` plus one filler chunk (module docstring) finds, empty chunks
    dropped; None when ``base`` is not an AllReduce plan with LP sizes."""
    structure = base.structure
    if structure.collective is not Collective.ALL_REDUCE or base.lp_makespan_s is None:
        return None
    best: Candidate | None = None
    for order in itertools.permutations(range(topology.num_dims)):
        candidate = _best_placement(topology, message_bytes, structure, order, unit_s=unit_s, log=log)
        if candidate is not None and better(best, candidate):
            best = candidate
    if best is None:
        return None
    return drop_empty_chunks(topology, message_bytes, best, unit_s=unit_s, log=log)


def _best_placement(
    topology: Topology,
    message_bytes: int,
    structure: Structure,
    order: Order,
    *,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """The filler in ``order`` added to ``structure``, its placement on each dim by
    coordinate descent (None if every placement deadlocks)."""
    num_dims = topology.num_dims
    orders = (*structure.orders, order)
    filler = len(structure.orders)
    chain_length = 2 * num_dims
    choices: list[list[tuple[int, ...]]] = []
    for dim, sequence in enumerate(structure.sequences):
        level = order.index(dim)
        scatter = filler * chain_length + level
        gather = filler * chain_length + chain_length - 1 - level
        choices.append(placements(sequence, scatter, gather, first=level == 0, turn=level == num_dims - 1))
    model = SizingModel(topology, message_bytes, orders, collective=structure.collective, time_unit_s=unit_s)
    table = model.table
    uniform = table.durations_s(np.full(len(orders), message_bytes / len(orders)))
    best: Candidate | None = None
    current: Sequences = tuple(options[0] for options in choices)
    tried: set[Sequences] = set()
    for _ in range(FILLER_PASSES):
        improved = False
        for dim, options in enumerate(choices):
            for sequence in options:
                trial = (*current[:dim], sequence, *current[dim + 1 :])
                if trial in tried:
                    continue
                tried.add(trial)
                try:
                    longest_path_s(table, uniform, trial)
                except Deadlock:
                    continue
                sizing = model.solve(trial)
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
                    best, improved = candidate, True
            if best is not None:
                current = best.structure.sequences
        if not improved:
            break
    return best
