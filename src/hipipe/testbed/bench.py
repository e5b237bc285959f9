"""``hipipe bench``: measured AllReduce times on an emulated testbed, beside their predictions.

One call brings a testbed up, checks its rates, calibrates it (so predictions use the
latency and bandwidth the testbed really delivers, not the nominal rates), plans every
planner on the calibrated topology, runs each plan with the executor and
``torch.distributed.all_reduce`` as the reference (warm-up, then timed repeats), and
tears the testbed down whatever happens.

Reported per planner and message size (nccl-tests conventions, HIPIPE.md section 7):
median, min and max time, ``busbw = M/t * 2(N-1)/N``, the predicted time, measured /
predicted, and the time reduction ``1 - t / t_ref`` against ``themis`` and against
``torch.distributed.all_reduce`` -- measured, and for themis also as simulated, since
the goal is that the two agree.
"""

import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from hipipe.cost import busbw_bytes_per_s
from hipipe.planners import plan
from hipipe.schedule import Schedule, schedule_to_dict
from hipipe.testbed import netns
from hipipe.testbed.calibrate import (
    CONCURRENT_WINDOW_S,
    Calibration,
    calibration_from_event,
    calibration_sizes_bytes,
)
from hipipe.testbed.launch import run_job
from hipipe.testbed.layout import Layout, TestbedError, format_rate
from hipipe.testbed.ratecheck import DimRate, check_rates
from hipipe.topology import Topology
from hipipe.topology_io import topology_to_dict
from hipipe.units import format_size

TORCH_NAME = "torch.distributed.all_reduce"
"""Row name of the reference; its prediction is the flat ``ring`` model (Gloo runs a ring)."""

THEMIS = "themis"

DEFAULT_PLANNERS: tuple[str, ...] = ("hipipe", "themis", "pipelined", "hierarchical")

ProgressFn = Callable[[int, int, str], None]
"""``(runs done, runs in all, what is running)``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchConfig:
    """Everything one ``hipipe bench`` run needs; defaults are the CLI's."""

    sizes: tuple[int, ...]
    rates_bits_per_s: tuple[float, ...]
    messages_bytes: tuple[int, ...]
    planners: tuple[str, ...] = DEFAULT_PLANNERS
    include_torch: bool = True
    warmup: int = 1
    repeats: int = 3
    calibrate: bool = True
    calibration_sizes_bytes: tuple[int, ...] | None = None
    """None: :func:`calibration_sizes_bytes` of the rates."""
    calibration_repeats: int = 3
    calibration_concurrent_s: float = CONCURRENT_WINDOW_S
    calibrate_overhead: bool = True
    """Also measure the per-op overhead inside a pipelined run (:func:`fit_op_overhead_s`)."""
    """Window of the concurrent calibration pass (every dimension busy); 0: isolated only."""
    rate_check_s: float = 1.0
    """Seconds of rate check per dimension before the runs; 0 skips it."""
    gantt_planner: str = "hipipe"

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise TestbedError("need repeats >= 1 and warmup >= 0")
        if not self.messages_bytes or any(m % 4 or m <= 0 for m in self.messages_bytes):
            raise TestbedError("message sizes must be positive multiples of 4 bytes (float32 elements)")
        if not self.planners and not self.include_torch:
            raise TestbedError("nothing to run: no planner and no torch reference")


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchRow:
    """One planner (or the torch reference) at one message size."""

    name: str
    message_bytes: int
    num_ranks: int
    times_s: tuple[float, ...]
    predicted_s: float
    """The plan's makespan on the calibrated topology (torch: the flat ring model)."""

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
        return busbw_bytes_per_s(self.message_bytes, self.median_s, self.num_ranks)

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
    topology: Topology
    rows: tuple[BenchRow, ...]
    gantt_panels: tuple[tuple[str, Schedule], ...] = field(default=())
    wall_s: float = 0.0
    load_average: tuple[float, float] = (0.0, 0.0)
    """1-minute load average before and after: other work on the host skews a measurement."""

    def row(self, name: str, message_bytes: int) -> BenchRow | None:
        return next((r for r in self.rows if r.name == name and r.message_bytes == message_bytes), None)

    def reduction(self, name: str, reference: str, message_bytes: int, *, simulated: bool = False) -> float:
        """``1 - t / t_reference`` (measured medians, or predictions); NaN if either is missing."""
        mine, ref = self.row(name, message_bytes), self.row(reference, message_bytes)
        if mine is None or ref is None:
            return math.nan
        if simulated:
            return 1.0 - mine.predicted_s / ref.predicted_s
        return 1.0 - mine.median_s / ref.median_s


def _predicted_ring_s(topology: Topology, message_bytes: int) -> float:
    return plan(topology, message_bytes, "ring").makespan_s


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
    """
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    workdir = workdir or Path(tempfile.mkdtemp(prefix="hipipe-bench-"))
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
        rows, panels = _run_plans(layout, topology, config, workdir / "bench", progress)
    finally:
        netns.down(layout.prefix, state_dir=state_dir)
    return BenchResult(
        config=config,
        prefix=layout.prefix,
        kernel=testbed.kernel.describe(),
        rates=tuple(rates),
        calibration=calibration,
        topology=topology,
        rows=tuple(rows),
        gantt_panels=tuple(panels),
        wall_s=time.monotonic() - started,
        load_average=(load_before, os.getloadavg()[0]),
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
    concurrent_window_s: float = CONCURRENT_WINDOW_S,
    overhead: bool = True,
    workdir: Path,
    progress: ProgressFn | None = None,
) -> Calibration:
    """Run the calibration on a testbed that is up: per-dimension lines, then the per-op overhead."""
    if sizes_bytes is None:
        sizes_bytes = calibration_sizes_bytes(layout.rates_bits_per_s)
    total = layout.num_dims * len(sizes_bytes) * repeats
    if progress:
        progress(0, total, "calibration")
    timeout_s = calibration_timeout_s(layout, sizes_bytes)
    overhead_bytes = max(sizes_bytes) // 4 * 4 if overhead else 0
    events = run_job(
        layout,
        [
            {
                "kind": "calibrate",
                "sizes_bytes": list(sizes_bytes),
                "repeats": repeats,
                "concurrent_window_s": concurrent_window_s,
                "overhead_message_bytes": overhead_bytes,
            }
        ],
        workdir=workdir,
        timeout_s=timeout_s,
        deadline_s=180.0 + 4 * total * timeout_s / 10 + 4 * len(sizes_bytes) * repeats * concurrent_window_s,
    )
    event = next((e for e in events if e.get("event") == "calibration"), None)
    if event is None:
        raise TestbedError(f"the calibration returned no samples (logs in {workdir})")
    if progress:
        progress(total, total, "calibration")
    return calibration_from_event(layout.sizes, event)


def _calibrate(
    layout: Layout, config: BenchConfig, workdir: Path, progress: ProgressFn | None
) -> Calibration:
    return calibrate_testbed(
        layout,
        sizes_bytes=config.calibration_sizes_bytes,
        repeats=config.calibration_repeats,
        concurrent_window_s=config.calibration_concurrent_s,
        overhead=config.calibrate_overhead,
        workdir=workdir,
        progress=progress,
    )


def _run_plans(
    layout: Layout,
    topology: Topology,
    config: BenchConfig,
    workdir: Path,
    progress: ProgressFn | None,
) -> tuple[list[BenchRow], list[tuple[str, Schedule]]]:
    workdir.mkdir(parents=True, exist_ok=True)
    tasks: list[dict[str, Any]] = []
    predicted: dict[tuple[str, int], float] = {}
    schedules: dict[tuple[str, int], Schedule] = {}
    for message_bytes in config.messages_bytes:
        for name in config.planners:
            schedule = plan(topology, message_bytes, name)
            schedules[(name, message_bytes)] = schedule
            predicted[(name, message_bytes)] = schedule.makespan_s
            path = workdir / f"{name}-{message_bytes}.json"
            path.write_text(schedule.to_json())
            tasks.append(
                {
                    "kind": "schedule",
                    "name": f"{name}@{message_bytes}",
                    "schedule_path": str(path),
                    "warmup": config.warmup,
                    "repeats": config.repeats,
                }
            )
        if config.include_torch:
            predicted[(TORCH_NAME, message_bytes)] = _predicted_ring_s(topology, message_bytes)
            tasks.append(
                {
                    "kind": "torch",
                    "name": f"{TORCH_NAME}@{message_bytes}",
                    "message_bytes": message_bytes,
                    "warmup": config.warmup,
                    "repeats": config.repeats,
                }
            )
    runs_per_task = config.warmup + config.repeats
    total_runs = len(tasks) * runs_per_task
    worst_s = max(predicted.values())
    # Ranks wait for each other inside an op: a run may take several times its prediction
    # on a loaded host, but a hang must still end.
    timeout_s = 60.0 + 10 * worst_s
    deadline_s = 180.0 + 4 * sum(predicted.values()) * runs_per_task + 2 * timeout_s
    done = 0

    def on_event(event: dict[str, Any]) -> None:
        nonlocal done
        if event.get("event") == "run":
            done += 1
            if progress:
                name, _, size = str(event["task"]).partition("@")
                progress(done, total_runs, f"{name} {format_size(int(size))}")

    if progress:
        progress(0, total_runs, "starting workers")
    events = run_job(
        layout, tasks, workdir=workdir, timeout_s=timeout_s, deadline_s=deadline_s, on_event=on_event
    )
    rows: list[BenchRow] = []
    traces: dict[tuple[str, int], list[list[float]]] = {}
    for event in events:
        if event.get("event") != "result":
            continue
        name, _, size = str(event["task"]).partition("@")
        key = (name, int(size))
        rows.append(
            BenchRow(
                name=name,
                message_bytes=int(size),
                num_ranks=layout.num_ranks,
                times_s=tuple(float(t) for t in event["times_s"]),
                predicted_s=predicted[key],
            )
        )
        if "trace" in event:
            traces[key] = event["trace"]
    return rows, _gantt_panels(config, schedules, traces)


def _gantt_panels(
    config: BenchConfig,
    schedules: dict[tuple[str, int], Schedule],
    traces: dict[tuple[str, int], list[list[float]]],
) -> list[tuple[str, Schedule]]:
    """Planned and measured (rank 0, last repeat) schedule of one hipipe run, largest size."""
    from hipipe.torch.executor import OpTiming, Trace, trace_to_schedule

    if not config.planners:
        return []
    name = config.gantt_planner if config.gantt_planner in config.planners else config.planners[0]
    key = (name, max(config.messages_bytes))
    if key not in traces:
        return []
    trace = Trace(
        rank=0,
        ops=tuple(OpTiming(index=i, start_s=a, end_s=b) for i, (a, b) in enumerate(traces[key])),
        total_s=max((b for _, b in traces[key]), default=0.0),
    )
    planned = schedules[key]
    measured = trace_to_schedule(planned, trace)
    size = format_size(key[1])
    return [
        (f"{name} {size}: planned on the calibrated topology", planned),
        (f"{name} {size}: measured on the testbed (rank 0)", measured),
    ]


def result_to_dict(result: BenchResult) -> dict[str, Any]:
    """The JSON document ``hipipe bench --json`` writes."""
    config = result.config
    rows = []
    for row in result.rows:
        rows.append(
            {
                "name": row.name,
                "message_bytes": row.message_bytes,
                "times_s": list(row.times_s),
                "median_s": row.median_s,
                "min_s": row.min_s,
                "max_s": row.max_s,
                "busbw_bytes_per_s": row.busbw_bytes_per_s,
                "predicted_s": row.predicted_s,
                "measured_over_predicted": row.measured_over_predicted,
                "reduction_vs_themis": _finite(result.reduction(row.name, THEMIS, row.message_bytes)),
                "simulated_reduction_vs_themis": _finite(
                    result.reduction(row.name, THEMIS, row.message_bytes, simulated=True)
                ),
                "reduction_vs_torch": _finite(result.reduction(row.name, TORCH_NAME, row.message_bytes)),
            }
        )
    return {
        "format": "hipipe.bench",
        "version": 1,
        "shape": "x".join(str(s) for s in config.sizes),
        "num_ranks": math.prod(config.sizes),
        "rates_bits_per_s": list(config.rates_bits_per_s),
        "messages_bytes": list(config.messages_bytes),
        "warmup": config.warmup,
        "repeats": config.repeats,
        "kernel": result.kernel,
        "rate_check": [
            {
                "dim": r.dim,
                "target_bits_per_s": r.target_bits_per_s,
                "median_bits_per_s": r.median_bits_per_s,
                "min_bits_per_s": r.min_bits_per_s,
                "max_bits_per_s": r.max_bits_per_s,
            }
            for r in result.rates
        ],
        "calibration": result.calibration.to_dict() if result.calibration else None,
        "topology": topology_to_dict(result.topology),
        "rows": rows,
        "wall_s": result.wall_s,
        "load_average_before_after": list(result.load_average),
        # The Gantt's two schedules (planned, measured on rank 0), readable by `hipipe check`/`simulate`.
        "gantt": [
            {"title": title, "schedule": schedule_to_dict(schedule)}
            for title, schedule in result.gantt_panels
        ],
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def describe_calibration(calibration: Calibration) -> str:
    """``dim 0 48.2 Mbit/s + 1.2 ms/op; ...; +0.8 ms per op in pipelined runs``."""
    parts = [
        f"dim {f.dim} {f.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s + {f.constant_s * 1e3:.2f} ms/op"
        f" (worst residual {100 * f.max_relative_residual:.0f}%)"
        for f in calibration.fits
    ]
    if calibration.overhead_times_s:
        parts.append(f"+{calibration.op_overhead_s * 1e3:.2f} ms per op inside pipelined runs")
    return "; ".join(parts)


def describe_rates(result: BenchResult) -> str:
    """``dim 0: 47.8 of 50 Mbit/s (0.956); dim 1: ...`` for cards and reports."""
    return "; ".join(
        f"dim {r.dim}: {format_rate(r.median_bits_per_s)} of {format_rate(r.target_bits_per_s)} ({r.ratio:.3f})"
        for r in result.rates
    )


def _pct(value: float) -> str:
    return f"{100 * value:+.1f}%" if math.isfinite(value) else "-"


def summary_rows(result: BenchResult, message_bytes: int) -> list[list[str]]:
    """Table cells, one list per row, shared by the terminal table and the markdown report."""
    from hipipe.units import format_time

    out = []
    for row in (r for r in result.rows if r.message_bytes == message_bytes):
        vs_themis = result.reduction(row.name, THEMIS, message_bytes)
        sim_themis = result.reduction(row.name, THEMIS, message_bytes, simulated=True)
        vs_torch = result.reduction(row.name, TORCH_NAME, message_bytes)
        torch_row = result.row(TORCH_NAME, message_bytes)
        speedup = f" ({torch_row.median_s / row.median_s:.2f}x)" if torch_row is not None else ""
        out.append(
            [
                row.name,
                format_time(row.median_s),
                f"{format_time(row.min_s)} - {format_time(row.max_s)}",
                f"{row.busbw_bytes_per_s * 8 / 1e6:.1f} Mbit/s",
                format_time(row.predicted_s),
                f"{row.measured_over_predicted:.3f}",
                f"{_pct(vs_themis)} (sim {_pct(sim_themis)})" if row.name != THEMIS else "-",
                (_pct(vs_torch) + speedup) if row.name != TORCH_NAME else "-",
            ]
        )
    return out


SUMMARY_COLUMNS: tuple[str, ...] = (
    "planner",
    "measured median",
    "min - max",
    "busbw",
    "predicted",
    "measured/predicted",
    "reduction vs themis",
    "reduction vs torch",
)


def summary_tables(result: BenchResult) -> list[Table]:
    """One terminal table per message size (the CLI and the benchmark script print these)."""
    tables = []
    shape = "x".join(str(s) for s in result.config.sizes)
    for message_bytes in result.config.messages_bytes:
        table = Table(title=f"{shape}, {format_size(message_bytes)} (median of {result.config.repeats})")
        for column in SUMMARY_COLUMNS:
            table.add_column(column, justify="left" if column == "planner" else "right")
        for cells in summary_rows(result, message_bytes):
            table.add_row(*cells)
        tables.append(table)
    return tables


def render_markdown(result: BenchResult, *, gantt_png: str | None = None) -> str:
    """A report section for one bench run (shape, rates, calibration, one table per size)."""
    config = result.config
    shape = "x".join(str(s) for s in config.sizes)
    lines = [
        f"## {shape} at " + ", ".join(format_rate(r) for r in config.rates_bits_per_s),
        "",
        f"- ranks: {math.prod(config.sizes)}; warm-up {config.warmup}, {config.repeats} timed repeats per row;"
        f" kernel: {result.kernel}",
    ]
    if result.rates:
        lines.append(f"- rate check (TCP goodput, all ranks at once): {describe_rates(result)}")
    if result.calibration is not None:
        lines.append(f"- calibration: {describe_calibration(result.calibration)}")
    lines.append(
        f"- wall time {result.wall_s:.0f} s; host 1-min load average {result.load_average[0]:.2f} before,"
        f" {result.load_average[1]:.2f} after ({os.cpu_count()} cores)"
    )
    for message_bytes in config.messages_bytes:
        lines += ["", f"### {format_size(message_bytes)}", ""]
        lines.append("| " + " | ".join(SUMMARY_COLUMNS) + " |")
        lines.append("|" + "---|" * len(SUMMARY_COLUMNS))
        for cells in summary_rows(result, message_bytes):
            lines.append("| " + " | ".join(cells) + " |")
    if gantt_png:
        lines += ["", f"![planned vs measured Gantt]({gantt_png})"]
    return "\n".join(lines) + "\n"
