"""Measure a schedule for real against ``torch.distributed.all_reduce`` (``hipipe run``).

One function, :func:`measure`, runs on every rank: it builds the per-dim groups and the
executor, checks the result against ``all_reduce`` on the same data, then times both
the same way (:mod:`hipipe.torch.timing`, shared with the testbed and ``hipipe tune``).
Times follow nccl-tests: each iteration's time is the slowest rank's, averaged over
iterations here (the testbed and tuning report the median); ``algbw = M / t``,
``busbw = algbw * 2 (N-1) / N`` (HIPIPE.md section 7). :func:`run_local` spawns the ranks itself (``--nproc``);
:func:`run_from_env` joins a job started by ``torchrun``.
"""

import os
import statistics
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.schedule import Schedule
from hipipe.torch.collectives import ReduceOp
from hipipe.torch.executor import HierarchicalAllReduce, trace_to_schedule
from hipipe.torch.groups import dimension_groups
from hipipe.torch.launch import raise_on_failure, spawn
from hipipe.torch.timing import timed_runs

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """What to run: a schedule (it fixes topology and message size) and how to time it."""

    schedule: Schedule
    dtype: str = "float32"
    op: str = "sum"
    iterations: int = 5
    warmup: int = 1
    timeout_s: float = 60.0
    backend: str = "gloo"
    trace: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise HipipeError(f"unknown dtype {self.dtype!r} (use {', '.join(DTYPES)})")
        itemsize = torch.empty(0, dtype=DTYPES[self.dtype]).element_size()
        if self.schedule.message_bytes % itemsize:
            raise HipipeError(
                f"{self.schedule.message_bytes} bytes is not a whole number of {self.dtype} elements"
            )
        if self.iterations < 1 or self.warmup < 0:
            raise HipipeError("need at least 1 iteration and >= 0 warmup iterations")


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """One implementation's measured time and bandwidths (nccl-tests conventions)."""

    name: str
    time_s: float
    """Mean over iterations of the slowest rank's time."""
    min_time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """What ``hipipe run`` reports (rank 0's view)."""

    world_size: int
    message_bytes: int
    dtype: str
    planner: str
    num_chunks: int
    planned_s: float
    """The schedule's makespan under the cost model of its topology (not of this machine)."""
    verified: bool
    max_abs_error: float
    timings: tuple[Timing, ...]
    measured: Schedule | None = None
    """Rank 0's op times as a schedule, when a trace was asked for."""


def _tolerance(dtype: torch.dtype, world_size: int) -> float:
    """Relative error allowed between two summation orders of ``world_size`` values."""
    if not dtype.is_floating_point:
        return 0.0
    return float(torch.finfo(dtype).eps) * 4 * world_size


def _data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Different data on every rank, reproducible; small integers so int sums stay exact."""
    generator = torch.Generator().manual_seed(1234 + rank)
    values = torch.randint(-100, 100, (numel,), generator=generator)
    if dtype.is_floating_point:
        values = values.to(torch.float64) + torch.rand(numel, generator=generator, dtype=torch.float64)
    return values.to(dtype)


def _timed(fn: object, buffer: torch.Tensor, source: torch.Tensor, config: RunConfig) -> list[float]:
    """Per timed iteration, the slowest rank's time (:mod:`hipipe.torch.timing`), from fresh data."""
    return timed_runs(
        lambda: fn(buffer),  # type: ignore[operator]
        warmup=config.warmup,
        repeats=config.iterations,
        before=lambda index: buffer.copy_(source),
        device=buffer.device,
    )


def measure(rank: int, world_size: int, config: RunConfig) -> RunResult:
    """On every rank: verify hipipe against ``all_reduce``, then time both."""
    torch.set_num_threads(1)
    schedule = config.schedule
    topology = schedule.topology
    if world_size != topology.num_npus:
        raise HipipeError(
            f"the topology {topology.label()} needs {topology.num_npus} ranks, the job has {world_size}"
        )
    device = torch.device("cpu")
    if config.backend == "nccl":
        device = torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        )
        torch.cuda.set_device(device)
    groups = dimension_groups(topology.sizes, timeout_s=config.timeout_s)
    executor = HierarchicalAllReduce(None, schedule, groups=groups, timeout_s=config.timeout_s)
    dtype = DTYPES[config.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    source = _data(rank, schedule.message_bytes // itemsize, dtype).to(device)
    reduce_op = ReduceOp(config.op)
    torch_op = {
        ReduceOp.SUM: dist.ReduceOp.SUM,
        ReduceOp.AVG: dist.ReduceOp.SUM,
        ReduceOp.MIN: dist.ReduceOp.MIN,
        ReduceOp.MAX: dist.ReduceOp.MAX,
    }[reduce_op]

    def torch_all_reduce(buffer: torch.Tensor) -> None:
        dist.all_reduce(buffer, op=torch_op)
        if reduce_op is ReduceOp.AVG:
            buffer.div_(world_size)

    ours = source.clone()
    executor.run(ours, op=reduce_op)
    reference = source.clone()
    torch_all_reduce(reference)
    # Two summation orders differ by at most ~ eps * N * sum_i |x_i| per element: scale by that.
    magnitude = source.to(torch.float64).abs()
    dist.all_reduce(magnitude)
    difference = (ours.to(torch.float64) - reference.to(torch.float64)).abs()
    worst = torch.tensor(
        [float(difference.max()) if difference.numel() else 0.0], dtype=torch.float64, device=device
    )
    worst_relative = torch.tensor(
        [float((difference / magnitude.clamp(min=1.0)).max()) if difference.numel() else 0.0],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    dist.all_reduce(worst_relative, op=dist.ReduceOp.MAX)
    verified = float(worst_relative.item()) <= _tolerance(dtype, world_size)

    buffer = torch.empty_like(source)
    timings = []
    for name, fn in (
        ("hipipe", lambda b: executor.run(b, op=reduce_op)),
        ("torch all_reduce", torch_all_reduce),
    ):
        times = _timed(fn, buffer, source, config)
        mean_s = statistics.fmean(times)
        algbw = schedule.message_bytes / mean_s
        timings.append(
            Timing(
                name=name,
                time_s=mean_s,
                min_time_s=min(times),
                algbw_bytes_per_s=algbw,
                busbw_bytes_per_s=algbw * 2 * (world_size - 1) / world_size,
            )
        )
    trace = None
    if config.trace:  # a warm run: the first one pays for first-use costs the plan knows nothing about
        buffer.copy_(source)
        dist.barrier()
        trace = executor.run(buffer, op=reduce_op, trace=True)
    return RunResult(
        world_size=world_size,
        message_bytes=schedule.message_bytes,
        dtype=config.dtype,
        planner=schedule.planner,
        num_chunks=schedule.num_chunks,
        planned_s=schedule.makespan_s,
        verified=verified,
        max_abs_error=float(worst.item()),
        timings=tuple(timings),
        measured=trace_to_schedule(schedule, trace) if trace is not None else None,
    )


def run_local(config: RunConfig, nproc: int, *, timeout_s: float | None = None) -> RunResult:
    """Spawn ``nproc`` local Gloo processes and measure; rank 0's result."""
    topology = config.schedule.topology
    if nproc != topology.num_npus:
        raise HipipeError(
            f"the topology {topology.label()} needs {topology.num_npus} ranks, --nproc is {nproc}"
        )
    budget_s = timeout_s if timeout_s is not None else 60.0 + 4 * config.timeout_s
    outcomes = spawn(
        measure,
        nproc,
        args=(config,),
        timeout_s=budget_s,
        pg_timeout_s=config.timeout_s,
        backend=config.backend,
    )
    values = raise_on_failure(outcomes)
    result: RunResult = values[0]
    return result


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_from_env(config: RunConfig) -> tuple[int, RunResult]:
    """Join a ``torchrun`` job (env:// rendezvous) and measure; ``(rank, result)``."""
    world_size = int(os.environ["WORLD_SIZE"])
    topology = config.schedule.topology
    if world_size != topology.num_npus:
        raise HipipeError(
            f"the topology {topology.label()} needs {topology.num_npus} ranks, torchrun started {world_size}"
        )
    dist.init_process_group(config.backend, timeout=timedelta(seconds=config.timeout_s))
    rank = dist.get_rank()
    result = measure(rank, world_size, config)
    # Only a clean run tears the group down: after a failure, peers may be gone and it could block.
    dist.destroy_process_group()
    return rank, result
