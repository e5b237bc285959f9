"""What a schedule is expected to take on a real run: the full calibrated cost model.

The simulator (:mod:`hipipe.simulator`) times a schedule with the linear terms only,
exactly as the chunk-size LP does, and that timing is the schedule's ``makespan_s``.
Two measured effects are not linear, and both grow with the number of ops, so they are
what separates many-chunk schedules from few-chunk ones on a real network
(:mod:`hipipe.overheads`):

- *concurrency*: an op's time is stretched (by its busy curve's share, or by
  ``concurrency_slowdown``) for each other dimension that moves data on the rank at some
  time while it runs: busy at its start, or starting an op before it ends. Counting only
  the dims busy at the start missed the common pipelined case where a slow dim's op starts
  as the fast dim goes idle and the fast dim's short ops come and go during it (traced on
  4x2 at 25/200 Mbit/s, 64 KiB: those RS ops took 1.17x their curve, the AG ops that ran
  with the fast dim idle 0.99x);
- *jitter*: each member of an op's group arrives with an exponential delay of mean
  ``jitter_s`` and the op pays the latest of them; since a pipeline also waits for the
  later op at every hand-over, the expected makespan grows with the number of ops in
  parallel paths, not just with their sum.

A third, the *host's CPU*, bounds the whole run rather than one op: the ranks sharing a
host's cores cannot finish before the CPU work of all their ops is done
(:func:`cpu_bound_s`), so each replay's makespan is at least
that. On a host with cores to spare it never binds; on the 2-core testbed Themis'
64-chunk schedule keeps both cores busy and runs near it (the replay is usually above it:
under that load each op also costs more than the calibration's isolated runs).

Where the calibration measured streamed op times (``op_curves``), a single-dimension op
takes its curve's time at its size (plus the per-op cost) instead of its line's, and
the jitter is centred on it: the curve is already a mean over arrivals, so an op pays
the latest of its members' delays *minus that latest's mean*, which keeps the spread
and the waits at hand-overs without charging the mean twice.

:func:`predict` replays the schedule's own per-dimension sequences (what the executor
runs) event by event, ``samples`` times with a seeded generator, and reports the
median and the 10th/90th percentiles. With linear overheads only it returns the
simulator's makespan exactly, in one sample.
"""

import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hipipe.cost import group_size, op_time_s
from hipipe.errors import ScheduleError
from hipipe.schedule import Schedule
from hipipe.topology import Topology

DEFAULT_SAMPLES = 32
"""Replays per prediction: the median of 32 is within a few per mille of the median of
1024 on the testbed's calibrations, and a 256-op schedule replays 32 times in ~30 ms."""

DEFAULT_SEED = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """Expected makespan of one schedule under its topology's full cost model."""

    median_s: float
    low_s: float
    """10th percentile over the replays."""
    high_s: float
    """90th percentile over the replays."""
    deterministic_s: float
    """The schedule's own makespan: linear terms only (what the LP and the simulator charge)."""
    samples: int


def predict(schedule: Schedule, *, samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> Prediction:
    """Replay ``schedule`` under its topology's overheads; see the module docstring."""
    if samples < 1:
        raise ScheduleError(f"a prediction needs at least one sample, got {samples}")
    overheads = schedule.topology.overheads
    if overheads.is_linear:
        return Prediction(
            median_s=schedule.makespan_s,
            low_s=schedule.makespan_s,
            high_s=schedule.makespan_s,
            deterministic_s=schedule.makespan_s,
            samples=1,
        )
    rng = random.Random(seed)
    tables = _ReplayTables.of(schedule)  # the same for every sample: built once
    cpu_s = cpu_bound_s(schedule)
    makespans = sorted(
        max(cpu_s, max(_replay(schedule, tables, rng)[1], default=0.0))
        for _ in range(samples if overheads.jitter_s else 1)
    )
    return Prediction(
        median_s=statistics.median(makespans),
        low_s=_percentile(makespans, 0.1),
        high_s=_percentile(makespans, 0.9),
        deterministic_s=schedule.makespan_s,
        samples=len(makespans),
    )


def predicted_s(schedule: Schedule, *, samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> float:
    """The median of :func:`predict`: the number to compare with a measured median."""
    return predict(schedule, samples=samples, seed=seed).median_s


def cpu_bound_s(schedule: Schedule) -> float:
    """The host's CPU work for ``schedule`` over its CPUs: no run of it ends sooner.

    Every rank takes part in every op of the schedule (the ops of one dimension run in
    every group along it at once), so one rank's work is the sum of its ops' CPU, and the
    host's is ``host_ranks`` times that. 0 when the topology does not charge the CPU.
    """
    overheads = schedule.topology.overheads
    if not overheads.charges_cpu:
        return 0.0
    topology = schedule.topology
    per_rank_s = sum(overheads.op_cpu_s(group_size(topology, op.dims), op.full_bytes) for op in schedule.ops)
    return overheads.host_ranks * per_rank_s / overheads.host_cores


def latest_arrival_s(mean_s: float, members: int, uniform: float) -> float:
    """The latest of ``members`` exponential delays of mean ``mean_s``, by inverse CDF.

    The maximum of n such delays has CDF ``(1 - exp(-x / mean))^n``; ``uniform`` in [0, 1).
    """
    return -mean_s * math.log1p(-(uniform ** (1.0 / members)))


def latest_arrival_quantile(members: int, fraction: float) -> float:
    """Quantile ``fraction`` of the latest of ``members`` unit-mean exponential delays."""
    return latest_arrival_s(1.0, members, fraction)


def op_base_times_s(schedule: Schedule) -> Callable[[int, int], float]:
    """``(op index, other dims busy while it runs) -> its duration before jitter``, as a
    replay charges it. The calibration fits the jitter on what a traced run's ops took
    beyond this."""
    tables = _ReplayTables.of(schedule)
    return lambda index, others: tables.base_s(index, others, schedule.topology)


def other_dims_busy(schedule: Schedule, op_times_s: Sequence[tuple[float, float]], index: int) -> int:
    """How many dims other than op ``index``'s moved data at some time while it ran, in a run
    of ``schedule`` with these ``(start, end)`` op times: the ``others`` a replay charges it
    (ops that only touch it, one ending as the other starts, do not count)."""
    start_s, end_s = op_times_s[index]
    return sum(
        1
        for k, sequence in enumerate(schedule.sequences)
        if k not in schedule.ops[index].dims
        and any(op_times_s[j][0] < end_s and op_times_s[j][1] > start_s for j in sequence)
    )


def mean_op_duration_s(base_s: float, jitter_s: float, members: int, *, points: int = 256) -> float:
    """An op's mean duration in a replay: ``base_s`` (:func:`op_base_times_s`) plus the latest
    of its ``members``' arrival delays, floored at 0 as the replay floors it.

    This, not ``base_s``, is what a measured op time is compared with: on a measured curve
    ``base_s`` has the delays' mean taken out (the jitter adds it back), so it alone reads
    an op as slower than the model by that mean. By the midpoint rule over ``points``
    quantiles of the latest arrival (exact to a few per mille of ``jitter_s``).
    """
    if jitter_s <= 0:
        return max(0.0, base_s)
    return (
        sum(max(0.0, base_s + latest_arrival_s(jitter_s, members, (i + 0.5) / points)) for i in range(points))
        / points
    )


def _harmonic(members: int) -> float:
    """``1 + 1/2 + ... + 1/n``: the mean of the latest of ``n`` unit-mean exponential delays."""
    return sum(1.0 / i for i in range(1, members + 1))


def _percentile(sorted_values: list[float], fraction: float) -> float:
    position = fraction * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def replay_op_times_s(schedule: Schedule, rng: random.Random) -> tuple[list[float], list[float]]:
    """One replay of the fixed sequences: ``(starts, ends)`` per op, in seconds.

    Starts and ends are events taken in time order (ends first at one instant). An op's
    end is set when it starts, from the other dims busy then, and moved later whenever
    another dim starts an op before it: each op is charged for every other dim that moved
    data while it ran (:func:`other_dims_busy` on the replay's own times).
    """
    return _replay(schedule, _ReplayTables.of(schedule), rng)


@dataclass(frozen=True, kw_only=True, slots=True)
class _ReplayTables:
    """What every replay of one schedule shares: per-op durations and successors."""

    wire_s: list[float]
    """The bytes-over-the-wire part of each op."""
    fixed_s: list[float]
    """The rest: latency, per-op cost, local reduction (or, on a measured curve, the curve's
    time less the wire part and less the mean delay the jitter adds)."""
    busy_extra_s: list[float]
    """Per op, what it takes longer with every other dim busy (measured busy curves; else 0):
    with ``m`` of the ``D - 1`` others busy while it runs it pays ``m / (D - 1)`` of it."""
    group_npus: list[int]
    next_on_dim: list[list[int]]
    """Per op, the op after it in the sequence of each of its dims."""
    chain_next: list[int | None]
    waiting: list[int]
    """Per op, how many predecessors (one per dim, plus its chain's) must end first."""

    def base_s(self, index: int, others: int, topology: Topology) -> float:
        """Op ``index``'s duration before jitter when ``others`` other dims are busy while it runs."""
        busy_share = others / (topology.num_dims - 1) if topology.num_dims > 1 else 0.0
        return (self.fixed_s[index] + self.wire_s[index] + self.busy_extra_s[index] * busy_share) * (
            1 + topology.overheads.concurrency_slowdown * others
        )

    @classmethod
    def of(cls, schedule: Schedule) -> "_ReplayTables":
        topology = schedule.topology
        ops = schedule.ops
        wire_s = [
            op_time_s(topology, op.dims, op.full_bytes) - op_time_s(topology, op.dims, 0.0) for op in ops
        ]
        next_on_dim: list[list[int]] = [[] for _ in ops]
        for sequence in schedule.sequences:
            for before, after in itertools.pairwise(sequence):
                next_on_dim[before].append(after)
        chain_next: list[int | None] = [None] * len(ops)
        has_chain_prev = [False] * len(ops)
        for chunk in schedule.chunks:
            for earlier, later in itertools.pairwise(schedule.chunk_ops(chunk.index)):
                chain_next[earlier.index] = later.index
                has_chain_prev[later.index] = True
        overheads = topology.overheads
        fixed_s = [op_time_s(topology, op.dims, op.full_bytes, op.phase) - wire_s[op.index] for op in ops]
        busy_extra_s = [0.0] * len(ops)
        for op in ops:
            curve = overheads.curve(op.dims[0], op.phase.value) if len(op.dims) == 1 else None
            if curve is None:
                continue
            dims = op.dims

            def line_s(full_bytes: float, dims: tuple[int, ...] = dims) -> float:
                return op_time_s(topology, dims, full_bytes) - overheads.op_s

            alone_s = curve.time_s(op.full_bytes, line_s)
            mean_delay_s = overheads.jitter_s * _harmonic(group_size(topology, op.dims))
            fixed_s[op.index] = alone_s + overheads.op_s - wire_s[op.index] - mean_delay_s
            busy = overheads.curve(op.dims[0], op.phase.value, busy=True)
            if busy is not None:
                busy_extra_s[op.index] = max(0.0, busy.time_s(op.full_bytes, line_s) - alone_s)
        return cls(
            wire_s=wire_s,
            fixed_s=fixed_s,
            busy_extra_s=busy_extra_s,
            group_npus=[group_size(topology, op.dims) for op in ops],
            next_on_dim=next_on_dim,
            chain_next=chain_next,
            waiting=[len(op.dims) + has_chain_prev[op.index] for op in ops],
        )


def _replay(schedule: Schedule, tables: _ReplayTables, rng: random.Random) -> tuple[list[float], list[float]]:
    """Events in time order: an op starts once its predecessors ended, and its end moves
    later each time another dim starts moving data while it runs (:func:`replay_op_times_s`)."""
    topology = schedule.topology
    overheads = topology.overheads
    ops = schedule.ops
    waiting = list(tables.waiting)
    ready_s = [0.0] * len(ops)
    start_s = [math.nan] * len(ops)
    end_s = [math.nan] * len(ops)
    delay_s = [0.0] * len(ops)
    busy_dims: list[set[int]] = [set() for _ in ops]
    """Per op, the other dims that moved data at some time while it ran (so far)."""
    running: list[int | None] = [None] * topology.num_dims
    version = [0] * len(ops)
    events: list[tuple[float, int, int, int]] = []
    """``(time, 0 = an end | 1 = a start, op, version)``: ends before starts at one instant,
    so an op that starts as another ends does not count it; an end whose op was stretched
    since carries a stale version and is skipped."""

    def release(index: int, at_s: float) -> None:
        ready_s[index] = max(ready_s[index], at_s)
        waiting[index] -= 1
        if waiting[index] == 0:
            heapq.heappush(events, (ready_s[index], 1, index, 0))

    def schedule_end(index: int) -> None:
        duration_s = tables.base_s(index, len(busy_dims[index]), topology) + delay_s[index]
        end_s[index] = start_s[index] + max(0.0, duration_s)  # a centred delay never ends it early
        version[index] += 1
        heapq.heappush(events, (end_s[index], 0, index, version[index]))

    for sequence in schedule.sequences:
        if sequence:
            release(sequence[0], 0.0)
    done = 0
    while events:
        at_s, kind, index, seen = heapq.heappop(events)
        op = ops[index]
        if kind == 1:
            start_s[index] = at_s
            busy_dims[index] = {
                k for k, other in enumerate(running) if other is not None and k not in op.dims
            }
            if overheads.jitter_s:
                delay_s[index] = latest_arrival_s(overheads.jitter_s, tables.group_npus[index], rng.random())
            schedule_end(index)
            for other in {other for other in running if other is not None}:
                new = set(op.dims) - set(ops[other].dims) - busy_dims[other]
                if new:
                    busy_dims[other] |= new
                    schedule_end(other)
            for k in op.dims:
                running[k] = index
            continue
        if seen != version[index]:
            continue
        done += 1
        for k in op.dims:
            running[k] = None
        for after in tables.next_on_dim[index]:
            release(after, end_s[index])
        successor = tables.chain_next[index]
        if successor is not None:
            handoff_s = overheads.handoff_s if ops[successor].dims != op.dims else 0.0
            release(successor, end_s[index] + handoff_s)
    if done != len(ops):
        raise ScheduleError("the per-dimension sequences deadlock: they contradict the chunks' op order")
    return start_s, end_s
