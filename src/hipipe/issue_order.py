"""One global order in which every rank issues a schedule's ops (for NCCL-style backends).

NCCL may deadlock when operations on several communicators are in flight at once and
the ranks enqueued them in different orders: each rank's GPU can then wait in a
different communicator for a peer that waits in another. A single host thread per rank
that enqueues every op in one order shared by all ranks rules that out. This module
derives that order from the schedule alone, so that every rank holding the same
schedule computes the same order, with no communication and no torch.

The order is a topological order of the ops' precedence graph: an op follows its
chunk's previous op (chain order) and the previous op of every dim in whose sequence
it sits (sequence order). Among the ops that are ready, the one planned to start first
goes first, ties broken by op index, so the issue order follows the plan's timeline.
"""

import heapq
import itertools
from collections.abc import Iterator

from hipipe.errors import ScheduleError
from hipipe.schedule import Schedule


def predecessors(schedule: Schedule) -> list[set[int]]:
    """For each op, the ops that must be issued before it (chain and sequence order)."""
    before: list[set[int]] = [set() for _ in schedule.ops]
    for op in schedule.ops:
        if op.step > 0:
            before[op.index].add(op.index - 1)
    for sequence in schedule.sequences:
        for earlier, later in itertools.pairwise(sequence):
            before[later].add(earlier)
    return before


def issue_order(schedule: Schedule) -> tuple[int, ...]:
    """Every op index once, each after all its :func:`predecessors`; ready ops by (start, index).

    Raises :class:`ScheduleError` if the sequences contradict the chains (a cycle), as
    such a schedule would deadlock whatever the issue order.
    """
    before = predecessors(schedule)
    after: list[list[int]] = [[] for _ in schedule.ops]
    for index, earlier in enumerate(before):
        for e in earlier:
            after[e].append(index)
    missing = [len(earlier) for earlier in before]
    ready = [(op.start_s, op.index) for op in schedule.ops if not missing[op.index]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, index = heapq.heappop(ready)
        order.append(index)
        for later in after[index]:
            missing[later] -= 1
            if not missing[later]:
                heapq.heappush(ready, (schedule.ops[later].start_s, later))
    if len(order) != len(schedule.ops):
        stuck = min(i for i, m in enumerate(missing) if m)
        raise ScheduleError(
            f"op {stuck} can never be issued: the dimension sequences contradict the chunk chains"
            " (the schedule would deadlock)"
        )
    return tuple(order)


def violations(schedule: Schedule, order: tuple[int, ...]) -> Iterator[str]:
    """Why ``order`` is not a valid issue order of ``schedule`` (nothing if it is)."""
    if sorted(order) != list(range(len(schedule.ops))):
        yield "the order is not a permutation of the ops"
        return
    position = {index: at for at, index in enumerate(order)}
    for index, earlier in enumerate(predecessors(schedule)):
        for e in sorted(earlier):
            if position[e] > position[index]:
                yield f"op {index} is issued before op {e}, which must precede it"
