"""Per-dimension op sequences from a list scheduler (the sequencing step of the search).

Given op durations (from the current chunk sizes), a non-delay list scheduler starts,
on every free dimension, the waiting op with the best priority; the order in which
each dimension started its ops is its sequence. Six rules, all cheap; the search tries
the two :data:`BASIC_RULES` on every structure and all six where LPs are cheap:

- ``fifo``: the op that became ready first (ties: lower chunk) -- what the pipelined
  baseline does, and what keeps chunks flowing in index order;
- ``tail``: the op whose chunk has the most work left (its remaining chain), the
  classic critical-path priority: long tails first, so nothing long starts last;
- ``ag-first``: AllGathers before ReduceScatters (drain before filling more; the same
  as ``fifo`` for ReduceScatter or AllGather alone, whose ops are all of one phase);
- ``shortest``: the shortest op first (Themis' smallest-chunk-first, by time);
- ``nested``: ReduceScatters first (in ready order), then AllGathers in the reverse of
  the order their chunks' ReduceScatters ran on that dim: the last chunk in is the
  first out. The proven optima of the exact planner have this shape on libra-3d and
  rfs-3d at K = 3 (every dim runs ``0R 1R 2R 2A 1A 0A`` for its own chunk order), which
  no other rule produces. For ReduceScatter or AllGather alone it is ``fifo``.
- ``nested-tail``: nested, but the ReduceScatters by ``tail`` priority, and strictly last
  in, first out: a dim whose last-in chunk's AG is not ready yet waits for it rather than
  run another chunk's AG (a delay on purpose; without it, on uniform sizes an AG that is
  ready early jumps the stack and the dim is no longer nested). The proven optima on
  rfs-3d at K = 3 are nested with the longest-tail chunk entering each dim first
  (d0 ``1R 0R 2R 2A 0A 1A``, d2 ``1R 2R 0R 0A 2A 1A``). If the stacks wait on each other
  the rest of the schedule is finished without them. For a half chain it is ``tail``.

This is a plain reimplementation rather than a call to the simulator because it runs
inside the search loop on bare arrays; the simulator times the final schedule.
"""

import heapq
from enum import StrEnum

import numpy as np

from hipipe.planners.hipipe.structure import OpTable


class Deadlock(Exception):
    """Fixed sequences contradict the chunks' chains: some dim waits on an op that can
    never run. Raised by :func:`longest_path_s`; the local search skips such moves."""


class Rule(StrEnum):
    FIFO = "fifo"
    TAIL = "tail"
    AG_FIRST = "ag-first"
    SHORTEST = "shortest"
    NESTED = "nested"
    NESTED_TAIL = "nested-tail"


NESTED_RULES: frozenset[Rule] = frozenset({Rule.NESTED, Rule.NESTED_TAIL})
"""The rules whose AllGathers leave each dim in the reverse of its ReduceScatters' order."""

BASIC_RULES: tuple[Rule, ...] = (Rule.FIFO, Rule.TAIL)
"""The rules tried on every structure; the others add diversity where LPs are cheap."""


def list_schedule(table: OpTable, durations_s: np.ndarray, rule: Rule) -> tuple[tuple[int, ...], ...]:
    """Sequences of a list schedule of the chunks' chains under ``rule`` (non-delay, but
    for ``nested-tail``, which waits for the last-in chunk's AG)."""
    chain_length = table.chain_length
    num_chunks = table.num_ops // chain_length if chain_length else 0
    dims = table.dim.tolist()
    gathers = table.gathers.tolist()
    durations = durations_s.tolist()
    nested = rule in NESTED_RULES and chain_length == 2 * table.num_dims  # AllReduce: both halves
    tails: list[float] = []
    if rule in (Rule.TAIL, Rule.NESTED_TAIL):
        # Remaining chain work from each op on (inclusive), per chunk.
        reshaped = durations_s.reshape(num_chunks, chain_length)
        tails = np.cumsum(reshaped[:, ::-1], axis=1)[:, ::-1].ravel().tolist()
    queues: list[list[tuple[float, float, int]]] = [[] for _ in range(table.num_dims)]
    sequences: list[list[int]] = [[] for _ in range(table.num_dims)]
    position = [0] * table.num_ops
    """Where each started op stands in its dim's sequence (the nested rule's memory)."""

    def enqueue(op: int, ready_s: float) -> None:
        tiebreak = ready_s
        if rule is Rule.TAIL:
            key = -tails[op]
        elif rule is Rule.AG_FIRST:
            # Finish what is half done (AG, the second half of a chain) before starting more.
            key = 0.0 if gathers[op] else 1.0
        elif rule is Rule.SHORTEST:
            key = durations[op]
        elif nested:
            key = 1.0 if gathers[op] else 0.0
            if gathers[op]:
                # The chunk's RS on this dim mirrors this AG in the chain: AG at step s, RS at L-1-s.
                step = op % chain_length
                tiebreak = -position[op - step + chain_length - 1 - step]
            elif rule is Rule.NESTED_TAIL:
                tiebreak = -tails[op]
        elif rule is Rule.NESTED_TAIL:  # a half chain: plain tail
            key = -tails[op]
        else:
            key = ready_s
        heapq.heappush(queues[dims[op]], (key, tiebreak, op))

    for j in range(num_chunks):
        enqueue(j * chain_length, 0.0)
    busy = [False] * table.num_dims
    open_chunks: list[list[int]] = [[] for _ in range(table.num_dims)]
    """Nested rules: per dim, the chunks whose RS ran there and whose AG has not (a stack)."""
    strict = nested and rule is Rule.NESTED_TAIL
    events: list[tuple[float, int]] = []
    now = 0.0
    while True:
        for k in range(table.num_dims):
            if busy[k] or not queues[k]:
                continue
            op = queues[k][0][2]
            stack = open_chunks[k]
            if strict and gathers[op] and stack and stack[-1] != op // chain_length:
                # Only the last chunk in may leave: wait for its AG (a delay, on purpose),
                # else the dim's RS and AG orders stop mirroring each other.
                continue
            heapq.heappop(queues[k])
            if nested:
                if gathers[op]:
                    stack.remove(op // chain_length)
                else:
                    stack.append(op // chain_length)
            busy[k] = True
            position[op] = len(sequences[k])
            sequences[k].append(op)
            heapq.heappush(events, (now + durations[op], op))
        if not events:
            if any(queues):
                strict = False  # the stacks wait on each other: finish without them
                continue
            break
        strict = nested and rule is Rule.NESTED_TAIL
        now = events[0][0]
        while events and events[0][0] == now:
            _, op = heapq.heappop(events)
            busy[dims[op]] = False
            if (op + 1) % chain_length:
                enqueue(op + 1, now)
    return tuple(tuple(s) for s in sequences)


def longest_path_s(table: OpTable, durations_s: np.ndarray, sequences: tuple[tuple[int, ...], ...]) -> float:
    """Makespan of fixed sequences: every op starts when its chain and dim predecessors end.

    Raises :class:`Deadlock` when the sequences contradict the chains.
    """
    return max(end_times_s(table, durations_s, sequences), default=0.0)


def end_times_s(
    table: OpTable, durations_s: np.ndarray, sequences: tuple[tuple[int, ...], ...]
) -> list[float]:
    """When each op of fixed sequences ends, every op as early as its chain and dim allow.

    Raises :class:`Deadlock` when the sequences contradict the chains.
    """
    chain_length = table.chain_length
    durations = durations_s.tolist()
    end = [0.0] * table.num_ops
    done = [False] * table.num_ops
    position = [0] * len(sequences)
    free = [0.0] * len(sequences)
    remaining = table.num_ops
    while remaining:
        progressed = False
        for k, sequence in enumerate(sequences):
            while position[k] < len(sequence):
                op = sequence[position[k]]
                step = op % chain_length
                if step and not done[op - 1]:
                    break
                start = max(free[k], end[op - 1] if step else 0.0)
                end[op] = free[k] = start + durations[op]
                done[op] = True
                position[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise Deadlock("sequences deadlock: they contradict the chunks' chains")
    return end


def mirrored_list_schedule(
    table: OpTable, durations_s: np.ndarray, rule: Rule
) -> tuple[tuple[int, ...], ...]:
    """A list schedule run backwards in time: of every chain reversed (its last op first),
    then each dim's sequence reversed.

    Time-reversing a schedule keeps it valid (a chain's ops still run in order, each dim
    one op at a time) and its makespan. An AllGather's chain is a ReduceScatter's read
    backwards, so forward list schedules, which start every chunk at once and leave the
    ends ragged, suit ReduceScatter and the mirrored ones AllGather: on a held-out 3-dim
    network (seed 7 #20, K = 2) the AllGather optimum's orders, listed forward, ranked too
    low to reach the sequence MIP (+5.3%), though the MIP solves them at once.
    """
    chain_length = table.chain_length
    if not chain_length:
        return tuple(() for _ in range(table.num_dims))
    ops = np.arange(table.num_ops)
    mirror = ops - ops % chain_length + (chain_length - 1 - ops % chain_length)
    backwards = OpTable(
        num_dims=table.num_dims,
        chain_length=chain_length,
        dim=table.dim[mirror],
        gathers=~table.gathers[mirror],
        chunk=table.chunk[mirror],
        constant_s=table.constant_s[mirror],
        per_chunk_byte_s=table.per_chunk_byte_s[mirror],
    )
    listed = list_schedule(backwards, durations_s[mirror], rule)
    return tuple(tuple(int(mirror[op]) for op in reversed(sequence)) for sequence in listed)
