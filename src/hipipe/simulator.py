"""A discrete-event simulator of schedules under the alpha-beta cost model.

Each dimension runs one op at a time; ops on different dimensions run concurrently;
an op starts only once the previous op of its chunk has ended (plus the topology's
calibrated hand-off delay when the chunk changes dimension; :mod:`hipipe.overheads`).
The linear overheads are charged here exactly, as the chunk-size LP charges them; the
non-linear ones (concurrency, jitter) only by :mod:`hipipe.predict`. What a free dimension
runs next is decided by a queue policy:

- ``fifo``:  the op that became ready first (ties: lower chunk, then earlier step);
- ``scf``:   smallest chunk first: the op with the fewest bytes (ties: as fifo);
- ``astra-scf``: ASTRA-sim's smallest-first ready list, as Themis runs in it: a newly
  ready op is inserted before the first waiting op at least as wide as itself (so among
  equal sizes the newest goes first), except the op with exactly one op left after it in
  its chain, which goes to the back; at time 0 the first ops queue in chunk order;
- ``fixed``: the schedule's own per-dimension sequence, in order.

State is explicit (one :class:`_Run` per call), the event heap is ordered by
``(time, seq)`` and every tie is broken by op index, so results are deterministic.
"""

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hipipe.cost import op_time_s
from hipipe.errors import ScheduleError
from hipipe.schedule import Chunk, Collective, DimGroup, Op, Phase, Schedule, chain
from hipipe.topology import Topology


class Policy(StrEnum):
    FIFO = "fifo"
    SCF = "scf"
    ASTRA_SCF = "astra-scf"
    FIXED = "fixed"


@dataclass(frozen=True, kw_only=True, slots=True)
class _UntimedOp:
    index: int
    chunk: int
    step: int
    phase: Phase
    dims: DimGroup
    input_bytes: float
    output_bytes: float
    duration_s: float


def _untimed_ops(topology: Topology, chunks: Sequence[Chunk], collective: Collective) -> list[_UntimedOp]:
    """Every chunk's ops with their durations. Equal chunks repeat the same (group, wide
    side, phase) many times (64 chunks: a few distinct ops), so each duration is computed
    once per call: the same function on the same arguments, the same floats; the four
    baselines the planner simulates as seeds take about 10% less time."""
    ops: list[_UntimedOp] = []
    durations_s: dict[tuple[DimGroup, float, Phase], float] = {}
    for chunk in chunks:
        for step, (phase, dims, input_bytes, output_bytes) in enumerate(chain(topology, chunk, collective)):
            full_bytes = max(input_bytes, output_bytes)
            key = (dims, full_bytes, phase)
            if key not in durations_s:
                durations_s[key] = op_time_s(topology, dims, full_bytes, phase)
            ops.append(
                _UntimedOp(
                    index=len(ops),
                    chunk=chunk.index,
                    step=step,
                    phase=phase,
                    dims=dims,
                    input_bytes=input_bytes,
                    output_bytes=output_bytes,
                    duration_s=durations_s[key],
                )
            )
    return ops


@dataclass(kw_only=True)
class _Run:
    """Mutable state of one simulation."""

    ops: list[_UntimedOp]
    num_dims: int
    handoff_s: float = 0.0
    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    sequences: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start_s = [float("nan")] * len(self.ops)
        self.end_s = [float("nan")] * len(self.ops)
        self.sequences = [[] for _ in range(self.num_dims)]


def simulate_chunks(
    topology: Topology,
    message_bytes: int,
    chunks: Sequence[Chunk],
    *,
    policy: Policy | str = Policy.FIFO,
    sequences: Sequence[Sequence[int]] | None = None,
    planner: str = "custom",
    info: dict | None = None,
    collective: Collective | str = Collective.ALL_REDUCE,
) -> Schedule:
    """Time the chunks' ops and return the resulting :class:`Schedule`.

    ``sequences`` (per dimension, op indices) is required for ``fixed`` and ignored otherwise.
    """
    policy = Policy(policy)
    collective = Collective.parse(collective)
    ops = _untimed_ops(topology, chunks, collective)
    run = _Run(ops=ops, num_dims=topology.num_dims, handoff_s=topology.overheads.handoff_s)
    if policy is Policy.FIXED:
        if sequences is None:
            raise ScheduleError("the fixed policy needs per-dimension sequences")
        _run_fixed(run, [list(s) for s in sequences])
    else:
        _run_queued(run, policy)
    timed = tuple(
        Op(
            index=u.index,
            chunk=u.chunk,
            step=u.step,
            phase=u.phase,
            dims=u.dims,
            input_bytes=u.input_bytes,
            output_bytes=u.output_bytes,
            start_s=run.start_s[u.index],
            end_s=run.end_s[u.index],
        )
        for u in ops
    )
    return Schedule(
        topology=topology,
        message_bytes=message_bytes,
        planner=planner,
        chunks=tuple(chunks),
        ops=timed,
        sequences=tuple(tuple(s) for s in run.sequences),
        makespan_s=max((o.end_s for o in timed), default=0.0),
        collective=collective,
        info=dict(info or {}),
    )


def simulate(schedule: Schedule, *, policy: Policy | str = Policy.FIXED) -> Schedule:
    """Replay a schedule's chunks; ``fixed`` keeps its sequences, fifo/scf re-queue them."""
    return simulate_chunks(
        schedule.topology,
        schedule.message_bytes,
        schedule.chunks,
        policy=policy,
        sequences=schedule.sequences,
        planner=schedule.planner,
        info=dict(schedule.info),
        collective=schedule.collective,
    )


class _HeapQueue:
    """One dim's waiting ops ordered by a key: ``fifo`` and ``scf``."""

    def __init__(self, ops: list[_UntimedOp], policy: Policy) -> None:
        self._ops = ops
        self._smallest_first = policy is Policy.SCF
        self._heap: list[tuple[tuple[float, ...], int]] = []

    def push(self, index: int, ready_s: float, *, initial: bool) -> None:
        del initial  # the key alone decides
        u = self._ops[index]
        fifo_key: tuple[float, ...] = (ready_s, u.chunk, u.step)
        key = (max(u.input_bytes, u.output_bytes), *fifo_key) if self._smallest_first else fifo_key
        heapq.heappush(self._heap, (key, index))

    def peek(self) -> int | None:
        return self._heap[0][1] if self._heap else None

    def pop(self) -> None:
        heapq.heappop(self._heap)


class _AstraQueue:
    """One dim's ready list as ASTRA-sim's ``SmallestFirst`` insertion keeps it (``astra-scf``)."""

    def __init__(self, ops: list[_UntimedOp], chain_end: dict[int, int]) -> None:
        self._ops = ops
        self._chain_end = chain_end
        self._waiting: list[int] = []

    def push(self, index: int, ready_s: float, *, initial: bool) -> None:
        del ready_s  # position, not time, orders this list
        u = self._ops[index]
        if initial or u.step == self._chain_end[u.chunk] - 1:
            self._waiting.append(index)  # time 0 in chunk order; one op left after it: the back
            return
        size = max(u.input_bytes, u.output_bytes)
        for position, other in enumerate(self._waiting):
            o = self._ops[other]
            if max(o.input_bytes, o.output_bytes) >= size:
                self._waiting.insert(position, index)
                return
        self._waiting.append(index)

    def peek(self) -> int | None:
        return self._waiting[0] if self._waiting else None

    def pop(self) -> None:
        self._waiting.pop(0)


def _handoff_s(ops: list[_UntimedOp], index: int, handoff_s: float) -> float:
    """Delay before op ``index`` may start after its chain predecessor ends.

    Only a change of dimension hands the chunk to another dimension's worker; the
    RS-to-AG turn on the same dimension stays with the same one and pays nothing.
    """
    if handoff_s == 0 or ops[index].step == 0:
        return 0.0
    return handoff_s if ops[index].dims != ops[index - 1].dims else 0.0


def _run_queued(run: _Run, policy: Policy) -> None:
    """Event loop: at each time, retire ending ops, then give every free dimension work."""
    ops = run.ops
    first_op = [u.index for u in ops if u.step == 0]
    last_step = {u.chunk: u.step for u in ops}
    queues: list[_HeapQueue | _AstraQueue] = [
        _AstraQueue(ops, last_step) if policy is Policy.ASTRA_SCF else _HeapQueue(ops, policy)
        for _ in range(run.num_dims)
    ]
    busy = [False] * run.num_dims
    events: list[tuple[float, int, int]] = []  # (time, seq, op index): op ends and hand-offs
    handed_over: set[int] = set()  # ops whose pending event is the end of their hand-off
    seq = 0

    def enqueue(index: int, ready_s: float, *, initial: bool = False) -> None:
        for k in ops[index].dims:
            queues[k].push(index, ready_s, initial=initial)

    for index in first_op:
        enqueue(index, 0.0, initial=True)
    now = 0.0
    started = [False] * len(ops)
    while True:
        # Dispatch: each free dimension takes its best waiting op (all of its dims must be free).
        for k in range(run.num_dims):
            queue = queues[k]
            while (head := queue.peek()) is not None and started[head]:
                queue.pop()  # a multi-dim op another of its dims already started
            if busy[k] or head is None:
                continue
            index = head
            dims = ops[index].dims
            if any(busy[d] for d in dims):
                continue
            queue.pop()
            started[index] = True
            run.start_s[index] = now
            run.end_s[index] = now + ops[index].duration_s
            for d in dims:
                busy[d] = True
                run.sequences[d].append(index)
            heapq.heappush(events, (run.end_s[index], seq, index))
            seq += 1
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, index = heapq.heappop(events)
            if index in handed_over:
                handed_over.discard(index)
                enqueue(index, now)  # its hand-off delay is over
                continue
            for d in ops[index].dims:
                busy[d] = False
            if ops[index].step < last_step[ops[index].chunk]:
                handoff_s = _handoff_s(ops, index + 1, run.handoff_s)
                if handoff_s > 0:
                    handed_over.add(index + 1)
                    heapq.heappush(events, (now + handoff_s, seq, index + 1))
                    seq += 1
                else:
                    enqueue(index + 1, now)
    if not all(started):
        raise AssertionError("simulator finished with ops that never ran")


def _run_fixed(run: _Run, sequences: list[list[int]]) -> None:
    """Each dimension runs its sequence in order; an op waits for its chain predecessor.

    The chain and sequence orders form a DAG; ops are timed in topological order
    (Kahn's algorithm), so the cost is linear in the number of ops. Ops left over when no
    op is ready mean the sequences contradict the chains: a deadlock.
    """
    ops = run.ops
    if len(sequences) != run.num_dims:
        raise ScheduleError(f"{len(sequences)} sequences for {run.num_dims} dimensions")
    expected: list[list[int]] = [[] for _ in range(run.num_dims)]
    for u in ops:
        for k in u.dims:
            expected[k].append(u.index)
    for k in range(run.num_dims):
        if sorted(sequences[k]) != expected[k]:
            raise ScheduleError(f"dimension {k}'s sequence does not list exactly the ops on dimension {k}")
    successors: list[list[int]] = [[] for _ in ops]
    waiting_on = [0] * len(ops)
    for u in ops:
        if u.step > 0:
            successors[u.index - 1].append(u.index)
            waiting_on[u.index] += 1
    for seq in sequences:
        for before, after in itertools.pairwise(seq):
            successors[before].append(after)
            waiting_on[after] += 1
    ready_s = [0.0] * len(ops)
    ready = deque(i for i in range(len(ops)) if waiting_on[i] == 0)
    timed = 0
    while ready:
        index = ready.popleft()
        run.start_s[index] = ready_s[index]
        run.end_s[index] = ready_s[index] + ops[index].duration_s
        timed += 1
        for after in successors[index]:
            delay_s = _handoff_s(ops, after, run.handoff_s) if after == index + 1 and ops[after].step else 0.0
            ready_s[after] = max(ready_s[after], run.end_s[index] + delay_s)
            waiting_on[after] -= 1
            if waiting_on[after] == 0:
                ready.append(after)
    if timed != len(ops):
        raise ScheduleError("the per-dimension sequences deadlock: they contradict the chunks' op order")
    run.sequences = [list(seq) for seq in sequences]
