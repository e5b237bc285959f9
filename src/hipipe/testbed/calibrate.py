"""Calibration: measure each dimension's latency and bandwidth, fit the alpha-beta model.

For each dimension k, every group along k runs the executor's ring ReduceScatter and
AllGather at the same time (as in a real schedule) at several sizes. Each op's time is
the slowest rank's. The cost model (HIPIPE.md section 3) says

    t = latency_steps_k * a_k + (n_k - 1)/n_k * S / B_k

so a least-squares line through ``(x = (n_k-1)/n_k * S, t)`` gives ``1/B_k`` as its
slope and ``latency_steps_k * a_k`` as its intercept. The calibrated topology keeps the
dimension kind the testbed emulates (a switch, ring algorithm) so ``plan`` reads it
back and predicts with exactly the measured coefficients.

The same measurement runs on a real cluster under torchrun
(:func:`measure_in_process` with an initialized process group).
"""

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hipipe.testbed.layout import TestbedError
from hipipe.topology import Algorithm, Dimension, Kind, Topology

if TYPE_CHECKING:
    from hipipe.schedule import Schedule

DEFAULT_CALIBRATION_SIZES_BYTES: tuple[int, ...] = (128 * 1024, 1024 * 1024, 4 * 1024 * 1024, 8 * 1024 * 1024)
"""Per-rank buffer sizes of the calibration ops: spans the chunk sizes plans use."""

MIN_BANDWIDTH_BYTES_PER_S = 1.0

CONCURRENT_WINDOW_S = 0.0
"""How long each dimension repeats its op in the concurrent calibration pass."""


def calibration_sizes_bytes(
    rates_bits_per_s: Sequence[float], *, largest_op_s: float = 1.0
) -> tuple[int, ...]:
    """Sizes whose largest op takes about ``largest_op_s`` on the slowest dimension.

    Four sizes a factor 4 apart (1/64 .. 1 of the largest), so both the constant and the
    slope are seen; the largest is kept between 256 KiB and 8 MiB so a calibration
    takes seconds at 10 Mbit/s and still sees megabytes at 1 Gbit/s.
    """
    slowest_bytes_per_s = min(rates_bits_per_s) / 8
    largest = int(min(8 * 2**20, max(256 * 1024, slowest_bytes_per_s * largest_op_s)))
    largest -= largest % 4096
    return tuple(max(4096, largest // f - (largest // f) % 4096) for f in (64, 16, 4, 1))


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One timed op on one dimension (the slowest rank's time)."""

    dim: int
    phase: str
    """``RS`` or ``AG``."""
    full_bytes: int
    """Per-rank buffer on the op's wide side (RS input, AG output)."""
    time_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class DimFit:
    """The alpha-beta line of one dimension: ``time = constant_s + per_byte_s * x``."""

    dim: int
    size: int
    constant_s: float
    """Fitted intercept, clamped at 0: latency_steps * per-link latency."""
    per_byte_s: float
    """Seconds per byte of ``x = (n-1)/n * S``: 1 / bandwidth."""
    max_relative_residual: float
    """Largest |measured - fitted| / measured over the samples: how well the line fits."""
    num_samples: int

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.per_byte_s

    def predict_s(self, full_bytes: float) -> float:
        return self.constant_s + self.per_byte_s * (self.size - 1) / self.size * full_bytes


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares ``y = intercept + slope * x`` on *relative* residuals; ``(intercept, slope)``.

    Weights ``1/y^2`` make a 10% miss at 128 KiB count as much as one at 8 MiB: plans
    use chunks of every size in between, so no size may dominate the fit.
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise TestbedError("a fit needs at least two samples")
    if any(not y > 0 for y in ys):
        raise TestbedError("every sample needs a positive time")
    weights = [1.0 / y**2 for y in ys]
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs, strict=True)) / total
    mean_y = sum(w * y for w, y in zip(weights, ys, strict=True)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs, strict=True))
    if sxx == 0:
        raise TestbedError("a fit needs samples at two sizes at least")
    sxy = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, xs, ys, strict=True))
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def fit_dim(dim: int, size: int, samples: Sequence[Sample]) -> DimFit:
    """Fit one dimension's samples (RS and AG pooled: the model charges them alike).

    Repeats of one (phase, size) are first reduced to their minimum: noise on a shared
    host only ever adds time (one descheduled rank can stretch a small op tenfold), so
    the minimum is the op's own cost. The typical extra cost inside real runs is
    measured separately, as the per-op overhead (:func:`fit_op_overhead_s`).
    """
    mine = [s for s in samples if s.dim == dim]
    groups: dict[tuple[str, int], list[float]] = {}
    for sample in mine:
        groups.setdefault((sample.phase, sample.full_bytes), []).append(sample.time_s)
    keys = sorted(groups)
    xs = [(size - 1) / size * full_bytes for _, full_bytes in keys]
    ys = [min(groups[key]) for key in keys]
    intercept, slope = fit_line(xs, ys)
    constant = intercept
    if intercept < 0:
        # No negative latency: refit the slope through the origin (same relative weights).
        constant = 0.0
        slope = sum(x / y for x, y in zip(xs, ys, strict=True)) / sum(
            (x / y) ** 2 for x, y in zip(xs, ys, strict=True)
        )
    if not slope > 0:
        raise TestbedError(f"dimension {dim}: time does not grow with size (slope {slope:.3g} s/B)")
    residual = max(abs(y - (constant + slope * x)) / y for x, y in zip(xs, ys, strict=True) if y > 0)
    return DimFit(
        dim=dim,
        size=size,
        constant_s=constant,
        per_byte_s=slope,
        max_relative_residual=residual,
        num_samples=len(mine),
    )


def calibrated_topology(
    fits: Sequence[DimFit], *, name: str = "calibrated", op_overhead_s: float = 0.0
) -> Topology:
    """A topology whose cost model reproduces the fitted lines exactly (plus an overhead).

    Each dimension is a switch with the ring algorithm, whose ``latency_steps`` is
    2 (n-1): the per-link latency is the op's constant divided by that. The constant
    is the fitted intercept plus ``op_overhead_s`` (:func:`fit_op_overhead_s`).
    """
    dims = []
    for fit in sorted(fits, key=lambda f: f.dim):
        template = Dimension(
            kind=Kind.SWITCH,
            size=fit.size,
            bandwidth_bytes_per_s=1.0,
            latency_s=0.0,
            algorithm=Algorithm.RING,
        )
        dims.append(
            Dimension(
                kind=Kind.SWITCH,
                size=fit.size,
                bandwidth_bytes_per_s=max(MIN_BANDWIDTH_BYTES_PER_S, fit.bandwidth_bytes_per_s),
                latency_s=(fit.constant_s + op_overhead_s) / template.latency_steps,
                algorithm=Algorithm.RING,
            )
        )
    return Topology(dims=tuple(dims), name=name)


OVERHEAD_PLANNER = "pipelined"
"""The schedule that calibrates the per-op overhead: many chunks, every dimension busy,
and neither of the two plans the benchmark compares (hipipe, themis)."""

OVERHEAD_NUM_CHUNKS = 32


def overhead_schedule(fits: Sequence[DimFit], message_bytes: int) -> "Schedule":
    """The schedule every rank runs to measure the per-op overhead (same on every rank)."""
    from hipipe.planners import plan

    return plan(calibrated_topology(fits), message_bytes, OVERHEAD_PLANNER, num_chunks=OVERHEAD_NUM_CHUNKS)


def fit_op_overhead_s(fits: Sequence[DimFit], schedule: "Schedule", measured_s: float) -> float:
    """The extra constant per op that makes the simulated makespan equal the measured one.

    The per-dimension lines are measured one op at a time. Inside a pipelined run an op
    also waits for its chunk's previous op on *other* groups of ranks, and with several
    ranks per core every such hand-off costs scheduling delay. One number per testbed,
    found by bisection on the simulator replaying ``schedule``'s own sequences; 0 if the
    run was not slower than predicted.
    """
    from hipipe.simulator import simulate_chunks

    def makespan(overhead_s: float) -> float:
        topology = calibrated_topology(fits, op_overhead_s=overhead_s)
        return simulate_chunks(
            topology,
            schedule.message_bytes,
            schedule.chunks,
            policy="fixed",
            sequences=schedule.sequences,
        ).makespan_s

    low, high = 0.0, measured_s
    if makespan(low) >= measured_s:
        return 0.0
    for _ in range(40):
        middle = (low + high) / 2
        if makespan(middle) < measured_s:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def measure_overhead_in_process(
    sizes: Sequence[int],
    groups: Sequence[Any],
    samples: Sequence[Sample],
    *,
    message_bytes: int,
    repeats: int,
    timeout_s: float,
) -> list[float]:
    """Run :func:`overhead_schedule` with the executor; the slowest rank's time per repeat.

    Every rank holds the same samples (maxima over ranks), hence the same fits and the
    same schedule; the executor checks that before it moves a byte.
    """
    import torch
    import torch.distributed as dist

    from hipipe.torch.executor import HierarchicalAllReduce

    schedule = overhead_schedule(fit_all(sizes, samples), message_bytes)
    executor = HierarchicalAllReduce(None, schedule, groups=list(groups), timeout_s=timeout_s)
    tensor = torch.zeros(message_bytes // 4, dtype=torch.float32)
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        executor.run(tensor)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i > 0:  # the first run is a warm-up
            times.append(float(elapsed.item()))
    return times


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Per-dimension lines plus the per-op overhead measured inside a pipelined run."""

    fits: tuple[DimFit, ...]
    op_overhead_s: float = 0.0
    overhead_message_bytes: int = 0
    overhead_times_s: tuple[float, ...] = ()

    def topology(self, name: str = "calibrated") -> Topology:
        return calibrated_topology(self.fits, name=name, op_overhead_s=self.op_overhead_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dims": fits_to_dict(self.fits),
            "op_overhead_s": self.op_overhead_s,
            "overhead_schedule": f"{OVERHEAD_PLANNER} K={OVERHEAD_NUM_CHUNKS}",
            "overhead_message_bytes": self.overhead_message_bytes,
            "overhead_times_s": list(self.overhead_times_s),
        }


def calibration_from_event(sizes: Sequence[int], event: dict[str, Any]) -> Calibration:
    """Fit what a worker's ``calibration`` event carries (samples, overhead run times)."""
    fits = fit_all(sizes, [Sample(**s) for s in event["samples"]])
    times = [float(t) for t in event.get("overhead_times_s", [])]
    message_bytes = int(event.get("overhead_message_bytes", 0))
    if not times or not message_bytes:
        return Calibration(fits=tuple(fits))
    schedule = overhead_schedule(fits, message_bytes)
    overhead = fit_op_overhead_s(fits, schedule, statistics.median(times))
    return Calibration(
        fits=tuple(fits),
        op_overhead_s=overhead,
        overhead_message_bytes=message_bytes,
        overhead_times_s=tuple(times),
    )


def fits_to_dict(fits: Sequence[DimFit]) -> list[dict[str, Any]]:
    return [
        {
            "dim": f.dim,
            "size": f.size,
            "constant_s": f.constant_s,
            "bandwidth_bytes_per_s": f.bandwidth_bytes_per_s,
            "max_relative_residual": f.max_relative_residual,
            "num_samples": f.num_samples,
        }
        for f in fits
    ]


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
    Every sample is the maximum over ranks (the op ends when its slowest rank ends).
    One untimed warm-up per dimension opens the Gloo connections first.

    With ``concurrent_window_s > 0`` a second pass times every dimension *while the
    others are busy too*, as in a pipelined schedule: each dimension repeats its op for
    about that long, in its own thread; those samples replace the isolated ones. On a
    host where the ranks share few cores, an op costs more when every dimension is
    moving data, and a plan of many small ops feels that most.
    """
    import torch.distributed as dist

    from hipipe.torch.groups import rings_for_layout

    rings = [rings_for_layout(sizes, list(groups))[(k,)] for k in range(len(sizes))]
    samples: list[Sample] = []
    for dim, ring in enumerate(rings):
        for position, size_bytes in enumerate([min(sizes_bytes), *sizes_bytes]):
            for _ in range(1 if position == 0 else repeats):
                dist.barrier()
                times = _time_rs_ag(ring, size_bytes, 1, timeout_s)
                dist.all_reduce(times, op=dist.ReduceOp.MAX)
                if position > 0:
                    samples += _samples(dim, size_bytes, times)
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
            per_dim = _concurrently(rings, size_bytes, counts, timeout_s)
            dist.all_reduce(per_dim, op=dist.ReduceOp.MAX)
            for dim in range(len(sizes)):
                concurrent += _samples(dim, size_bytes, per_dim[2 * dim : 2 * dim + 2] / counts[dim])
    return concurrent


def _samples(dim: int, size_bytes: int, times: Any) -> list[Sample]:
    full_bytes = max(1, size_bytes // 4) * 4
    return [
        Sample(dim=dim, phase="RS", full_bytes=full_bytes, time_s=float(times[0])),
        Sample(dim=dim, phase="AG", full_bytes=full_bytes, time_s=float(times[1])),
    ]


def _time_rs_ag(ring: Any, size_bytes: int, count: int, timeout_s: float) -> Any:
    """Run ``count`` RS then ``count`` AG on a float32 buffer; total seconds of each, as a tensor."""
    import torch
    import torch.distributed as dist

    from hipipe.torch.collectives import ring_all_gather, ring_reduce_scatter

    tensor = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32)
    times = torch.zeros(2, dtype=torch.float64)
    t0 = time.perf_counter()
    for _ in range(count):
        ring_reduce_scatter(tensor, ring, timeout_s=timeout_s)
    t1 = time.perf_counter()
    dist.barrier(group=ring.group)
    t2 = time.perf_counter()
    for _ in range(count):
        ring_all_gather(tensor, ring, timeout_s=timeout_s)
    times[0], times[1] = t1 - t0, time.perf_counter() - t2
    return times


def _concurrently(rings: Sequence[Any], size_bytes: int, counts: Sequence[int], timeout_s: float) -> Any:
    """Every dimension's RS/AG loop in its own thread at once; ``[rs0, ag0, rs1, ag1, ...]`` seconds."""
    import threading

    import torch

    out = torch.zeros(2 * len(rings), dtype=torch.float64)
    errors: list[BaseException] = []

    def work(dim: int) -> None:
        try:
            out[2 * dim : 2 * dim + 2] = _time_rs_ag(rings[dim], size_bytes, counts[dim], timeout_s)
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


def fit_all(sizes: Sequence[int], samples: Sequence[Sample]) -> list[DimFit]:
    return [fit_dim(k, sizes[k], samples) for k in range(len(sizes))]


def relative_error(measured: float, predicted: float) -> float:
    """``measured / predicted - 1``; NaN when nothing was predicted."""
    return measured / predicted - 1.0 if predicted > 0 else math.nan
