"""The result model of a testbed benchmark: what was asked, what was measured. Torch-free.

:mod:`hipipe.testbed.bench` fills it; :mod:`hipipe.report.bench` renders it (terminal,
markdown, JSON); :mod:`hipipe.tuning` reads measured rows the same way.
"""

import math
import statistics
from dataclasses import dataclass, field

from hipipe.cost import busbw_bytes_per_s
from hipipe.repeats import (
    DEFAULT_EXTRA_JOBS,
    DEFAULT_JOBS,
    DEFAULT_MAX_REPEATS,
    DEFAULT_PRECISION,
    RepeatRule,
    jobs_problem,
    repeat_problem,
)
from hipipe.schedule import Collective, Schedule
from hipipe.testbed.fit import CONCURRENT_WINDOW_S, Calibration
from hipipe.testbed.layout import TestbedError
from hipipe.testbed.ratecheck import DimRate
from hipipe.topology import Topology
from hipipe.tuning.cache import TunedEntry
from hipipe.tuning.candidates import DEFAULT_BEST_FEW


def torch_row_name(collective: Collective) -> str:
    """Row name of the reference for ``collective``; its prediction is the flat ``ring``
    model (Gloo runs a ring)."""
    return f"torch.distributed.{collective.torch_function}"


TORCH_NAME = torch_row_name(Collective.ALL_REDUCE)
"""The AllReduce reference row (the default collective)."""


def is_torch_row(name: str) -> bool:
    """Whether a row is torch's reference (of any collective) rather than a planner's."""
    return name in {torch_row_name(c) for c in Collective}


THEMIS = "themis"

TUNED_NAME = "hipipe-tuned"
"""Row name of the schedule ``hipipe tune`` kept (:class:`BenchConfig` ``tuned``)."""

DEFAULT_PLANNERS: tuple[str, ...] = ("hipipe", "themis", "pipelined", "hierarchical")


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchConfig:
    """Everything one ``hipipe bench`` run needs; defaults are the CLI's."""

    sizes: tuple[int, ...]
    rates_bits_per_s: tuple[float, ...]
    messages_bytes: tuple[int, ...]
    """Full per-rank buffers (a ReduceScatter's input, an AllGather's output)."""
    collective: Collective = Collective.ALL_REDUCE
    planners: tuple[str, ...] = DEFAULT_PLANNERS
    include_torch: bool = True
    warmup: int = 1
    repeats: int = 3
    """Timed runs per row, at least; more while the median is unsettled (:attr:`repeat_rule`)."""
    max_repeats: int = DEFAULT_MAX_REPEATS
    """Timed runs per row, at most (``repeats``: a fixed count)."""
    precision: float = DEFAULT_PRECISION
    """A row stops once its median's relative standard error is within this."""
    jobs: int = DEFAULT_JOBS
    """Worker jobs each row's runs (and the calibration's overhead run, and each tuning
    candidate's) are spread over (:data:`~hipipe.repeats.DEFAULT_JOBS`)."""
    extra_jobs: int = DEFAULT_EXTRA_JOBS
    """Jobs a row (and the overhead run among the rows) may take beyond ``jobs`` while its
    median is unsettled (:data:`~hipipe.repeats.DEFAULT_EXTRA_JOBS`); 0: exactly ``jobs``."""
    calibrate: bool = True
    calibration_sizes_bytes: tuple[int, ...] | None = None
    """None: :func:`calibration_sizes_bytes` of the rates."""
    calibration_repeats: int = 3
    calibration_concurrent_s: float = CONCURRENT_WINDOW_S
    """Window of the concurrent calibration pass (every dimension busy); 0: isolated only."""
    calibrate_overhead: bool = True
    """Also measure the per-op overhead inside a pipelined run (:func:`fit_overheads`)."""
    refit_in_rows: bool = True
    """Run the calibration's overhead schedule again in the rows' jobs and predict the rows
    on the overheads fitted to that run (:func:`~hipipe.testbed.fit.refit_on_run`); False:
    on the calibration's own run, taken before the rows."""
    rate_check_s: float = 1.0
    """Seconds of rate check per dimension before the runs; 0 skips it."""
    gantt_planner: str = "hipipe"
    tuned: tuple[Schedule, ...] = ()
    """Schedules from a tuning cache, one per message size: each adds a :data:`TUNED_NAME` row."""
    tune: bool = False
    """Tune each size on this testbed and calibration first (``hipipe tune``'s candidates, with
    this run's baselines), then measure the kept schedule again as the :data:`TUNED_NAME` row."""
    tune_best_few: int = DEFAULT_BEST_FEW
    """hipipe plans among the tuning candidates (``hipipe tune --best-few``)."""

    def __post_init__(self) -> None:
        problem = repeat_problem(self.repeats, self.max_repeats, self.precision) or jobs_problem(
            self.jobs, self.extra_jobs
        )
        if problem is not None:
            raise TestbedError(problem)
        if self.warmup < 0:
            raise TestbedError(f"--warmup must be at least 0, got {self.warmup}")
        if not self.messages_bytes or any(m % 4 or m <= 0 for m in self.messages_bytes):
            raise TestbedError("message sizes must be positive multiples of 4 bytes (float32 elements)")
        if not self.planners and not self.include_torch and not self.tuned:
            raise TestbedError("nothing to run: no planner and no torch reference")
        if any(m % (4 * math.prod(self.sizes)) for m in self.messages_bytes) and (
            self.collective is not Collective.ALL_REDUCE
        ):
            raise TestbedError(
                f"a {self.collective.value} message must split into {math.prod(self.sizes)} equal float32 shards"
            )
        wrong = [s for s in self.tuned if s.collective is not self.collective]
        if wrong:
            raise TestbedError(
                f"the tuned schedule computes {wrong[0].collective.value}, the bench runs {self.collective.value}"
            )
        tuned_sizes = sorted(s.message_bytes for s in self.tuned)
        if self.tuned and tuned_sizes != sorted(self.messages_bytes):
            raise TestbedError("give one tuned schedule per message size")
        if self.tune and self.tuned:
            raise TestbedError("tune here or read tuned schedules from a cache, not both")
        if self.tune and self.tune_best_few < 1:
            raise TestbedError("need at least one hipipe candidate to tune (best few >= 1)")

    @property
    def torch_name(self) -> str:
        return torch_row_name(self.collective)

    @property
    def repeat_rule(self) -> RepeatRule:
        return RepeatRule(repeats=self.repeats, max_repeats=self.max_repeats, precision=self.precision)

    @property
    def runs_range(self) -> tuple[int, int]:
        """Fewest and most timed runs a row takes over its ``jobs`` jobs (each job's share
        of the rule, :meth:`~hipipe.repeats.RepeatRule.per_job`, rounds up); an unsettled row
        may take :attr:`usable_extra_jobs` more jobs of the same share."""
        per_job = self.repeat_rule.per_job(self.jobs)
        return per_job.repeats * self.jobs, per_job.max_repeats * self.jobs

    @property
    def usable_extra_jobs(self) -> int:
        """The extra jobs an unsettled row may take: ``extra_jobs``, or 0 for a fixed count
        (a fixed count is always settled)."""
        return self.extra_jobs if self.repeat_rule.adaptive else 0


MIN_CORRELATED_RUNS = 4
"""Fewest timed runs :attr:`BenchRow.cpu_time_correlation` is computed on: with three, a
correlation of 0.9 arises by chance one time in seven."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchRow:
    """One planner (or the torch reference) at one message size."""

    name: str
    message_bytes: int
    num_ranks: int
    times_s: tuple[float, ...]
    predicted_s: float
    """The plan's makespan on the calibrated topology (torch: the flat ring model)."""
    collective: Collective = Collective.ALL_REDUCE
    host_cpu_s: tuple[float, ...] = ()
    """The host's busy CPU seconds during each timed run (empty: not measured)."""
    cpu_bound_s: float = 0.0
    """The plan's CPU work on the calibrated host over its CPUs (0: not charged), the floor
    the prediction includes (:func:`hipipe.predict.cpu_bound_s`)."""
    schedule: Schedule | None = None
    """What the row ran (None: torch's own algorithm), kept in the JSON so that a recorded
    run can be predicted again under a changed model (:mod:`hipipe.testbed.repredict`)."""

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def max_s(self) -> float:
        return max(self.times_s)

    @property
    def busbw_bytes_per_s(self) -> float:
        return busbw_bytes_per_s(self.message_bytes, self.median_s, self.num_ranks, self.collective)

    @property
    def host_busy_cpus(self) -> float:
        """The median over the timed runs of the host's busy CPU seconds per second (nan: not measured).

        Near the host's CPUs, the run was bound by the CPU rather than the wire.
        """
        if len(self.host_cpu_s) != len(self.times_s) or not self.times_s:
            return math.nan
        return statistics.median(c / t for c, t in zip(self.host_cpu_s, self.times_s, strict=True))

    @property
    def cpu_time_correlation(self) -> float:
        """Pearson's r between the timed runs' times and the host's busy CPU seconds over each.

        Near 1 with the host's CPUs nearly all busy, a run took longer when the host spent
        more CPU on it: identical runs of a many-op schedule on the 2-core testbed vary
        7-14% in time with r 0.95-0.99 (docs/MODEL.md section 10). NaN
        with fewer than :data:`MIN_CORRELATED_RUNS` runs, without CPU readings, or when
        either does not vary.
        """
        if len(self.host_cpu_s) != len(self.times_s) or len(self.times_s) < MIN_CORRELATED_RUNS:
            return math.nan
        try:
            return statistics.correlation(self.times_s, self.host_cpu_s)
        except statistics.StatisticsError:  # constant times or CPU
            return math.nan

    @property
    def measured_over_predicted(self) -> float:
        return self.median_s / self.predicted_s if self.predicted_s > 0 else math.nan


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchResult:
    config: BenchConfig
    prefix: str
    kernel: str
    rates: tuple[DimRate, ...]
    calibration: Calibration | None
    """What the rows were predicted on: the calibration, refitted on the overhead schedule
    run among the rows (``config.refit_in_rows``)."""
    topology: Topology
    """What the plans were made on: the calibration as it stood before the rows."""
    rows: tuple[BenchRow, ...]
    gantt_panels: tuple[tuple[str, Schedule], ...] = field(default=())
    wall_s: float = 0.0
    load_average: tuple[float, float] = (0.0, 0.0)
    """1-minute load average before and after: other work on the host skews a measurement."""
    tuning: tuple[TunedEntry, ...] = ()
    """With ``config.tune``: per message size, the candidates measured and the one kept."""
    calibration_before_rows: Calibration | None = None
    """The calibration the plans were made on, when the rows' predictions use one refitted
    among the rows (None: ``calibration`` is that one)."""

    def tuning_entry(self, message_bytes: int) -> TunedEntry | None:
        """The tuning of ``message_bytes`` this run did; None without ``config.tune``."""
        return next((e for e in self.tuning if e.key.message_bytes == message_bytes), None)

    def row(self, name: str, message_bytes: int) -> BenchRow | None:
        """The row of ``name`` at ``message_bytes``; None if it was not run."""
        return next((r for r in self.rows if r.name == name and r.message_bytes == message_bytes), None)

    def reduction(self, name: str, reference: str, message_bytes: int, *, simulated: bool = False) -> float:
        """``1 - t / t_reference`` (measured medians, or predictions); NaN if either is missing."""
        mine, ref = self.row(name, message_bytes), self.row(reference, message_bytes)
        if mine is None or ref is None:
            return math.nan
        if simulated:
            return 1.0 - mine.predicted_s / ref.predicted_s
        return 1.0 - mine.median_s / ref.median_s
