"""``hipipe bench``: measured collective times on an emulated testbed, beside their predictions.

One call brings a testbed up, checks its rates, calibrates it (so predictions use the
latency and bandwidth the testbed really delivers, not the nominal rates), plans every
planner on the calibrated topology, runs each plan with the executor and
torch's own collective as the reference (``all_reduce``, ``reduce_scatter_tensor`` or
``all_gather_into_tensor``; warm-up, then timed repeats), and
tears the testbed down whatever happens.

Orchestration only: the rows it fills are :mod:`hipipe.testbed.results`; the tables,
markdown and JSON are :mod:`hipipe.report.bench` (median, min and max time, busbw, the
prediction, measured / predicted, reductions against themis and torch). Tasks go to the
workers typed (:mod:`hipipe.testbed.protocol`), schedules planned here, once. With
``BenchConfig.tuned`` a ``hipipe-tuned`` row runs the schedule a tuning cache holds; with
``BenchConfig.tune`` the run tunes each size itself after calibrating (:mod:`hipipe.tuning.testbed`)
and measures the kept schedule as that row.
"""

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from hipipe.files import scratch_dir
from hipipe.hostcpu import usable_cores
from hipipe.planners import BASELINES, plan
from hipipe.predict import cpu_bound_s, predicted_s
from hipipe.repeats import RepeatRule, jobs_problem
from hipipe.schedule import Schedule
from hipipe.testbed import netns
from hipipe.testbed.fit import (
    CONCURRENT_WINDOW_S,
    Calibration,
    OverheadRun,
    calibration_from_samples,
    calibration_sizes_bytes,
    fit_all,
    overhead_schedule,
    refit_on_run,
    retime,
)
from hipipe.testbed.launch import run_job
from hipipe.testbed.layout import Layout, TestbedError
from hipipe.testbed.protocol import (
    OVERHEAD_SCHEDULE_KEY,
    CalibrateTask,
    CalibrationSamples,
    Event,
    OverheadTimes,
    RunDone,
    RunKey,
    RunResult,
    ScheduleTask,
    TorchTask,
    measured_schedule,
)
from hipipe.testbed.ratecheck import DimRate, check_rates
from hipipe.testbed.results import TUNED_NAME, BenchConfig, BenchResult, BenchRow
from hipipe.topology import Topology
from hipipe.tuning.cache import TunedEntry
from hipipe.units import format_size

OVERHEAD_ROW = "calibration-overhead"
"""Task name of the calibration's overhead schedule when it runs among the rows."""

ProgressFn = Callable[[int, int, str], None]
"""``(runs done, runs in all, what is running)``."""


def run_bench(
    config: BenchConfig,
    *,
    progress: ProgressFn | None = None,
    workdir: Path | None = None,
    state_dir: Path = netns.DEFAULT_STATE_DIR,
    prefix: str | None = None,
) -> BenchResult:
    """Up, rate check, calibrate, plan, run, down (always). Raises :class:`TestbedError`.

    ``prefix`` names the testbed (default: random), so a caller can check it is gone.

    Without ``workdir`` the worker logs go to a temporary directory, removed after a
    successful run and kept after a failure (the error names it).
    """
    with scratch_dir(workdir, prefix="hipipe-bench-") as directory:
        return _run_bench(config, progress=progress, workdir=directory, state_dir=state_dir, prefix=prefix)


def _run_bench(
    config: BenchConfig,
    *,
    progress: ProgressFn | None = None,
    workdir: Path,
    state_dir: Path = netns.DEFAULT_STATE_DIR,
    prefix: str | None = None,
) -> BenchResult:
    """The body of :func:`run_bench` in ``workdir``."""
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    testbed = netns.up(config.sizes, config.rates_bits_per_s, prefix=prefix, state_dir=state_dir)
    layout = testbed.layout
    try:
        rates: list[DimRate] = []
        if config.rate_check_s > 0:
            if progress:
                progress(0, 1, "rate check")
            rates = check_rates(layout, duration_s=config.rate_check_s, warmup_s=0.3)
        calibration: Calibration | None = None
        topology = layout.nominal_topology()
        if config.calibrate:
            calibration = _calibrate(layout, config, workdir / "calibrate", progress)
            topology = calibration.topology(name=f"testbed-{layout.shape}-calibrated")
        tuning, planned = (
            _tune(layout, topology, config, workdir / "tune", progress) if config.tune else ((), {})
        )
        tuned = config.tuned or tuple(entry.schedule for entry in tuning)
        refit_on = calibration if calibration is not None and config.refit_in_rows else None
        rows, panels, in_rows = _run_plans(
            layout, topology, config, tuned, workdir / "bench", progress, refit=refit_on, planned=planned
        )
    finally:
        netns.down(layout.prefix, state_dir=state_dir)
    return BenchResult(
        config=config,
        prefix=layout.prefix,
        kernel=testbed.kernel.describe(),
        rates=tuple(rates),
        calibration=calibration if in_rows is None else in_rows,
        topology=topology,
        rows=tuple(rows),
        gantt_panels=tuple(panels),
        wall_s=time.monotonic() - started,
        load_average=(load_before, os.getloadavg()[0]),
        tuning=tuning,
        calibration_before_rows=None if in_rows is None else calibration,
    )


def calibration_timeout_s(layout: Layout, sizes_bytes: Sequence[int]) -> float:
    """Generous bound on one calibration op: the largest size on the slowest dimension, x10."""
    slowest_bytes_per_s = min(layout.rates_bits_per_s) / 8
    return 60.0 + 10 * max(sizes_bytes) / slowest_bytes_per_s


def calibrate_testbed(
    layout: Layout,
    *,
    sizes_bytes: Sequence[int] | None = None,
    repeats: int = 3,
    overhead_max_repeats: int = 0,
    overhead_precision: float = 0.0,
    concurrent_window_s: float = CONCURRENT_WINDOW_S,
    overhead: bool = True,
    overhead_jobs: int = 1,
    workdir: Path,
    progress: ProgressFn | None = None,
) -> Calibration:
    """Run the calibration on a testbed that is up: per-dimension lines, then the per-op overhead.

    The overhead run takes ``repeats`` runs, then more until its median is settled
    (``overhead_precision``), at most ``overhead_max_repeats`` (0: exactly ``repeats``). The
    per-op cost is fitted to that median, and a 32-chunk run is as noisy as a bench row of
    many ops, so :func:`_calibrate` gives it the bench rows' cap and precision, and spreads
    it over as many worker jobs (``overhead_jobs``) as the rows: the calibration's job
    first, then jobs of the overhead schedule alone. Fitted to one job's median, the
    per-op cost came out 0.2-3.9 ms across calibrations of one testbed shape.
    """
    if overhead_jobs < 1:
        raise TestbedError(f"need at least one overhead job, got {overhead_jobs}")
    overhead_rule = RepeatRule(
        repeats=repeats, max_repeats=max(repeats, overhead_max_repeats), precision=overhead_precision
    ).per_job(overhead_jobs)
    if sizes_bytes is None:
        sizes_bytes = calibration_sizes_bytes(layout.rates_bits_per_s)
    total = layout.num_dims * len(sizes_bytes) * repeats
    if progress:
        progress(0, total, "calibration")
    timeout_s = calibration_timeout_s(layout, sizes_bytes)
    overhead_bytes = max(sizes_bytes) // 4 * 4 if overhead else 0
    planned: list[Schedule] = []

    def answer(event: Event) -> Mapping[str, str] | None:
        # The overhead schedule depends on the samples: plan it once, here, for every rank.
        if not isinstance(event, CalibrationSamples) or not overhead_bytes:
            return None
        planned.append(overhead_schedule(fit_all(layout.sizes, event.samples), overhead_bytes))
        return {OVERHEAD_SCHEDULE_KEY: planned[-1].to_json()}

    task = CalibrateTask(
        sizes_bytes=tuple(sizes_bytes),
        repeats=repeats,
        concurrent_window_s=concurrent_window_s,
        overhead_message_bytes=overhead_bytes,
        overhead_max_repeats=overhead_rule.max_repeats,
        overhead_precision=overhead_rule.precision,
    )
    events = run_job(
        layout,
        [task],
        workdir=workdir,
        timeout_s=timeout_s,
        deadline_s=180.0 + 4 * total * timeout_s / 10 + 4 * len(sizes_bytes) * repeats * concurrent_window_s,
        on_event=answer,
    )
    samples = next((e for e in events if isinstance(e, CalibrationSamples)), None)
    if samples is None:
        raise TestbedError(f"the calibration returned no samples (logs in {workdir})")
    measured = next((e for e in events if isinstance(e, OverheadTimes)), None)
    if progress:
        progress(total, total, "calibration")
    run = None
    if planned and measured is not None:
        times_s = list(measured.times_s)
        cpu_s: list[float] | None = list(measured.host_cpu_s) if measured.host_cpu_s else None  # None: unread
        more_traces: list[tuple[tuple[float, float], ...]] = []
        if overhead_jobs > 1:
            key = RunKey(planner="overhead", message_bytes=planned[0].message_bytes)
            rerun = ScheduleTask(
                key=key,
                schedule=planned[0],
                warmup=1,
                repeats=overhead_rule.repeats,
                max_repeats=overhead_rule.max_repeats,
                precision=overhead_rule.precision,
                trace=True,  # each job's trace joins the hand-off and jitter fits
            )
            for job in range(1, overhead_jobs):
                [result] = run_tasks(layout, [rerun], {key: max(times_s)}, workdir=workdir / f"overhead{job}")
                times_s += result.times_s
                cpu_s = _pooled_cpu(cpu_s, result)
                if result.op_times_s is not None:
                    more_traces.append(result.op_times_s)
        run = OverheadRun(
            schedule=planned[0],
            times_s=tuple(times_s),
            op_times_s=measured.op_times_s,
            memory_bytes_per_s=measured.memory_bytes_per_s,
            more_traces=tuple(more_traces),
            host_cpu_s=tuple(cpu_s or ()),
        )
    # Every rank runs on this host: they share its CPUs (the host term, docs/MODEL.md section 10).
    return calibration_from_samples(
        layout.sizes, samples.samples, overhead=run, host_ranks=layout.num_ranks, host_cores=usable_cores()
    )


def _calibrate(
    layout: Layout, config: BenchConfig, workdir: Path, progress: ProgressFn | None
) -> Calibration:
    return calibrate_testbed(
        layout,
        sizes_bytes=config.calibration_sizes_bytes,
        repeats=config.calibration_repeats,
        overhead_max_repeats=config.max_repeats,
        overhead_precision=config.precision,
        concurrent_window_s=config.calibration_concurrent_s,
        overhead=config.calibrate_overhead,
        overhead_jobs=config.jobs,
        workdir=workdir,
        progress=progress,
    )


def _tune(
    layout: Layout, topology: Topology, config: BenchConfig, workdir: Path, progress: ProgressFn | None
) -> tuple[tuple[TunedEntry, ...], dict[RunKey, Schedule]]:
    """``hipipe tune`` on this testbed and calibration, one entry per size, before the rows;
    and the candidates that are rows too (hipipe's own plan, the baselines), by row.

    The candidates are hipipe's best few and this run's baselines (not every baseline:
    the others are not rows here, and each costs minutes on a slow testbed). The kept
    schedule is then measured again among the rows, so the ``hipipe-tuned`` row is not
    the very measurement it was selected by.
    """
    # Imported here: hipipe.tuning.testbed builds on this module (run_tasks, calibrate_testbed).
    from hipipe.tuning.testbed import TuneConfig, tune_on_layout

    configs = [
        TuneConfig(
            sizes=config.sizes,
            rates_bits_per_s=config.rates_bits_per_s,
            message_bytes=message_bytes,
            collective=config.collective,
            warmup=config.warmup,
            repeats=config.repeats,
            max_repeats=config.max_repeats,
            precision=config.precision,
            jobs=config.jobs,
            best_few=config.tune_best_few,
            calibrate=config.calibrate,
        )
        for message_bytes in config.messages_bytes
    ]
    baselines = [name for name in config.planners if name in BASELINES]
    tuned = tune_on_layout(
        layout, topology, configs, baselines=baselines, workdir=workdir, progress=progress, jobs=config.jobs
    )
    planned = {
        RunKey(planner=candidate.name, message_bytes=tune_config.message_bytes): candidate.schedule
        for tune_config, (_, candidates) in zip(configs, tuned, strict=True)
        for candidate in candidates
        if candidate.name in config.planners
    }
    return tuple(entry for entry, _ in tuned), planned


def predicted_on_s(topology: Topology, schedule: Schedule) -> float:
    """``schedule`` replayed on ``topology`` (its own chunks and sequences), full cost model.

    The median of :func:`hipipe.predict.predict`: the linear overheads as the simulator
    charges them, plus the calibrated concurrency and jitter. A tuned schedule was
    planned on another calibration of the testbed, so every row is replayed on this
    run's topology before it is compared.
    """
    return predicted_s(retime(schedule, topology))


def _run_plans(
    layout: Layout,
    topology: Topology,
    config: BenchConfig,
    tuned_schedules: Sequence[Schedule],
    workdir: Path,
    progress: ProgressFn | None,
    *,
    refit: Calibration | None = None,
    planned: Mapping[RunKey, Schedule] | None = None,
) -> tuple[list[BenchRow], list[tuple[str, Schedule]], Calibration | None]:
    """Plan on ``topology``, run every row, predict each on the calibration it is compared with.

    ``planned``: rows already planned on ``topology`` (the tuner's candidates of the same
    name and size, :func:`_tune`), taken as they are instead of planned again: a hipipe
    plan on a calibrated 3-dim testbed takes tens of seconds.

    With ``refit`` (the calibration ``topology`` came from) that has an overhead run, the
    overhead schedule runs again as one more task of the rows' jobs, and the rows are
    predicted on the calibration refitted to that run (:func:`refit_on_run`; returned
    third, else None): it shares the rows' minutes on the host.
    """
    overhead = None if refit is None else refit.overhead_run
    tasks: list[ScheduleTask | TorchTask] = []
    schedules: dict[RunKey, Schedule] = {}
    tuned = {s.message_bytes: s for s in tuned_schedules}
    for message_bytes in config.messages_bytes:
        for name in config.planners:
            key = RunKey(planner=name, message_bytes=message_bytes)
            if planned is not None and key in planned:
                schedules[key] = planned[key]
            else:
                schedules[key] = plan(topology, message_bytes, name, collective=config.collective)
        if message_bytes in tuned:
            schedules[RunKey(planner=TUNED_NAME, message_bytes=message_bytes)] = tuned[message_bytes]
        if config.include_torch:
            # torch runs its own algorithm: predicted as the flat ring Gloo runs
            key = RunKey(planner=config.torch_name, message_bytes=message_bytes)
            schedules[key] = plan(topology, message_bytes, "ring", collective=config.collective)
    for key, schedule in schedules.items():
        if key.planner == config.torch_name:
            tasks.append(
                TorchTask(
                    key=key,
                    warmup=config.warmup,
                    repeats=config.repeats,
                    max_repeats=config.max_repeats,
                    precision=config.precision,
                    collective=config.collective,
                )
            )
        else:
            tasks.append(_schedule_task(key, schedule, config))
    overhead_key = None
    if overhead is not None:
        overhead_key = RunKey(planner=OVERHEAD_ROW, message_bytes=overhead.schedule.message_bytes)
        tasks.append(_schedule_task(overhead_key, overhead.schedule, config))
    planned_s = {key: predicted_on_s(topology, s) for key, s in schedules.items()}
    timeouts = dict(planned_s)
    if overhead_key is not None and overhead is not None:
        timeouts[overhead_key] = max(overhead.times_s)
    results = run_tasks(
        layout,
        tasks,
        timeouts,
        workdir=workdir,
        progress=progress,
        jobs=config.jobs,
        extra_jobs=config.extra_jobs,
    )
    refitted = None
    if refit is not None and overhead is not None:
        [measured] = [r for r in results if r.key == overhead_key]
        results = [r for r in results if r.key != overhead_key]
        # The traces fit the hand-off and the jitter: the calibration's and this one, pooled.
        in_rows = replace(
            overhead,
            times_s=measured.times_s,
            host_cpu_s=measured.host_cpu_s,
            more_traces=(*overhead.more_traces, *((measured.op_times_s,) if measured.op_times_s else ())),
        )
        refitted = refit_on_run(refit, in_rows)
    predicting_on = topology if refitted is None else refitted.topology(name=topology.name)
    predicted = (
        planned_s
        if refitted is None
        else {key: predicted_on_s(predicting_on, s) for key, s in schedules.items()}
    )
    rows: list[BenchRow] = []
    traces: dict[RunKey, tuple[tuple[float, float], ...]] = {}
    for event in results:
        schedule = schedules[event.key]
        is_torch = event.key.planner == config.torch_name
        rows.append(
            BenchRow(
                name=event.key.planner,
                message_bytes=event.key.message_bytes,
                num_ranks=layout.num_ranks,
                times_s=event.times_s,
                predicted_s=predicted[event.key],
                collective=config.collective,
                host_cpu_s=event.host_cpu_s,
                # its ops' CPU on the calibrated host, no timing (torch's own algorithm: no bound)
                cpu_bound_s=0.0 if is_torch else cpu_bound_s(replace(schedule, topology=predicting_on)),
                schedule=None if is_torch else schedule,
            )
        )
        if event.op_times_s is not None:
            traces[event.key] = event.op_times_s
    return rows, _gantt_panels(config, schedules, traces), refitted


def _schedule_task(key: RunKey, schedule: Schedule, config: BenchConfig) -> ScheduleTask:
    """One traced row of ``schedule`` with the bench's warm-up and repeat rule."""
    return ScheduleTask(
        key=key,
        schedule=schedule,
        warmup=config.warmup,
        repeats=config.repeats,
        max_repeats=config.max_repeats,
        precision=config.precision,
        collective=schedule.collective,
        trace=True,
    )


def run_tasks(
    layout: Layout,
    tasks: Sequence[ScheduleTask | TorchTask],
    predicted_s: Mapping[RunKey, float],
    *,
    workdir: Path,
    progress: ProgressFn | None = None,
    jobs: int = 1,
    extra_jobs: int = 0,
) -> list[RunResult]:
    """Run measurement tasks on a testbed that is up; one result per task, in order.

    With ``jobs`` > 1 every task runs in each of ``jobs`` worker jobs (the ranks start
    afresh, with new connections, for each), its timed runs split between them
    (:meth:`~hipipe.repeats.RepeatRule.per_job`), and its times are those of every job in
    turn: on a shared host a many-op schedule's median moves by tens of percent from job
    to job (:data:`~hipipe.repeats.DEFAULT_JOBS`). Each job starts at another task, so
    no task always runs first (cold) or last. Only the last of the ``jobs`` jobs traces.

    Then up to ``extra_jobs`` more jobs run the tasks whose median is still unsettled over
    all their runs (:meth:`~hipipe.repeats.RepeatRule.settled`), each with the same share
    of runs, until every task is settled (:data:`~hipipe.repeats.DEFAULT_EXTRA_JOBS`).

    ``predicted_s`` (per task key) only sizes the timeouts: a run may take several times
    its prediction on a loaded host, but a hang must still end.
    """
    if jobs < 1:
        raise TestbedError(f"need at least one job, got {jobs}")
    problem = jobs_problem(jobs, extra_jobs)
    if problem is not None:
        raise TestbedError(problem)
    total_runs = jobs * sum(_runs_in_job(t, jobs) for t in tasks)
    done = 0
    times: dict[RunKey, list[float]] = {t.key: [] for t in tasks}
    cpu: dict[RunKey, list[float] | None] = {t.key: [] for t in tasks}  # None: a job could not read it
    traces: dict[RunKey, tuple[tuple[float, float], ...]] = {}
    if progress:
        progress(0, total_runs, "starting workers")
    for job in range(jobs + extra_jobs):
        if job < jobs:
            due = list(tasks)
            label = f" (job {job + 1} of {jobs})" if jobs > 1 else ""
        else:
            due = [t for t in tasks if not t.rule.settled(times[t.key])]
            if not due:
                break
            total_runs += sum(_runs_in_job(t, jobs) for t in due)
            label = f" (extra job {job - jobs + 1} of up to {extra_jobs}: {len(due)} unsettled)"
        first = job * len(due) // jobs  # spread the starts evenly over the tasks
        order = [
            _task_for_job(due[(i + first) % len(due)], jobs, traced=job == jobs - 1) for i in range(len(due))
        ]
        results, done = _run_one_job(
            layout,
            order,
            predicted_s,
            workdir=workdir / f"job{job}" if jobs + extra_jobs > 1 else workdir,
            progress=progress,
            done=done,
            total_runs=total_runs,
            label=label,
        )
        for result in results:
            times[result.key] += result.times_s
            cpu[result.key] = _pooled_cpu(cpu[result.key], result)
            if result.op_times_s is not None:
                traces[result.key] = result.op_times_s
    return [
        RunResult(
            key=t.key,
            times_s=tuple(times[t.key]),
            op_times_s=traces.get(t.key),
            host_cpu_s=tuple(cpu[t.key] or ()),
        )
        for t in tasks
    ]


def _runs_in_job(task: ScheduleTask | TorchTask, jobs: int) -> int:
    """Most runs ``task`` takes in one of ``jobs`` jobs (warm-up included): for progress."""
    return task.warmup + task.rule.per_job(jobs).max_repeats


def _pooled_cpu(known: list[float] | None, result: RunResult) -> list[float] | None:
    """``known`` host CPU readings with ``result``'s joined; None once any job could not read
    one per timed run (a row's CPU is all its runs' or none)."""
    read_all = len(result.host_cpu_s) == len(result.times_s)
    return known + list(result.host_cpu_s) if known is not None and read_all else None


def _task_for_job(task: ScheduleTask | TorchTask, jobs: int, *, traced: bool) -> ScheduleTask | TorchTask:
    """``task`` with its share of the runs in one of ``jobs`` jobs (traced in one job only)."""
    rule = task.rule.per_job(jobs)
    task = replace(task, repeats=rule.repeats, max_repeats=rule.max_repeats)
    if isinstance(task, ScheduleTask) and task.trace and not traced:
        task = replace(task, trace=False)
    return task


def _run_one_job(
    layout: Layout,
    tasks: Sequence[ScheduleTask | TorchTask],
    predicted_s: Mapping[RunKey, float],
    *,
    workdir: Path,
    progress: ProgressFn | None,
    done: int,
    total_runs: int,
    label: str,
) -> tuple[list[RunResult], int]:
    """One worker job of ``tasks``; its results (in task order) and the runs counted so far."""
    runs_per_task = max((t.warmup + t.rule.max_repeats for t in tasks), default=0)
    worst_s = max(predicted_s[t.key] for t in tasks)
    timeout_s = 60.0 + 10 * worst_s
    deadline_s = 180.0 + 4 * sum(predicted_s[t.key] for t in tasks) * runs_per_task + 2 * timeout_s

    def on_event(event: Event) -> None:
        nonlocal done
        if isinstance(event, RunDone):
            done += 1
            if progress:
                progress(done, total_runs, event.key.describe() + label)
        elif isinstance(event, RunResult):
            # a row whose median settled before its cap: count the runs it did not need
            task = next(t for t in tasks if t.key == event.key)
            done += task.rule.max_repeats - len(event.times_s)
            if progress:
                progress(done, total_runs, event.key.describe() + label)

    events = run_job(
        layout, tasks, workdir=workdir, timeout_s=timeout_s, deadline_s=deadline_s, on_event=on_event
    )
    results = {e.key: e for e in events if isinstance(e, RunResult)}
    missing = [t.key.describe() for t in tasks if t.key not in results]
    if missing:
        raise TestbedError(f"no result for {missing[0]} (logs in {workdir})")
    return [results[t.key] for t in tasks], done


def _gantt_panels(
    config: BenchConfig,
    schedules: dict[RunKey, Schedule],
    traces: dict[RunKey, tuple[tuple[float, float], ...]],
) -> list[tuple[str, Schedule]]:
    """Planned and measured (rank 0, last repeat) schedule of one hipipe run, largest size."""
    if not config.planners:
        return []
    name = config.gantt_planner if config.gantt_planner in config.planners else config.planners[0]
    key = RunKey(planner=name, message_bytes=max(config.messages_bytes))
    if key not in traces:
        return []
    planned = schedules[key]
    measured = measured_schedule(planned, traces[key], rank=0)
    size = format_size(key.message_bytes)
    return [
        (f"{name} {size}: planned on the calibrated topology", planned),
        (f"{name} {size}: measured on the testbed (rank 0)", measured),
    ]
