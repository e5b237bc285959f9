"""One rank of a testbed run: ``python -m hipipe.testbed.worker JOB.json RANK``.

Order matters (HIPIPE.md section 8): the process enters its rank's network namespace
*before* importing torch or opening any socket, sets ``GLOO_SOCKET_IFNAME`` to its
veth, and joins the parent's ``TCPStore`` on the hub bridge. Then it runs the job's
tasks in order, identical on every rank:

- ``calibrate``: ring RS/AG per dimension at several sizes (:mod:`hipipe.testbed.calibrate`);
- ``schedule``: the executor on one schedule, warm-up then timed repeats;
- ``torch``: ``torch.distributed.all_reduce`` on the same message, the reference.

A timed run starts after a barrier and its time is the slowest rank's. Warm-up runs
also check the result (every rank adds ``rank + 1``; the sum is known), so a wrong
executor cannot produce a fast number. Rank 0 reports progress and results as JSON
lines on stdout (:data:`EVENT_MARK`); errors go to stderr in one line and exit 1.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hipipe.testbed.nsenter import enter_netns

GIL_SWITCH_INTERVAL_S = 2e-4

EVENT_MARK = "@hipipe-event "
"""Prefix of rank 0's machine-readable stdout lines (anything else is a library's chatter)."""


def emit(event: dict[str, Any]) -> None:
    print(EVENT_MARK + json.dumps(event), flush=True)


def _timed(run: Any, rank: int, world: int, tensor: Any, check: bool) -> float:
    """Barrier, run, slowest rank's time; optionally verify the sum."""
    import torch
    import torch.distributed as dist

    tensor.fill_(float(rank + 1))
    dist.barrier()
    t0 = time.perf_counter()
    run()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if check:
        expected = world * (world + 1) / 2
        bad = int((tensor != expected).sum().item())
        flags = torch.tensor([bad], dtype=torch.int64)
        dist.all_reduce(flags)
        if int(flags.item()):
            raise RuntimeError(
                f"wrong AllReduce result: {int(flags.item())} elements differ from {expected:g}"
            )
    return float(elapsed.item())


def _run_task(task: dict[str, Any], job: dict[str, Any], rank: int, world: int, groups: Any) -> None:
    import torch
    import torch.distributed as dist

    kind = task["kind"]
    if kind == "calibrate":
        from hipipe.testbed.calibrate import measure_in_process, measure_overhead_in_process

        samples = measure_in_process(
            job["sizes"],
            groups,
            sizes_bytes=task["sizes_bytes"],
            repeats=task["repeats"],
            timeout_s=job["timeout_s"],
            concurrent_window_s=task.get("concurrent_window_s", 0.0),
        )
        overhead_times_s: list[float] = []
        if task.get("overhead_message_bytes"):
            overhead_times_s = measure_overhead_in_process(
                job["sizes"],
                groups,
                samples,
                message_bytes=int(task["overhead_message_bytes"]),
                repeats=task["repeats"],
                timeout_s=job["timeout_s"],
            )
        if rank == 0:
            emit(
                {
                    "event": "calibration",
                    "overhead_message_bytes": task.get("overhead_message_bytes", 0),
                    "overhead_times_s": overhead_times_s,
                    "samples": [
                        {"dim": s.dim, "phase": s.phase, "full_bytes": s.full_bytes, "time_s": s.time_s}
                        for s in samples
                    ],
                }
            )
        return
    name = task["name"]
    trace: Any = None
    if kind == "schedule":
        from hipipe.schedule import Schedule
        from hipipe.torch.executor import HierarchicalAllReduce

        schedule = Schedule.from_json(Path(task["schedule_path"]).read_text())
        executor = HierarchicalAllReduce(None, schedule, groups=groups, timeout_s=job["timeout_s"])
        message_bytes = schedule.message_bytes
        tensor = torch.empty(message_bytes // 4, dtype=torch.float32)

        def run() -> None:
            nonlocal trace
            trace = executor.run(tensor, trace=True)

    elif kind == "torch":
        message_bytes = int(task["message_bytes"])
        tensor = torch.empty(message_bytes // 4, dtype=torch.float32)

        def run() -> None:
            dist.all_reduce(tensor)

    else:
        raise ValueError(f"unknown task kind {kind!r}")
    times = []
    for i in range(task["warmup"] + task["repeats"]):
        warm = i < task["warmup"]
        elapsed = _timed(run, rank, world, tensor, check=warm or i == task["warmup"] + task["repeats"] - 1)
        if not warm:
            times.append(elapsed)
        if rank == 0:
            emit({"event": "run", "task": name, "index": i, "warmup": warm, "time_s": elapsed})
    if rank == 0:
        result: dict[str, Any] = {"event": "result", "task": name, "times_s": times}
        if trace is not None:
            result["trace"] = [[t.start_s, t.end_s] for t in trace.ops]
        emit(result)


def main(argv: list[str]) -> int:
    job_path, rank = Path(argv[0]), int(argv[1])
    job = json.loads(job_path.read_text())
    enter_netns(job["netns"][rank])  # before torch exists in this process: no socket yet
    os.environ["GLOO_SOCKET_IFNAME"] = job["ifnames"][rank]
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hipipe.torch.groups import dimension_groups

    torch.set_num_threads(1)
    # The executor runs one thread per dimension; with CPython's default 5 ms GIL switch
    # interval a thread woken by a finished transfer can wait that long for the GIL, per
    # ring step. Short ops (many chunks) would pay it over and over.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    world = int(job["world_size"])
    timeout = timedelta(seconds=job["timeout_s"])
    store = dist.TCPStore(job["store_host"], int(job["store_port"]), is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        groups = dimension_groups(job["sizes"], timeout_s=job["timeout_s"])
        for task in job["tasks"]:
            _run_task(task, job, rank, world, groups)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        emit({"event": "done"})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        print(f"rank {sys.argv[2]}: {type(exc).__name__}: {lines[0] if lines else ''}", file=sys.stderr)
        sys.exit(1)
