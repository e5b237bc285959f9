"""One rank of a testbed run: ``python -m hipipe.testbed.worker JOB.json RANK``.

Order matters (HIPIPE.md section 8): the process enters its rank's network namespace
*before* importing torch or opening any socket, sets ``GLOO_SOCKET_IFNAME`` to its
veth, and joins the parent's ``TCPStore`` on the hub bridge. Then it runs the job's
tasks (:mod:`hipipe.testbed.protocol`) in order, identical on every rank:

- :class:`~hipipe.testbed.protocol.CalibrateTask`: ring RS/AG per dimension at several
  sizes (:mod:`hipipe.testbed.calibrate`), then the overhead schedule the parent
  publishes in the store once it has the samples;
- :class:`~hipipe.testbed.protocol.ScheduleTask`: the executor on one schedule;
- :class:`~hipipe.testbed.protocol.TorchTask`: torch.distributed's own collective, the reference.

Runs are timed by :mod:`hipipe.torch.timing` (after a barrier, the slowest rank's time).
Warm-up runs and the last timed run also check the result (every rank adds ``rank + 1``;
the sum is known), so a wrong executor cannot produce a fast number. Rank 0 reports
progress and results as event lines on stdout; errors go to stderr in one line and exit 1.
"""

import os
import sys
from pathlib import Path
from typing import Any

from hipipe.hostcpu import reading_cpu, timed_readings
from hipipe.testbed.nsenter import enter_netns
from hipipe.testbed.protocol import (
    OVERHEAD_SCHEDULE_KEY,
    CalibrateTask,
    CalibrationSamples,
    Event,
    Job,
    JobDone,
    OverheadTimes,
    RunDone,
    RunResult,
    ScheduleTask,
    Task,
    TorchTask,
    event_to_line,
    job_from_json,
)

GIL_SWITCH_INTERVAL_S = 2e-4


def emit(event: Event) -> None:
    print(event_to_line(event), flush=True)


def _calibrate(task: CalibrateTask, job: Job, rank: int, groups: Any, store: Any) -> None:
    from hipipe.schedule import Schedule
    from hipipe.testbed.calibrate import (
        measure_in_process,
        measure_memory_bytes_per_s,
        measure_overhead_in_process,
    )

    samples = measure_in_process(
        job.sizes,
        groups,
        sizes_bytes=task.sizes_bytes,
        repeats=task.repeats,
        timeout_s=job.timeout_s,
        concurrent_window_s=task.concurrent_window_s,
    )
    if rank == 0:
        emit(CalibrationSamples(samples=tuple(samples)))
    if not task.overhead_message_bytes:
        return
    # The parent fits the samples and plans the schedule once; every rank waits for it here.
    schedule = Schedule.from_json(store.get(OVERHEAD_SCHEDULE_KEY).decode())
    times, op_times, host_cpu_s = measure_overhead_in_process(
        schedule, groups, repeats=task.overhead_rule, timeout_s=job.timeout_s
    )
    if rank == 0:
        emit(
            OverheadTimes(
                message_bytes=schedule.message_bytes,
                times_s=tuple(times),
                op_times_s=op_times,
                memory_bytes_per_s=measure_memory_bytes_per_s(),
                host_cpu_s=host_cpu_s,
            )
        )


def _measure(task: ScheduleTask | TorchTask, job: Job, rank: int, groups: Any) -> None:
    from hipipe.torch.bench import DTYPES
    from hipipe.torch.timing import timed_runs
    from hipipe.torch.workload import Workload

    workload = Workload(task.collective, task.key.message_bytes, DTYPES[task.dtype])
    traces: list[Any] = []
    if isinstance(task, ScheduleTask):
        from hipipe.torch.executor import HierarchicalCollective

        executor = HierarchicalCollective(None, task.schedule, groups=groups, timeout_s=job.timeout_s)
        call = workload.hipipe_run(executor, trace=task.trace)

        def run() -> object:
            traces[:] = [call()]
            return None

    else:
        run = workload.torch_run()

    def after(index: int, elapsed_s: float) -> None:
        warm = index < task.warmup
        if warm:
            workload.check()
        if rank == 0:
            emit(RunDone(key=task.key, index=index, warmup=warm, time_s=elapsed_s))

    cpu_s: list[float | None] = []
    # Only rank 0 reports the host's CPU: the other ranks time the bare run.
    times = timed_runs(
        reading_cpu(run, cpu_s) if rank == 0 else run,
        warmup=task.warmup,
        repeats=task.rule,
        before=workload.fill,
        after=after,
    )
    workload.check()  # the buffer holds the last timed run's result
    if rank == 0:
        trace = traces[0] if traces else None
        op_times = None if trace is None else tuple((t.start_s, t.end_s) for t in trace.ops)
        host_cpu_s = timed_readings(cpu_s, task.warmup)
        emit(RunResult(key=task.key, times_s=tuple(times), op_times_s=op_times, host_cpu_s=host_cpu_s))


def _run_task(task: Task, job: Job, rank: int, groups: Any, store: Any) -> None:
    if isinstance(task, CalibrateTask):
        _calibrate(task, job, rank, groups, store)
    else:
        _measure(task, job, rank, groups)


def main(argv: list[str]) -> int:
    job_path, rank = Path(argv[0]), int(argv[1])
    job = job_from_json(job_path.read_text())
    enter_netns(job.netns[rank])  # before torch exists in this process: no socket yet
    os.environ["GLOO_SOCKET_IFNAME"] = job.ifnames[rank]
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hipipe.torch.groups import dimension_groups

    torch.set_num_threads(1)
    # The executor runs one thread per dimension; with CPython's default 5 ms GIL switch
    # interval a thread woken by a finished transfer can wait that long for the GIL, per
    # ring step. Short ops (many chunks) would pay it over and over.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    timeout = timedelta(seconds=job.timeout_s)
    store = dist.TCPStore(job.store_host, job.store_port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=job.world_size, timeout=timeout)
    try:
        groups = dimension_groups(job.sizes, timeout_s=job.timeout_s)
        for task in job.tasks:
            _run_task(task, job, rank, groups, store)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        emit(JobDone())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        # one write, text and newline together, so that ranks sharing a stderr never merge lines
        sys.stderr.write(f"rank {sys.argv[2]}: {type(exc).__name__}: {lines[0] if lines else ''}\n")
        sys.exit(1)
