"""``hipipe tune`` on the emulated testbed: measure the candidates, keep the fastest.

Brings a testbed up, calibrates it (so hipipe plans on what the network delivers),
plans the candidates (:func:`~hipipe.tuning.candidates.tuning_candidates`) once here,
runs each with warm-up and timed repeats (until its median is settled) through the same worker job as ``hipipe
bench`` (every time the slowest rank's), picks the smallest median and tears the
testbed down whatever happens. The cache key names the *nominal* testbed topology
(shape and rates): that is what a later ``hipipe bench --tuned`` or run knows before
anything is measured; the calibrated one changes with every calibration.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hipipe.files import scratch_dir
from hipipe.planners import BASELINES
from hipipe.repeats import (
    DEFAULT_JOBS,
    DEFAULT_MAX_REPEATS,
    DEFAULT_PRECISION,
    jobs_problem,
    repeat_problem,
)
from hipipe.schedule import Collective
from hipipe.testbed import netns
from hipipe.testbed.bench import ProgressFn, calibrate_testbed, run_tasks
from hipipe.testbed.fit import Calibration
from hipipe.testbed.layout import Layout, TestbedError, format_rate, nominal_topology
from hipipe.testbed.protocol import DTYPE_BYTES, RunKey, ScheduleTask
from hipipe.testbed.ratecheck import check_rates
from hipipe.topology import Topology
from hipipe.tuning.cache import TunedEntry, TuningKey
from hipipe.tuning.candidates import (
    DEFAULT_BEST_FEW,
    Candidate,
    tuned_entry,
    tuning_candidates,
)
from hipipe.units import format_size


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneConfig:
    """One ``hipipe tune --testbed`` run; defaults are the CLI's."""

    sizes: tuple[int, ...]
    rates_bits_per_s: tuple[float, ...]
    message_bytes: int
    collective: Collective = Collective.ALL_REDUCE
    dtype: str = "float32"
    warmup: int = 1
    repeats: int = 3
    """Timed runs per candidate, at least; then more until the median is settled
    (:class:`~hipipe.repeats.RepeatRule`)."""
    max_repeats: int = DEFAULT_MAX_REPEATS
    precision: float = DEFAULT_PRECISION
    jobs: int = DEFAULT_JOBS
    """Worker jobs each candidate's runs are spread over (:data:`~hipipe.repeats.DEFAULT_JOBS`)."""
    best_few: int = DEFAULT_BEST_FEW
    calibrate: bool = True
    calibration_sizes_bytes: tuple[int, ...] | None = None
    calibration_repeats: int = 3
    rate_check_s: float = 0.0
    """Seconds of rate check per dimension first; 0 skips it."""

    def __post_init__(self) -> None:
        problem = repeat_problem(self.repeats, self.max_repeats, self.precision) or jobs_problem(self.jobs)
        if problem is not None:
            raise TestbedError(problem)
        if self.warmup < 0:
            raise TestbedError(f"--warmup must be at least 0, got {self.warmup}")
        if self.dtype not in DTYPE_BYTES:
            raise TestbedError(f"unknown dtype {self.dtype!r} (use {', '.join(DTYPE_BYTES)})")
        if self.message_bytes <= 0 or self.message_bytes % DTYPE_BYTES[self.dtype]:
            raise TestbedError(f"{self.message_bytes} bytes is not a whole number of {self.dtype} elements")

    @property
    def topology(self) -> Topology:
        """The nominal testbed topology: the cache key's."""
        return nominal_topology(self.sizes, self.rates_bits_per_s)

    def source(self) -> str:
        rates = ",".join(format_rate(r) for r in self.rates_bits_per_s)
        return f"testbed {'x'.join(str(s) for s in self.sizes)} at {rates}"


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneResult:
    entry: TunedEntry
    candidates: tuple[Candidate, ...]
    planned_on: Topology
    """The topology the candidates were planned on (calibrated, or nominal)."""
    calibration: Calibration | None
    prefix: str


def tune_on_testbed(
    config: TuneConfig,
    *,
    progress: ProgressFn | None = None,
    workdir: Path | None = None,
    state_dir: Path = netns.DEFAULT_STATE_DIR,
    prefix: str | None = None,
) -> TuneResult:
    """Up, (rate check), calibrate, plan the candidates, measure them, down (always).

    Without ``workdir`` the worker logs go to a temporary directory, removed after a
    successful run and kept after a failure (the error names it).
    """
    with scratch_dir(workdir, prefix="hipipe-tune-") as directory:
        return _tune_on_testbed(
            config, progress=progress, workdir=directory, state_dir=state_dir, prefix=prefix
        )


def _tune_on_testbed(
    config: TuneConfig,
    *,
    progress: ProgressFn | None = None,
    workdir: Path,
    state_dir: Path = netns.DEFAULT_STATE_DIR,
    prefix: str | None = None,
) -> TuneResult:
    """The body of :func:`tune_on_testbed` in ``workdir``."""
    testbed = netns.up(config.sizes, config.rates_bits_per_s, prefix=prefix, state_dir=state_dir)
    layout = testbed.layout
    try:
        if config.rate_check_s > 0:
            if progress:
                progress(0, 1, "rate check")
            check_rates(layout, duration_s=config.rate_check_s, warmup_s=0.3)
        calibration = None
        topology = layout.nominal_topology()
        if config.calibrate:
            calibration = calibrate_testbed(
                layout,
                sizes_bytes=config.calibration_sizes_bytes,
                repeats=config.calibration_repeats,
                overhead_max_repeats=config.max_repeats,
                overhead_precision=config.precision,
                overhead_jobs=config.jobs,
                workdir=workdir / "calibrate",
                progress=progress,
            )
            topology = calibration.topology(name=f"testbed-{layout.shape}-calibrated")
        [(entry, candidates)] = tune_on_layout(
            layout, topology, [config], workdir=workdir / "tune", progress=progress, jobs=config.jobs
        )
    finally:
        netns.down(layout.prefix, state_dir=state_dir)
    return TuneResult(
        entry=entry,
        candidates=tuple(candidates),
        planned_on=topology,
        calibration=calibration,
        prefix=layout.prefix,
    )


def tune_on_layout(
    layout: Layout,
    topology: Topology,
    configs: Sequence[TuneConfig],
    *,
    baselines: Sequence[str] = BASELINES,
    workdir: Path,
    progress: ProgressFn | None = None,
    jobs: int = 1,
) -> list[tuple[TunedEntry, list[Candidate]]]:
    """Tune on a testbed that is up: one entry (and its candidates) per config, in order.

    Every config's candidates are planned on ``topology`` (calibrated or nominal) and run
    in the same worker jobs (runs are keyed by name and size, so several sizes share them
    and the ranks start ``jobs`` times: :func:`~hipipe.testbed.bench.run_tasks`).
    ``hipipe bench --tune`` calls this between its calibration and its
    rows, with its own baselines, so the kept schedules come from the same calibration.
    """
    if len({c.message_bytes for c in configs}) != len(configs):
        raise TestbedError("tune each message size once")
    planned: list[list[Candidate]] = []
    tasks: list[ScheduleTask] = []
    for config in configs:
        if progress:
            progress(0, 1, f"planning the candidates ({format_size(config.message_bytes)})")
        candidates = tuning_candidates(
            topology,
            config.message_bytes,
            collective=config.collective,
            best_few=config.best_few,
            baselines=baselines,
        )
        planned.append(candidates)
        tasks += [
            ScheduleTask(
                key=RunKey(planner=c.name, message_bytes=config.message_bytes),
                schedule=c.schedule,
                warmup=config.warmup,
                repeats=config.repeats,
                max_repeats=config.max_repeats,
                precision=config.precision,
                dtype=config.dtype,
                collective=config.collective,
            )
            for c in candidates
        ]
    predicted = {t.key: t.schedule.makespan_s for t in tasks}
    results = run_tasks(layout, tasks, predicted, workdir=workdir, progress=progress, jobs=jobs)
    out = []
    for config, candidates in zip(configs, planned, strict=True):
        key = TuningKey.of(config.topology, config.collective, config.message_bytes, config.dtype)
        times = {r.key.planner: r.times_s for r in results if r.key.message_bytes == config.message_bytes}
        entry = tuned_entry(
            key,
            candidates,
            times,
            warmup=config.warmup,
            source=config.source(),
            topology_name=config.topology.name,
        )
        out.append((entry, candidates))
    return out
