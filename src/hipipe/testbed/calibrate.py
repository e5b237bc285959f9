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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hipipe.testbed.layout import TestbedError
from hipipe.topology import Algorithm, Dimension, Kind, Topology

DEFAULT_CALIBRATION_SIZES_BYTES: tuple[int, ...] = (128 * 1024, 1024 * 1024, 4 * 1024 * 1024, 8 * 1024 * 1024)
"""Per-rank buffer sizes of the calibration ops: spans the chunk sizes plans use."""

MIN_BANDWIDTH_BYTES_PER_S = 1.0


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
    """Fit one dimension's samples (RS and AG pooled: the model charges them alike)."""
    mine = [s for s in samples if s.dim == dim]
    xs = [(size - 1) / size * s.full_bytes for s in mine]
    ys = [s.time_s for s in mine]
    intercept, slope = fit_line(xs, ys)
    if not slope > 0:
        raise TestbedError(f"dimension {dim}: time does not grow with size (slope {slope:.3g} s/B)")
    constant = max(0.0, intercept)
    residual = max(abs(y - (constant + slope * x)) / y for x, y in zip(xs, ys, strict=True) if y > 0)
    return DimFit(
        dim=dim,
        size=size,
        constant_s=constant,
        per_byte_s=slope,
        max_relative_residual=residual,
        num_samples=len(mine),
    )


def calibrated_topology(fits: Sequence[DimFit], *, name: str = "calibrated") -> Topology:
    """A topology whose cost model reproduces the fitted lines exactly.

    Each dimension is a switch with the ring algorithm, whose ``latency_steps`` is
    2 (n-1): the per-link latency is the fitted constant divided by that.
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
                latency_s=fit.constant_s / template.latency_steps,
                algorithm=Algorithm.RING,
            )
        )
    return Topology(dims=tuple(dims), name=name)


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
) -> list[Sample]:
    """Time ring RS and AG on each dimension; call on every rank of an initialized world.

    ``groups`` are the per-dimension process groups (:func:`hipipe.torch.groups.dimension_groups`).
    Every sample is the maximum over ranks (the op ends when its slowest rank ends).
    One untimed warm-up per dimension opens the Gloo connections first.
    """
    import torch
    import torch.distributed as dist

    from hipipe.torch.collectives import ring_all_gather, ring_reduce_scatter
    from hipipe.torch.groups import rings_for_layout

    rings = rings_for_layout(sizes, list(groups))
    samples: list[Sample] = []
    for dim in range(len(sizes)):
        ring = rings[(dim,)]
        for position, size_bytes in enumerate([min(sizes_bytes), *sizes_bytes]):
            tensor = torch.ones(max(1, size_bytes // 4), dtype=torch.float32)
            for _ in range(1 if position == 0 else repeats):
                times = torch.zeros(2, dtype=torch.float64)
                dist.barrier()
                t0 = time.perf_counter()
                ring_reduce_scatter(tensor, ring, timeout_s=timeout_s)
                t1 = time.perf_counter()
                dist.barrier(group=ring.group)
                t2 = time.perf_counter()
                ring_all_gather(tensor, ring, timeout_s=timeout_s)
                t3 = time.perf_counter()
                times[0], times[1] = t1 - t0, t3 - t2
                dist.all_reduce(times, op=dist.ReduceOp.MAX)
                if position == 0:
                    continue
                full_bytes = tensor.numel() * tensor.element_size()
                samples.append(Sample(dim=dim, phase="RS", full_bytes=full_bytes, time_s=float(times[0])))
                samples.append(Sample(dim=dim, phase="AG", full_bytes=full_bytes, time_s=float(times[1])))
    return samples


def fit_all(sizes: Sequence[int], samples: Sequence[Sample]) -> list[DimFit]:
    return [fit_dim(k, sizes[k], samples) for k in range(len(sizes))]


def relative_error(measured: float, predicted: float) -> float:
    """``measured / predicted - 1``; NaN when nothing was predicted."""
    return measured / predicted - 1.0 if predicted > 0 else math.nan
