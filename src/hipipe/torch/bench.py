"""Measure a schedule for real against torch's own collective (``hipipe run``).

One function, :func:`measure`, runs on every rank: it builds the per-dim groups and the
executor, checks the result against torch's collective of the schedule's kind
(``all_reduce``, ``reduce_scatter_tensor``, ``all_gather_into_tensor``) on the same
data, then times both the same way (:mod:`hipipe.torch.timing`, shared with the testbed
and ``hipipe tune``). Times follow nccl-tests: each iteration's time is the slowest
rank's, averaged over iterations here (the testbed and tuning report the median);
``algbw = M / t`` with M the full per-rank buffer, ``busbw = algbw * 2 (N-1) / N`` for
AllReduce and ``algbw * (N-1) / N`` for ReduceScatter and AllGather (docs/MODEL.md).
:func:`run_local` spawns the ranks itself (``--nproc``);
:func:`run_from_env` joins a job started by ``torchrun``.
"""

import functools
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.schedule import Collective, Schedule
from hipipe.torch.collectives import ReduceOp
from hipipe.torch.executor import HierarchicalCollective, Trace, trace_to_schedule
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
        world = self.schedule.topology.num_npus
        if self.schedule.collective is not Collective.ALL_REDUCE and self.schedule.message_bytes % (
            world * itemsize
        ):
            raise HipipeError(
                f"{self.schedule.message_bytes} bytes do not split into {world} equal shards of whole"
                f" {self.dtype} elements: use a multiple of {world * itemsize} bytes"
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
    collective: Collective = Collective.ALL_REDUCE


TORCH_NAMES = {c: c.torch_function for c in Collective}
"""What ``hipipe run`` compares against, by the names users know."""

_TORCH_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.AVG: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
}


def _tolerance(dtype: torch.dtype, world_size: int, collective: Collective) -> float:
    """Relative error allowed between two summation orders of ``world_size`` values (none to gather)."""
    if not dtype.is_floating_point or collective is Collective.ALL_GATHER:
        return 0.0
    return float(torch.finfo(dtype).eps) * 4 * world_size


def _data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Different data on every rank, reproducible; small integers so int sums stay exact."""
    generator = torch.Generator().manual_seed(1234 + rank)
    values = torch.randint(-100, 100, (numel,), generator=generator)
    if dtype.is_floating_point:
        values = values.to(torch.float64) + torch.rand(numel, generator=generator, dtype=torch.float64)
    return values.to(dtype)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Buffers:
    """One rank's tensors for one collective: the data, the output of each implementation."""

    source: torch.Tensor
    """This rank's input (AllReduce: copied into ``ours``/``theirs`` before every call)."""
    ours: torch.Tensor
    theirs: torch.Tensor


def _buffers(collective: Collective, rank: int, world_size: int, numel: int, dtype: torch.dtype) -> _Buffers:
    """``numel`` is the full per-rank buffer (the schedule's message)."""
    narrow = numel // world_size
    if collective is Collective.ALL_GATHER:
        source, out_numel = _data(rank, narrow, dtype), numel
    else:
        source = _data(rank, numel, dtype)
        out_numel = numel if collective is Collective.ALL_REDUCE else narrow
    return _Buffers(
        source=source, ours=torch.empty(out_numel, dtype=dtype), theirs=torch.empty(out_numel, dtype=dtype)
    )


def _torch_call(
    collective: Collective, op: ReduceOp, world_size: int
) -> Callable[[_Buffers, torch.Tensor], None]:
    """torch's own collective into ``out``, as the executor's method of the same kind computes it.

    The ``*_single`` names are what torch 2.13 calls ``reduce_scatter_tensor`` /
    ``all_gather_into_tensor`` (same semantics; the old names warn on every call).
    """
    reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

    def call(buffers: _Buffers, out: torch.Tensor) -> None:
        if collective is Collective.ALL_GATHER:
            all_gather(out, buffers.source)
            return
        if collective is Collective.ALL_REDUCE:
            dist.all_reduce(out, op=_TORCH_OPS[op])  # in place: out holds the source (_prepare)
        else:
            reduce_scatter(out, buffers.source, op=_TORCH_OPS[op])
        if op is ReduceOp.AVG:
            out.div_(world_size)

    return call


def _hipipe_call(
    executor: HierarchicalCollective, op: ReduceOp
) -> Callable[[_Buffers, torch.Tensor, bool], Trace | None]:
    """The executor's method for the schedule's collective, fed like :func:`_torch_call`."""
    collective = executor.schedule.collective

    def call(buffers: _Buffers, out: torch.Tensor, trace: bool) -> Trace | None:
        if collective is Collective.ALL_GATHER:
            return executor.all_gather(out, buffers.source, trace=trace)
        if collective is Collective.REDUCE_SCATTER:
            return executor.reduce_scatter(out, buffers.source, op=op, trace=trace)
        return executor.all_reduce(out, op=op, trace=trace)  # in place: out holds the source (_prepare)

    return call


def _prepare(buffers: _Buffers, out: torch.Tensor, collective: Collective) -> None:
    """AllReduce works in place: refill its buffer with the source before every call (untimed)."""
    if collective is Collective.ALL_REDUCE:
        out.copy_(buffers.source)


def _timed(
    fn: Callable[[], object], prepare: Callable[[], None], config: RunConfig, device: torch.device
) -> list[float]:
    """Per timed iteration, the slowest rank's time (:mod:`hipipe.torch.timing`), from fresh data."""
    return timed_runs(
        fn, warmup=config.warmup, repeats=config.iterations, before=lambda index: prepare(), device=device
    )


def _worst_errors(
    buffers: _Buffers, collective: Collective, world_size: int, device: torch.device
) -> tuple[float, float]:
    """Largest absolute and relative (to the sum of magnitudes) difference, over all ranks."""
    # Two summation orders differ by at most ~ eps * N * sum_i |x_i| per element: scale by that.
    magnitude = buffers.source.to(torch.float64).abs()
    if collective is not Collective.ALL_GATHER:
        dist.all_reduce(magnitude)
    if collective is Collective.REDUCE_SCATTER:
        magnitude = magnitude.view(world_size, -1)[dist.get_rank()]
    elif collective is Collective.ALL_GATHER:
        magnitude = torch.ones_like(buffers.ours, dtype=torch.float64)
    difference = (buffers.ours.to(torch.float64) - buffers.theirs.to(torch.float64)).abs()
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
    return float(worst.item()), float(worst_relative.item())


def measure(rank: int, world_size: int, config: RunConfig) -> RunResult:
    """On every rank: verify hipipe against torch's collective of the same kind, then time both."""
    torch.set_num_threads(1)
    schedule = config.schedule
    topology = schedule.topology
    collective = schedule.collective
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
    executor = HierarchicalCollective(None, schedule, groups=groups, timeout_s=config.timeout_s)
    dtype = DTYPES[config.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    cpu = _buffers(collective, rank, world_size, schedule.message_bytes // itemsize, dtype)
    buffers = _Buffers(source=cpu.source.to(device), ours=cpu.ours.to(device), theirs=cpu.theirs.to(device))
    reduce_op = ReduceOp(config.op)
    ours, theirs = _hipipe_call(executor, reduce_op), _torch_call(collective, reduce_op, world_size)

    _prepare(buffers, buffers.ours, collective)
    ours(buffers, buffers.ours, False)
    _prepare(buffers, buffers.theirs, collective)
    theirs(buffers, buffers.theirs)
    worst, worst_relative = _worst_errors(buffers, collective, world_size, device)
    verified = worst_relative <= _tolerance(dtype, world_size, collective)

    timings = []
    factor = collective.moves_per_byte * (world_size - 1) / world_size
    for name, fn, out in (
        ("hipipe", lambda: ours(buffers, buffers.ours, False), buffers.ours),
        (f"torch {TORCH_NAMES[collective]}", lambda: theirs(buffers, buffers.theirs), buffers.theirs),
    ):
        times = _timed(fn, functools.partial(_prepare, buffers, out, collective), config, device)
        mean_s = statistics.fmean(times)
        algbw = schedule.message_bytes / mean_s
        timings.append(
            Timing(
                name=name,
                time_s=mean_s,
                min_time_s=min(times),
                algbw_bytes_per_s=algbw,
                busbw_bytes_per_s=algbw * factor,
            )
        )
    trace = None
    if config.trace:  # a warm run: the first one pays for first-use costs the plan knows nothing about
        _prepare(buffers, buffers.ours, collective)
        dist.barrier()
        trace = ours(buffers, buffers.ours, True)
    return RunResult(
        world_size=world_size,
        message_bytes=schedule.message_bytes,
        dtype=config.dtype,
        planner=schedule.planner,
        num_chunks=schedule.num_chunks,
        planned_s=schedule.makespan_s,
        verified=verified,
        max_abs_error=worst,
        timings=tuple(timings),
        measured=trace_to_schedule(schedule, trace) if trace is not None else None,
        collective=collective,
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
