"""Calibration, rank side: time ring RS/AG per dimension and the overhead schedule (torch).

For each dimension k, every group along k runs the executor's ring ReduceScatter and
AllGather at the same time (as in a real schedule) at several sizes; each sample is the
slowest rank's time (:mod:`hipipe.torch.timing`). The fit lives in
:mod:`hipipe.testbed.fit` (pure, torch-free, run by the parent).

Called on every rank of an initialized world: by the testbed worker, and under
torchrun by ``hipipe calibrate --shape`` (:func:`calibrate_in_process`).
"""

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.hostcpu import busy_cpu_s, reading_cpu, timed_readings
from hipipe.repeats import RepeatRule
from hipipe.schedule import Schedule
from hipipe.testbed.fit import (
    DEFAULT_CALIBRATION_SIZES_BYTES,
    OverheadRun,
    Sample,
    fit_all,
    overhead_schedule,
)
from hipipe.testbed.layout import TestbedError
from hipipe.torch.collectives import ring_all_gather, ring_reduce_scatter
from hipipe.torch.executor import HierarchicalAllReduce
from hipipe.torch.groups import rings_for_layout
from hipipe.torch.timing import slowest_rank_s, timed_runs


def measure_in_process(
    sizes: Sequence[int],
    groups: Sequence[Any],
    *,
    sizes_bytes: Sequence[int] = DEFAULT_CALIBRATION_SIZES_BYTES,
    repeats: int = 2,
    timeout_s: float = 120.0,
    concurrent_window_s: float = 0.0,
) -> list[Sample]:
    """Time ring RS and AG on each dimension; call on every rank of an initialized world.

    ``groups`` are the per-dimension process groups (:func:`hipipe.torch.groups.dimension_groups`).
    Every sample is the maximum over ranks (the op ends when its slowest rank ends) of a
    *streamed* run: ops back to back on the ring, as a schedule runs them on a dimension,
    timed together and divided by their number. On a shared host a lone op and a
    streamed one differ (docs/MODEL.md section 10), and schedules stream. Each isolated
    sample also carries the host's busy CPU seconds per op over the same run (the
    most any rank's host spent; :mod:`hipipe.hostcpu`), from which the host term is fitted,
    and each concurrent one the CPUs the host kept busy meanwhile (every dim busy on every
    rank: the most a schedule can load it).

    With ``concurrent_window_s > 0`` a second pass times every dimension *while the
    others are busy too*, as in a pipelined schedule: each dimension repeats its op for
    about that long, in its own thread. Those samples are marked ``concurrent``; the
    lines are fitted on the isolated ones and the concurrency slowdown on the difference
    (:func:`hipipe.testbed.fit.fit_concurrency_slowdown`).
    """
    rings = [rings_for_layout(sizes, list(groups))[(k,)] for k in range(len(sizes))]
    samples: list[Sample] = []
    for dim, ring in enumerate(rings):
        for size_bytes in sizes_bytes:
            # One untimed op (the first also opens the connections) whose time sets how
            # many ops the timed runs stream: about STREAM_WINDOW_S each.
            dist.barrier()
            probe_s = max(slowest_rank_s(_time_rs_ag(ring, size_bytes, 1, timeout_s)[:2]))
            count = streamed_ops(probe_s)
            for _ in range(repeats):
                dist.barrier()
                times = slowest_rank_s(_time_rs_ag(ring, size_bytes, count, timeout_s))
                samples += _samples(dim, size_bytes, times[:2], streamed_ops=count, host_cpu_s=times[2:])
    if concurrent_window_s <= 0 or len(sizes) < 2:
        return samples
    fits = fit_all(sizes, samples)  # identical on every rank: the samples are maxima over ranks
    concurrent: list[Sample] = []
    for size_bytes in sizes_bytes:
        for _ in range(repeats):
            counts = [
                max(1, min(64, math.ceil(concurrent_window_s / (2 * fit.predict_s(size_bytes)))))
                for fit in fits
            ]
            dist.barrier()
            c0, t0 = _host_busy_s(), time.perf_counter()
            local = _concurrently(rings, size_bytes, counts, timeout_s)
            t1, c1 = time.perf_counter(), _host_busy_s()
            # The fewest busy CPUs any rank saw (its window the widest, holding all the work;
            # the first rank to finish saw others' CPU in a shorter one): max of the negation.
            readable = min(c0, c1) >= 0 and t1 > t0
            per_dim = slowest_rank_s([*local, -(c1 - c0) / (t1 - t0) if readable else -UNREADABLE])
            for dim in range(len(sizes)):
                rs_s, ag_s = per_dim[2 * dim : 2 * dim + 2]
                concurrent += _samples(
                    dim,
                    size_bytes,
                    (rs_s, ag_s),
                    concurrent=True,
                    streamed_ops=counts[dim],
                    host_busy_cores=-per_dim[-1] if per_dim[-1] > -UNREADABLE else -1.0,
                )
    return samples + concurrent


UNREADABLE = 1e18
"""Minus what a rank reports for busy CPUs when it cannot read the host's CPU time: never the most."""

STREAM_WINDOW_S = 0.25
"""About how long each timed calibration run streams ops for."""

MAX_STREAMED_OPS = 16


def streamed_ops(probe_s: float) -> int:
    """Ops per timed run: about :data:`STREAM_WINDOW_S` of them, 1 to :data:`MAX_STREAMED_OPS`.

    ``probe_s`` is one RS plus one AG, the slowest rank's (the same on every rank, so all
    agree on the count).
    """
    return max(1, min(MAX_STREAMED_OPS, math.ceil(STREAM_WINDOW_S / max(probe_s / 2, 1e-9))))


def measure_overhead_in_process(
    schedule: Schedule, groups: Sequence[Any], *, repeats: int | RepeatRule, timeout_s: float
) -> tuple[list[float], tuple[tuple[float, float], ...], tuple[float, ...]]:
    """Run the overhead schedule with the executor: one warm-up, the slowest rank's time per
    repeat, then one traced run: ``(times, this rank's (start_s, end_s) per op, the host's
    busy CPU seconds per timed repeat)`` (the CPU is rank 0's read, empty on other ranks
    and where the host cannot be read).

    ``schedule`` was planned once (by the parent, or by rank 0 under torchrun) and handed
    to every rank; the executor checks that all ranks hold the same one.
    """
    executor = HierarchicalAllReduce(None, schedule, groups=list(groups), timeout_s=timeout_s)
    tensor = torch.zeros(schedule.message_bytes // 4, dtype=torch.float32)
    readings: list[float | None] = []

    def bare() -> object:
        return executor.run(tensor)

    # Only rank 0 reads the host's CPU: the other ranks time the bare run.
    times = timed_runs(
        reading_cpu(bare, readings) if dist.get_rank() == 0 else bare, warmup=1, repeats=repeats
    )
    dist.barrier()
    trace = executor.run(tensor, trace=True)
    assert trace is not None
    return times, tuple((t.start_s, t.end_s) for t in trace.ops), timed_readings(readings, 1)


MEMORY_PROBE_BYTES = 16 * 1024 * 1024
"""Buffer of the memory-bandwidth probe: far beyond the caches, as a chunk's reduction is."""


def measure_memory_bytes_per_s(*, probe_bytes: int = MEMORY_PROBE_BYTES, repeats: int = 5) -> float:
    """This rank's bandwidth for the reduction's ``out = a + b``: 3 buffers moved per add.

    Best of ``repeats``: like the per-dimension lines, the op's own cost, not the host's
    noise (which the jitter term carries).
    """
    a = torch.ones(probe_bytes // 4, dtype=torch.float32)
    b = torch.ones_like(a)
    out = torch.empty_like(a)
    best_s = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.add(a, b, out=out)
        best_s = min(best_s, time.perf_counter() - t0)
    return 3 * probe_bytes / best_s


def calibrate_in_process(
    sizes: Sequence[int],
    groups: Sequence[Any],
    *,
    sizes_bytes: Sequence[int],
    repeats: int,
    timeout_s: float,
    concurrent_window_s: float,
    overhead_message_bytes: int,
) -> tuple[list[Sample], OverheadRun | None]:
    """Samples, then the overhead run, under torchrun: rank 0 plans the schedule and sends it.

    Returns ``(samples, the overhead run or None)``; the run's trace and memory bandwidth
    are rank 0's (the caller fits on rank 0).
    """
    samples = measure_in_process(
        sizes,
        groups,
        sizes_bytes=sizes_bytes,
        repeats=repeats,
        timeout_s=timeout_s,
        concurrent_window_s=concurrent_window_s,
    )
    if not overhead_message_bytes:
        return samples, None
    schedule = Schedule.from_json(
        share_from_rank0(lambda: overhead_schedule(fit_all(sizes, samples), overhead_message_bytes).to_json())
    )
    times, op_times, host_cpu_s = measure_overhead_in_process(
        schedule, groups, repeats=repeats, timeout_s=timeout_s
    )
    run = OverheadRun(
        schedule=schedule,
        times_s=tuple(times),
        op_times_s=op_times,
        memory_bytes_per_s=measure_memory_bytes_per_s(),
        host_cpu_s=host_cpu_s,
    )
    return samples, run


def share_from_rank0(make: Callable[[], str]) -> str:
    """``make()`` on rank 0 only, its text on every rank (collective).

    If ``make`` fails with a user error, every rank raises it, so the job ends with one
    clear message instead of rank 0's error and the others' broken connections.
    """
    box: list[object] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", make())
        except HipipeError as exc:
            box[0] = ("error", str(exc))
    dist.broadcast_object_list(box, src=0)
    shared = box[0]
    assert isinstance(shared, tuple) and len(shared) == 2
    if shared[0] != "ok":
        raise TestbedError(str(shared[1]))
    return str(shared[1])


def _samples(
    dim: int,
    size_bytes: int,
    times: Sequence[float],
    *,
    concurrent: bool = False,
    streamed_ops: int = 1,
    host_cpu_s: Sequence[float] = (),
    host_busy_cores: float = -1.0,
) -> list[Sample]:
    """An RS and an AG sample from the run's total ``(RS, AG)`` seconds over ``streamed_ops`` ops
    each, and the host's busy CPU seconds over each (negative or absent: not measured)."""
    full_bytes = max(1, size_bytes // 4) * 4
    cpu = [None if c < 0 else float(c) / streamed_ops for c in host_cpu_s] or [None, None]
    return [
        Sample(
            dim=dim,
            phase=phase,
            full_bytes=full_bytes,
            time_s=float(time_s) / streamed_ops,
            concurrent=concurrent,
            streamed_ops=streamed_ops,
            host_cpu_s=cpu_s,
            host_busy_cores=None if host_busy_cores < 0 else float(host_busy_cores),
        )
        for phase, time_s, cpu_s in zip(("RS", "AG"), times[:2], cpu, strict=True)
    ]


def _host_busy_s() -> float:
    """The host's busy CPU seconds, -1 where it cannot be read (a number every rank can reduce)."""
    busy = busy_cpu_s()
    return -1.0 if busy is None else busy


def _time_rs_ag(
    ring: Any, size_bytes: int, count: int, timeout_s: float
) -> tuple[float, float, float, float]:
    """Run ``count`` RS then ``count`` AG on a float32 buffer: this rank's seconds of each,
    then the host's busy CPU seconds over each (-1: not readable).

    Each half starts right after a barrier of the ring's own group, so both see the same
    start skew (a world barrier releases 8 ranks on 2 cores milliseconds apart, which
    made small RSs, timed after it, look ~7 ms slower than the AGs timed after a ring one).
    """
    tensor = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32)
    dist.barrier(group=ring.group)
    c0, t0 = _host_busy_s(), time.perf_counter()
    for _ in range(count):
        ring_reduce_scatter(tensor, ring, timeout_s=timeout_s)
    t1, c1 = time.perf_counter(), _host_busy_s()
    dist.barrier(group=ring.group)
    c2, t2 = _host_busy_s(), time.perf_counter()
    for _ in range(count):
        ring_all_gather(tensor, ring, timeout_s=timeout_s)
    t3, c3 = time.perf_counter(), _host_busy_s()
    readable = min(c0, c1, c2, c3) >= 0
    return t1 - t0, t3 - t2, (c1 - c0 if readable else -1.0), (c3 - c2 if readable else -1.0)


def _concurrently(
    rings: Sequence[Any], size_bytes: int, counts: Sequence[int], timeout_s: float
) -> list[float]:
    """Every dimension's RS/AG loop in its own thread at once; ``[rs0, ag0, rs1, ag1, ...]`` seconds."""
    out = [0.0] * (2 * len(rings))
    errors: list[BaseException] = []

    def work(dim: int) -> None:
        try:
            out[2 * dim : 2 * dim + 2] = _time_rs_ag(rings[dim], size_bytes, counts[dim], timeout_s)[:2]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(len(rings))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    if errors or any(t.is_alive() for t in threads):
        raise TestbedError(f"concurrent calibration failed: {errors[0] if errors else 'timed out'}")
    return out
