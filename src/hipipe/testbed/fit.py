"""Calibration fitting: from timed ops to an alpha-beta topology. Pure and torch-free.

For each dimension k, the ranks time ring ReduceScatter and AllGather at several sizes
(:mod:`hipipe.testbed.calibrate` measures; this module only fits). The cost model
(HIPIPE.md section 3) says

    t = latency_steps_k * a_k + (n_k - 1)/n_k * S / B_k

so a least-squares line through ``(x = (n_k-1)/n_k * S, t)`` gives ``1/B_k`` as its
slope and ``latency_steps_k * a_k`` as its intercept. The calibrated topology keeps the
dimension kind the testbed emulates (a switch, ring algorithm) so ``plan`` reads it
back and predicts with exactly the measured coefficients. A second, optional number --
the per-op overhead inside a pipelined run -- is fitted against the simulator replaying
the overhead schedule (:func:`overhead_schedule`), which the caller plans once and
hands to every rank.
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hipipe.planners import plan
from hipipe.schedule import Schedule
from hipipe.simulator import simulate_chunks
from hipipe.testbed.layout import TestbedError
from hipipe.topology import Algorithm, Dimension, Kind, Topology

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


def overhead_schedule(fits: Sequence[DimFit], message_bytes: int) -> Schedule:
    """The schedule every rank runs to measure the per-op overhead, planned once by the caller."""
    return plan(calibrated_topology(fits), message_bytes, OVERHEAD_PLANNER, num_chunks=OVERHEAD_NUM_CHUNKS)


def fit_op_overhead_s(fits: Sequence[DimFit], schedule: Schedule, measured_s: float) -> float:
    """The extra constant per op that makes the simulated makespan equal the measured one.

    The per-dimension lines are measured one op at a time. Inside a pipelined run an op
    also waits for its chunk's previous op on *other* groups of ranks, and with several
    ranks per core every such hand-off costs scheduling delay. One number per testbed,
    found by bisection on the simulator replaying ``schedule``'s own sequences; 0 if the
    run was not slower than predicted.
    """

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


def calibration_from_samples(
    sizes: Sequence[int],
    samples: Sequence[Sample],
    *,
    overhead: Schedule | None = None,
    overhead_times_s: Sequence[float] = (),
) -> Calibration:
    """Fit the samples, and the per-op overhead if ``overhead`` was run (``overhead_times_s``).

    ``overhead`` is the schedule the ranks ran (:func:`overhead_schedule` of these
    samples' fits): passed in rather than re-planned, so the fit replays exactly what ran.
    """
    fits = fit_all(sizes, samples)
    if overhead is None or not overhead_times_s:
        return Calibration(fits=tuple(fits))
    op_overhead_s = fit_op_overhead_s(fits, overhead, statistics.median(overhead_times_s))
    return Calibration(
        fits=tuple(fits),
        op_overhead_s=op_overhead_s,
        overhead_message_bytes=overhead.message_bytes,
        overhead_times_s=tuple(overhead_times_s),
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


def fit_all(sizes: Sequence[int], samples: Sequence[Sample]) -> list[DimFit]:
    return [fit_dim(k, sizes[k], samples) for k in range(len(sizes))]


def relative_error(measured: float, predicted: float) -> float:
    """``measured / predicted - 1``; NaN when nothing was predicted."""
    return measured / predicted - 1.0 if predicted > 0 else math.nan
