"""Calibration fitting: from timed ops to an alpha-beta topology. Pure and torch-free.

For each dimension k, the ranks time ring ReduceScatter and AllGather at several sizes
(:mod:`hipipe.testbed.calibrate` measures; this module only fits). The cost model
(HIPIPE.md section 3) says

    t = latency_steps_k * a_k + (n_k - 1)/n_k * S / B_k

so a least-squares line through ``(x = (n_k-1)/n_k * S, t)`` gives ``1/B_k`` as its
slope and ``latency_steps_k * a_k`` as its intercept. The calibrated topology keeps the
dimension kind the testbed emulates (a switch, ring algorithm) so ``plan`` reads it
back and predicts with exactly the measured coefficients. A second, optional number --
the calibrated overheads (:mod:`hipipe.overheads`) -- are fitted from a pipelined run of
the overhead schedule (:func:`overhead_schedule`), which the caller plans once and
hands to every rank: its timed repeats, one traced run and the memory bandwidth.
"""

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hipipe.cost import group_size
from hipipe.overheads import OpCurve, Overheads
from hipipe.planners import plan
from hipipe.predict import cpu_bound_s, latest_arrival_quantile, op_base_times_s, other_dims_busy, predicted_s
from hipipe.schedule import Schedule
from hipipe.simulator import simulate_chunks
from hipipe.testbed.layout import TestbedError
from hipipe.topology import Algorithm, Dimension, Kind, Topology

DEFAULT_CALIBRATION_SIZES_BYTES: tuple[int, ...] = tuple(2**k * 1024 for k in range(5, 14))
"""Per-rank buffer sizes of the calibration ops, 32 KiB to 8 MiB a factor 2 apart: spans
the chunk sizes plans use, densely enough for the streamed op curves to interpolate."""

MIN_BANDWIDTH_BYTES_PER_S = 1.0

CONCURRENT_WINDOW_S = 1.0
"""How long each dimension repeats its op in the concurrent calibration pass (0: no pass,
no concurrency term). One second per size and repeat: ~15 s on a 5-size calibration."""


def calibration_sizes_bytes(
    rates_bits_per_s: Sequence[float], *, largest_op_s: float = 1.0
) -> tuple[int, ...]:
    """Sizes whose largest op takes about ``largest_op_s`` on the slowest dimension.

    Nine sizes a factor 2 apart (1/256 .. 1 of the largest), so both the constant and the
    slope are seen, down to the few-KiB pieces a 64-chunk plan's ops carry on its second
    dim (the line's constant there is what many-op schedules pay most), and densely: the
    streamed op curves interpolate between these points, and a factor 4 left 25% errors
    where the time bends from its constant to its slope (a 32 KiB op read as 11.2 ms off
    points at 8 and 45 KiB; it takes 8.7 ms). The largest is
    kept between 256 KiB and 8 MiB so a calibration takes seconds at 10 Mbit/s and still
    sees megabytes at 1 Gbit/s.
    """
    slowest_bytes_per_s = min(rates_bits_per_s) / 8
    largest = int(min(8 * 2**20, max(256 * 1024, slowest_bytes_per_s * largest_op_s)))
    largest -= largest % 4096
    return tuple(sorted({max(4096, largest // 2**k - (largest // 2**k) % 4096) for k in range(9)}))


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One timed op on one dimension (the slowest rank's time)."""

    dim: int
    phase: str
    """``RS`` or ``AG``."""
    full_bytes: int
    """Per-rank buffer on the op's wide side (RS input, AG output)."""
    time_s: float
    """Seconds per op: a streamed run's total over its ops."""
    concurrent: bool = False
    """Timed while every other dimension ran its own ops too (the concurrency pass)."""
    streamed_ops: int = 1
    """How many ops ran back to back in the timed run (this sample is their mean)."""
    host_cpu_s: float | None = None
    """The host's busy CPU seconds per op over that run, all its ranks (None: not measured)."""
    host_busy_cores: float | None = None
    """Concurrent samples: CPUs the host kept busy over the run (CPU seconds per second)."""


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

    Each sample is the mean op of a streamed run (ops back to back, as a schedule runs
    them on a dimension) and repeats of one (phase, size) are reduced to their median:
    the typical op, which is what a schedule's many ops add up to.
    """
    mine = [s for s in samples if s.dim == dim and not s.concurrent]
    groups = _typical_times_s(mine)
    keys = sorted(groups)
    xs = [(size - 1) / size * full_bytes for _, full_bytes in keys]
    ys = [groups[key] for key in keys]
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


def _typical_times_s(samples: Sequence[Sample]) -> dict[tuple[str, int], float]:
    """``(phase, full_bytes)`` -> the median time per op over the repeats."""
    groups: dict[tuple[str, int], list[float]] = {}
    for sample in samples:
        groups.setdefault((sample.phase, sample.full_bytes), []).append(sample.time_s)
    return {key: statistics.median(values) for key, values in groups.items()}


def fit_op_curves(fits: Sequence[DimFit], samples: Sequence[Sample]) -> tuple[OpCurve, ...]:
    """Per (dim, phase), the measured streamed op times as a curve (:class:`OpCurve`).

    The line of :func:`fit_dim` cannot follow them: a small op pays per ring step for the
    ranks to be scheduled, which a large op's transfer hides (docs/MODEL.md section 10),
    so the curve is what :mod:`hipipe.predict` reads single-dimension ops off. The
    concurrency pass's samples make a second, ``busy`` curve per (dim, phase).
    """
    curves = []
    for fit in fits:
        for busy in (False, True):
            typical = _typical_times_s([s for s in samples if s.dim == fit.dim and s.concurrent == busy])
            for phase in ("RS", "AG"):
                points = tuple((float(b), t) for (p, b), t in sorted(typical.items()) if p == phase)
                if points:
                    curves.append(OpCurve(dim=fit.dim, phase=phase, points=points, busy=busy))
    return tuple(curves)


def calibrated_topology(
    fits: Sequence[DimFit], *, name: str = "calibrated", overheads: Overheads | None = None
) -> Topology:
    """A topology whose alpha-beta terms reproduce the fitted lines exactly, plus ``overheads``.

    Each dimension is a switch with the ring algorithm, whose ``latency_steps`` is
    2 (n-1): the per-link latency is the op's fitted constant divided by that.
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
    return Topology(dims=tuple(dims), name=name, overheads=overheads or Overheads())


OVERHEAD_PLANNER = "pipelined"
"""The schedule that calibrates the overheads: many chunks, every dimension busy, the
hand-offs and the concurrency a pipelined plan has, and a plan the tuner never keeps."""

OVERHEAD_NUM_CHUNKS = 32

OVERHEAD_SCHEDULE_NAME = f"{OVERHEAD_PLANNER} K={OVERHEAD_NUM_CHUNKS}"
"""How a calibration's JSON names its overhead schedule."""

MIN_TRACE_SAMPLES = 5
"""Fewest ops behind a fitted hand-off or concurrency term; fewer: the term stays 0."""

BISECTION_STEPS = 20
"""Halvings of [0, measured] when fitting the per-op cost: within 1e-6 of the measured time."""


def overhead_schedule(fits: Sequence[DimFit], message_bytes: int) -> Schedule:
    """The schedule every rank runs to measure the overheads, planned once by the caller."""
    return plan(calibrated_topology(fits), message_bytes, OVERHEAD_PLANNER, num_chunks=OVERHEAD_NUM_CHUNKS)


@dataclass(frozen=True, kw_only=True, slots=True)
class OverheadRun:
    """What the ranks measured running the overhead schedule."""

    schedule: Schedule
    times_s: tuple[float, ...]
    """The slowest rank's time per timed repeat."""
    op_times_s: tuple[tuple[float, float], ...] = ()
    """``(start_s, end_s)`` per op of one more, traced, run on rank 0 (empty: not traced)."""
    memory_bytes_per_s: float = 0.0
    """Rank 0's bandwidth for ``out = a + b`` (0: not measured)."""
    more_traces: tuple[tuple[tuple[float, float], ...], ...] = ()
    """Traced runs of the other worker jobs, like ``op_times_s``: the hand-off and the jitter
    are fitted on every trace together."""
    host_cpu_s: tuple[float, ...] = ()
    """The host's busy CPU seconds during each timed repeat, read by rank 0 (empty: not
    read): what the host's CPU term is scaled to (:func:`host_cpu_scale`)."""

    @property
    def traces(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        """Every complete trace (one ``(start_s, end_s)`` per op of the schedule)."""
        num_ops = len(self.schedule.ops)
        return tuple(t for t in (self.op_times_s, *self.more_traces) if num_ops and len(t) == num_ops)


def fit_concurrency_slowdown(fits: Sequence[DimFit], samples: Sequence[Sample]) -> float:
    """Slowdown per other busy dim, from the concurrency pass against the isolated ops.

    For each dim and size: the median concurrent time over the median isolated one,
    minus 1, over ``D - 1`` (every other dim was busy). The median of those. The whole
    op stretches, not just its wire time: on a shared host the other dims' threads take
    the cores a small op's steps need as much as they share the NIC. 0 without a
    concurrency pass or with one dim. A calibration with busy curves
    (:func:`fit_op_curves`) does not use it: they carry the slowdown per size.
    """
    if len(fits) < 2:
        return 0.0
    estimates = []
    for fit in fits:
        alone = [s for s in samples if s.dim == fit.dim and not s.concurrent]
        busy = [s for s in samples if s.dim == fit.dim and s.concurrent]
        for size in sorted({s.full_bytes for s in busy}):
            isolated = [s.time_s for s in alone if s.full_bytes == size]
            concurrent = [s.time_s for s in busy if s.full_bytes == size]
            if not isolated or not concurrent:
                continue
            ratio = statistics.median(concurrent) / statistics.median(isolated)
            estimates.append((ratio - 1) / (len(fits) - 1))
    return max(0.0, statistics.median(estimates)) if estimates else 0.0


def host_cpu_scale(schedule: Schedule, run: OverheadRun) -> float | None:
    """Measured over modelled host CPU of the overhead run; None when either is missing.

    ``schedule`` is the overhead schedule on a topology whose overheads charge the host's
    CPU as the isolated samples fitted it (:func:`fit_host_cpu`). Those samples run one op
    per dim at a time, a few ranks' threads on the cores; a pipelined run keeps every dim
    busy on every rank, and each step then costs more CPU (threads woken more often,
    caches shared). On the 2-core testbed the many-op rows spent 1.0-1.5x the CPU the
    samples' fit charges them, the factor moving with the host from run to run, and the
    fit itself moved 3x between calibrations: scaled to a run of every dim at once, the CPU
    bound of a many-op schedule follows its measured time within a few percent where the
    unscaled one missed by up to 20% (docs/MODEL.md section 10).
    """
    overheads = schedule.topology.overheads
    if not run.host_cpu_s or not overheads.charges_cpu:
        return None
    modelled_s = cpu_bound_s(schedule) * overheads.host_cores
    measured_s = statistics.median(run.host_cpu_s)
    return measured_s / modelled_s if modelled_s > 0 and measured_s > 0 else None


def run_busy_cores(run: OverheadRun) -> float | None:
    """The CPUs the host kept busy in the overhead run: the median over its timed repeats of
    busy CPU seconds over seconds (None: CPU not read)."""
    if not run.host_cpu_s or len(run.host_cpu_s) != len(run.times_s):
        return None
    return statistics.median(c / t for c, t in zip(run.host_cpu_s, run.times_s, strict=True) if t > 0)


def fit_overheads(
    fits: Sequence[DimFit],
    run: OverheadRun,
    *,
    concurrency_slowdown: float = 0.0,
    op_curves: Sequence[OpCurve] = (),
    host: Overheads | None = None,
) -> Overheads:
    """Every calibrated term from one pipelined run (docs/MODEL.md section 10).

    - streamed op times (``op_curves``) and memory bandwidth: measured directly;
    - hand-off: the median wait of an op whose dimension was already free when its
      chunk's previous op (on another dimension) ended, over every traced run (one per
      worker job): under jitter a single trace may hold fewer than
      :data:`MIN_TRACE_SAMPLES` such ops, and the hand-off then stays 0 while the per-op
      cost fitted last absorbs it (the tests show it on synthetic traces; on the 2-core
      testbed three calibrations of one cell with pooled traces still read 0-0.5 ms);
    - concurrency: given (:func:`fit_concurrency_slowdown`, from the concurrency pass);
    - the host's CPU: given (``host``'s host terms: :func:`fit_host_cpu`, scaled by
      :func:`host_cpu_scale`), so the per-op cost below is only what the CPU bound leaves
      unexplained;
    - jitter: the mean of an exponential fitted (by its median absolute deviation) to
      what is left of those excesses;
    - per-op cost: last, by bisection, so that the predicted median (:mod:`hipipe.predict`,
      with all the above) equals the measured median. 0 if the run was not slower.
    """
    host = host or Overheads()
    base = calibrated_topology(
        fits,
        overheads=Overheads(
            memory_bytes_per_s=run.memory_bytes_per_s,
            concurrency_slowdown=concurrency_slowdown,
            op_curves=tuple(op_curves),
            host_cores=host.host_cores,
            host_ranks=host.host_ranks,
            cpu_step_s=host.cpu_step_s,
            cpu_byte_s=host.cpu_byte_s,
        ),
    )
    schedule = replace(run.schedule, topology=base)
    measured_s = statistics.median(run.times_s)
    traces = run.traces
    traced = bool(traces)
    overheads = base.overheads
    if traced:
        overheads = replace(overheads, handoff_s=_fit_handoff_s(schedule, traces))
    # The relative durations are taken against the model with the per-op cost in, which
    # depends on them in turn: two rounds settle it (the second moves op_s by < 1%).
    for _ in range(2 if traced else 1):
        overheads = replace(overheads, op_s=fit_op_s(schedule, overheads, measured_s))
        if traced:
            with_op = retime(schedule, replace(base, overheads=replace(overheads, jitter_s=0.0)))
            overheads = replace(overheads, jitter_s=_fit_jitter_s(with_op, traces))
    return replace(overheads, op_s=fit_op_s(schedule, overheads, measured_s))


def fit_op_s(schedule: Schedule, overheads: Overheads, measured_s: float) -> float:
    """The per-op cost whose predicted median equals ``measured_s`` (the rest fixed); 0 if none."""

    def predicted(op_s: float) -> float:
        topology = replace(schedule.topology, overheads=replace(overheads, op_s=op_s))
        return predicted_s(retime(schedule, topology))

    if predicted(0.0) >= measured_s:
        return 0.0
    low, high = 0.0, measured_s
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if predicted(middle) < measured_s:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def retime(schedule: Schedule, topology: Topology) -> Schedule:
    """``schedule``'s chunks and sequences timed on ``topology`` (its linear terms)."""
    return simulate_chunks(
        topology,
        schedule.message_bytes,
        schedule.chunks,
        policy="fixed",
        sequences=schedule.sequences,
        planner=schedule.planner,
        collective=schedule.collective,
    )


TracedOps = Sequence[tuple[float, float]]
"""``(start_s, end_s)`` per op of the overhead schedule, one traced run on rank 0."""


def _fit_handoff_s(schedule: Schedule, traces: Sequence[TracedOps]) -> float:
    """The median wait, over every trace, of an op whose dim was free when its chunk's
    previous op (on another dim) ended."""
    previous_on_dim: dict[int, int] = {}
    for sequence in schedule.sequences:
        for before, after in itertools.pairwise(sequence):
            previous_on_dim[after] = before
    waits = []
    for op_times_s in traces:
        for op in schedule.ops:
            if op.step == 0:
                continue
            chain_before = op.index - 1
            if schedule.ops[chain_before].dims == op.dims:
                continue
            ready_s = op_times_s[chain_before][1]
            dim_before = previous_on_dim.get(op.index)
            if dim_before is not None and op_times_s[dim_before][1] > ready_s:
                continue  # it waited for its dimension, not for the hand-off
            waits.append(max(0.0, op_times_s[op.index][0] - ready_s))
    return statistics.median(waits) if len(waits) >= MIN_TRACE_SAMPLES else 0.0


def _fit_jitter_s(schedule: Schedule, traces: Sequence[TracedOps]) -> float:
    """The mean arrival delay from rank 0's traced op durations (every trace pooled).

    Each op's excess over the model (``schedule``'s topology without jitter: the lines or
    the streamed op curves, the per-op cost, the reduction, the slowdown for the other
    dims busy while it ran in the trace) is,
    per group size n, spread like the latest of n arrivals: the mean delay whose
    latest-of-n has that median absolute deviation (:func:`latest_arrival_mad`),
    averaged over the ops. Robust to the rare op a descheduled rank stretches tenfold.
    """
    topology = schedule.topology
    base_s = op_base_times_s(schedule)
    left: dict[int, list[float]] = {}
    for op_times_s in traces:
        for op in schedule.ops:
            start_s, end_s = op_times_s[op.index]
            others = other_dims_busy(schedule, op_times_s, op.index)
            modelled_s = base_s(op.index, others)
            left.setdefault(group_size(topology, op.dims), []).append(end_s - start_s - modelled_s)
    estimates = [
        (len(values), _mad(values) / latest_arrival_mad(n)) for n, values in left.items() if len(values) >= 2
    ]
    if sum(count for count, _ in estimates) < MIN_TRACE_SAMPLES:
        return 0.0
    return sum(count * mean for count, mean in estimates) / sum(count for count, _ in estimates)


def _mad(values: Sequence[float]) -> float:
    center = statistics.median(values)
    return statistics.median(abs(v - center) for v in values)


def latest_arrival_mad(members: int) -> float:
    """Median absolute deviation of the latest of ``members`` unit-mean exponential delays.

    Solved by bisection on ``F(m + d) - F(m - d) = 1/2`` with ``F(x) = (1 - e^-x)^n`` and
    ``m`` the median (0.4813 for one member).
    """

    def cdf(x: float) -> float:
        return (1 - math.exp(-x)) ** members if x > 0 else 0.0

    median = latest_arrival_quantile(members, 0.5)
    low, high = 0.0, 50.0
    for _ in range(60):
        middle = (low + high) / 2
        if cdf(median + middle) - cdf(median - middle) < 0.5:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCpuFit:
    """One rank's CPU per ring step and per byte sent, fitted on the isolated samples."""

    cpu_step_s: float
    cpu_byte_s: float
    max_relative_residual: float
    num_samples: int
    busy_cores: float | None = None
    """The most CPUs the host kept busy in the concurrent pass (None: not measured)."""


def busiest_cores(samples: Sequence[Sample]) -> float | None:
    """The most CPUs the host kept busy in the concurrent pass (None: not measured)."""
    return max((s.host_busy_cores for s in samples if s.concurrent and s.host_busy_cores), default=None)


def host_cores_of(samples: Sequence[Sample], usable_cores: int) -> float:
    """The CPUs a schedule's ranks can keep busy: the concurrent pass's most, at most ``usable_cores``.

    With every dim busy on every rank the ranks load the host as much as any schedule
    can (a schedule runs at most one op per dim on a rank), and on the 2-core testbed they
    reach 1.9 CPUs, not 2: threads wait on the wire or on each other in between. Without
    a concurrent pass (one dim, or none measured): ``usable_cores``.
    """
    busiest = busiest_cores(samples)
    return float(usable_cores) if busiest is None else min(float(usable_cores), busiest)


def fit_host_cpu(fits: Sequence[DimFit], samples: Sequence[Sample], *, host_ranks: int) -> HostCpuFit | None:
    """``cpu = steps * cpu_step_s + sent_bytes * cpu_byte_s`` per rank and op, fitted on relative residuals.

    Each isolated sample ran the op in every group along its dimension at once, so every
    one of the host's ``host_ranks`` ranks ran one op: a rank's share is the host's CPU
    per op over ``host_ranks``. A ring op over ``n`` ranks has ``n - 1`` steps and sends
    ``(n-1)/n`` of its bytes. Least squares without intercept, weighted ``1/y^2`` like the
    lines (a 16 KiB op's CPU matters as much to a 64-chunk plan as an 8 MiB op's to a
    1-chunk plan); a coefficient that comes out negative is dropped and the other refitted
    alone. None without CPU samples or when the ranks' sizes do not make steps and bytes
    separable.
    """
    if host_ranks < 1:
        return None
    sizes = {f.dim: f.size for f in fits}
    rows = [
        (sizes[s.dim] - 1, (sizes[s.dim] - 1) / sizes[s.dim] * s.full_bytes, s.host_cpu_s / host_ranks)
        for s in samples
        if not s.concurrent and s.host_cpu_s is not None and s.host_cpu_s > 0 and s.dim in sizes
    ]
    if len(rows) < 2:
        return None
    weights = [1.0 / y**2 for _, _, y in rows]

    def one(column: int) -> float:
        num = sum(w * r[column] * r[2] for w, r in zip(weights, rows, strict=True))
        den = sum(w * r[column] ** 2 for w, r in zip(weights, rows, strict=True))
        return num / den if den > 0 else 0.0

    s11 = sum(w * a * a for w, (a, _, _) in zip(weights, rows, strict=True))
    s12 = sum(w * a * b for w, (a, b, _) in zip(weights, rows, strict=True))
    s22 = sum(w * b * b for w, (_, b, _) in zip(weights, rows, strict=True))
    r1 = sum(w * a * y for w, (a, _, y) in zip(weights, rows, strict=True))
    r2 = sum(w * b * y for w, (_, b, y) in zip(weights, rows, strict=True))
    det = s11 * s22 - s12 * s12
    if det <= 1e-12 * max(s11 * s22, 1e-300):
        return None
    step_s, byte_s = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
    if step_s < 0:
        step_s, byte_s = 0.0, max(0.0, one(1))
    elif byte_s < 0:
        step_s, byte_s = max(0.0, one(0)), 0.0
    residual = max(abs(step_s * a + byte_s * b - y) / y for a, b, y in rows)
    return HostCpuFit(
        cpu_step_s=step_s,
        cpu_byte_s=byte_s,
        max_relative_residual=residual,
        num_samples=len(rows),
        busy_cores=busiest_cores(samples),
    )


def _ols(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Plain least squares ``y = intercept + slope x``; raises when ``x`` does not vary."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0:
        raise TestbedError("no spread in x")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return mean_y - slope * mean_x, slope


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Per-dimension lines plus the overheads measured inside a pipelined run."""

    fits: tuple[DimFit, ...]
    overheads: Overheads = field(default_factory=Overheads)
    host_cpu: HostCpuFit | None = None
    """How well the host term's line fits its samples (None: not calibrated)."""
    host_cpu_scale: float | None = None
    """The overhead run's measured host CPU over what the samples' fit charges it; the
    host terms in ``overheads`` are ``host_cpu``'s times this (None: not scaled)."""
    overhead_run: OverheadRun | None = None
    """The run the overheads were fitted on (None: no overhead run)."""

    @property
    def overhead_message_bytes(self) -> int:
        """The overhead schedule's message (0: no overhead run)."""
        return self.overhead_run.schedule.message_bytes if self.overhead_run else 0

    @property
    def overhead_times_s(self) -> tuple[float, ...]:
        """The overhead run's timed repeats (empty: no overhead run)."""
        return self.overhead_run.times_s if self.overhead_run else ()

    def topology(self, name: str = "calibrated") -> Topology:
        return calibrated_topology(self.fits, name=name, overheads=self.overheads)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dims": fits_to_dict(self.fits),
            "overheads": self.overheads.to_dict(),
            "overhead_schedule": OVERHEAD_SCHEDULE_NAME,
            "overhead_message_bytes": self.overhead_message_bytes,
            "overhead_times_s": list(self.overhead_times_s),
            "overhead_host_cpu_s": list(self.overhead_run.host_cpu_s) if self.overhead_run else [],
        } | (
            {}
            if self.host_cpu is None
            else {
                "host_cpu": {
                    "max_relative_residual": self.host_cpu.max_relative_residual,
                    "num_samples": self.host_cpu.num_samples,
                    "busy_cores": self.host_cpu.busy_cores,
                    "scale": self.host_cpu_scale,
                }
            }
        )


def calibration_from_samples(
    sizes: Sequence[int],
    samples: Sequence[Sample],
    *,
    overhead: OverheadRun | None = None,
    host_ranks: int = 0,
    host_cores: int = 0,
) -> Calibration:
    """Fit the samples, and the overheads if the overhead schedule was run.

    ``overhead.schedule`` is the schedule the ranks ran (:func:`overhead_schedule` of these
    samples' fits): passed in rather than re-planned, so the fit replays exactly what ran.
    ``host_ranks`` ranks shared ``host_cores`` usable CPUs on the host whose CPU the
    samples measured (0: the host term is not fitted); the term charges the most of them
    the ranks kept busy (:func:`host_cores_of`).
    """
    fits = fit_all(sizes, samples)
    curves = fit_op_curves(fits, samples)
    # Busy curves carry the contention per size; a scalar slowdown on top would charge it twice.
    concurrency = 0.0 if any(c.busy for c in curves) else fit_concurrency_slowdown(fits, samples)
    cpu = fit_host_cpu(fits, samples, host_ranks=host_ranks) if host_ranks > 0 and host_cores > 0 else None
    host = (
        Overheads()
        if cpu is None
        else Overheads(
            host_cores=host_cores_of(samples, host_cores),
            host_ranks=host_ranks,
            cpu_step_s=cpu.cpu_step_s,
            cpu_byte_s=cpu.cpu_byte_s,
        )
    )
    if overhead is None or not overhead.times_s:
        return Calibration(
            fits=tuple(fits),
            overheads=replace(host, concurrency_slowdown=concurrency, op_curves=curves),
            host_cpu=cpu,
        )
    return _fitted_on_run(
        fits, cpu, replace(host, concurrency_slowdown=concurrency, op_curves=curves), overhead
    )


def refit_on_run(calibration: Calibration, run: OverheadRun) -> Calibration:
    """``calibration`` with its overheads fitted again on ``run``, another run of its
    overhead schedule: the same lines, curves and isolated CPU fit, the overhead terms and
    the CPU scale from ``run``.

    ``hipipe bench`` runs the overhead schedule again among its rows' jobs and predicts the
    rows on this: on a 2-core host the CPU a step costs moves by tens of percent between
    minutes, and a calibration taken before the rows predicted them from another minute's
    host (docs/MODEL.md section 10).
    """
    if calibration.overhead_run is None:
        raise TestbedError("this calibration has no overhead run to fit again")
    if run.schedule != calibration.overhead_run.schedule:
        raise TestbedError("the run is not of this calibration's overhead schedule")
    given = calibration.overheads
    host = Overheads(concurrency_slowdown=given.concurrency_slowdown, op_curves=given.op_curves)
    if calibration.host_cpu is not None:
        host = replace(
            host,
            host_cores=given.host_cores,
            host_ranks=given.host_ranks,
            cpu_step_s=calibration.host_cpu.cpu_step_s,
            cpu_byte_s=calibration.host_cpu.cpu_byte_s,
        )
    return _fitted_on_run(list(calibration.fits), calibration.host_cpu, host, run)


def _fitted_on_run(
    fits: list[DimFit], cpu: HostCpuFit | None, given: Overheads, run: OverheadRun
) -> Calibration:
    """The calibration of ``fits`` with the overheads ``run`` measures on top of ``given``
    (concurrency, curves and the host terms, scaled here to the run's measured CPU).

    The overhead run, every dim busy on every rank for its whole length, may keep more of
    the host's CPUs busy than the concurrent pass's short windows did (1.80-1.85 against
    1.72 on a 2x2x2 testbed): the host term then shares the work over the run's count.
    """
    scale = host_cpu_scale(replace(run.schedule, topology=calibrated_topology(fits, overheads=given)), run)
    if scale is not None:
        given = replace(given, cpu_step_s=given.cpu_step_s * scale, cpu_byte_s=given.cpu_byte_s * scale)
    busy = run_busy_cores(run)
    if given.charges_cpu and busy is not None and busy > given.host_cores:
        given = replace(given, host_cores=busy)
    return Calibration(
        fits=tuple(fits),
        overheads=fit_overheads(
            fits,
            run,
            concurrency_slowdown=given.concurrency_slowdown,
            op_curves=given.op_curves,
            host=given,
        ),
        host_cpu=cpu,
        host_cpu_scale=scale,
        overhead_run=run,
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
