"""Timing on ranks: "the slowest rank's time", written once.

An op across ranks ends when its slowest rank ends, so every measured time in hipipe
is a maximum over ranks: every rank starts after a barrier, times its own part, and an
``all_reduce(MAX)`` makes the slowest rank's time known to all (nccl-tests do the same).
The testbed worker, ``hipipe calibrate``, ``hipipe run`` (:mod:`hipipe.torch.bench`) and
``hipipe tune`` time through these functions, so their numbers mean the same thing.

These functions return the raw per-run times; how to summarize them (median for the
testbed and tuning, the mean ``hipipe run`` reports) is the caller's choice, made
visible in its output.
"""

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipipe.repeats import RepeatRule

RunFn = Callable[[], object]
BeforeFn = Callable[[int], object]
"""Called on every rank before run ``i`` (untimed): refill the buffer, for instance."""
AfterFn = Callable[[int, float], object]
"""Called on every rank after run ``i`` with its slowest-rank time (untimed): verify, report."""


def slowest_rank_s(local_s: Sequence[float], *, group: Any = None, device: Any = None) -> tuple[float, ...]:
    """Each entry's maximum over the ranks of ``group`` (collective: call on every member)."""
    times = torch.tensor(list(local_s), dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    return tuple(float(t) for t in times.tolist())


def time_once(run: RunFn, *, device: Any = None) -> float:
    """Barrier, ``run()``, the slowest rank's seconds. On CUDA the device is synchronized first."""
    dist.barrier()
    start = time.perf_counter()
    run()
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return slowest_rank_s([time.perf_counter() - start], device=device)[0]


def timed_runs(
    run: RunFn,
    *,
    warmup: int,
    repeats: int | RepeatRule,
    before: BeforeFn | None = None,
    after: AfterFn | None = None,
    device: Any = None,
) -> list[float]:
    """``warmup`` untimed runs then the timed ones; the slowest rank's time of each timed run.

    ``repeats`` is a count, or a :class:`~hipipe.repeats.RepeatRule` that keeps timing
    until the median is pinned down: every rank holds the same slowest-rank times, so
    every rank stops after the same run. Warm-up runs are timed the same way (``after``
    sees their times) but left out of the result: they pay for connections and first-use
    allocations a steady state does not.
    """
    rule = RepeatRule.fixed(repeats) if isinstance(repeats, int) else repeats
    times: list[float] = []
    index = 0
    while not rule.enough(times):
        if before is not None:
            before(index)
        elapsed_s = time_once(run, device=device)
        if after is not None:
            after(index, elapsed_s)
        if index >= warmup:
            times.append(elapsed_s)
        index += 1
    return times
