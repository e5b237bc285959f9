"""Reports of a testbed benchmark: the JSON document, terminal tables, a markdown section.

``hipipe bench`` prints :func:`summary_tables` and :func:`cell_lines` and writes
:func:`result_to_dict`; ``benchmarks/testbed.py`` adds :func:`render_markdown` and
:func:`fidelity_summary_markdown`. The cells of the terminal table and of the markdown
table come from one function (:func:`summary_rows`); the fidelity numbers and goals from
:mod:`hipipe.testbed.fidelity`, rendered here only.
"""

import math
import os
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from hipipe.schedule import Collective, schedule_to_dict
from hipipe.testbed.fidelity import (
    HOST_BOUND_BUSY_SHARE,
    HOST_BOUND_CORRELATION,
    REDUCTION_PLANNER,
    CellFidelity,
    cell_fidelity,
    relative_spread,
    result_fidelity,
)
from hipipe.testbed.fit import Calibration
from hipipe.testbed.layout import format_rate
from hipipe.testbed.results import THEMIS, BenchConfig, BenchResult, is_torch_row
from hipipe.topology_io import topology_to_dict
from hipipe.tuning.cache import TunedEntry
from hipipe.units import format_size, format_time


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
                "spread": _finite(relative_spread(row)),
                "host_cpu_s": list(row.host_cpu_s),
                "host_busy_cpus": _finite(row.host_busy_cpus),
                "cpu_time_correlation": _finite(row.cpu_time_correlation),
                "cpu_bound_s": row.cpu_bound_s,
                "reduction_vs_themis": _finite(result.reduction(row.name, THEMIS, row.message_bytes)),
                "simulated_reduction_vs_themis": _finite(
                    result.reduction(row.name, THEMIS, row.message_bytes, simulated=True)
                ),
                "reduction_vs_torch": _finite(
                    result.reduction(row.name, result.config.torch_name, row.message_bytes)
                ),
            }
            | ({} if row.schedule is None else {"schedule": schedule_to_dict(row.schedule)})
        )
    return {
        "format": "hipipe.bench",
        "version": 1,
        "shape": "x".join(str(s) for s in config.sizes),
        "num_ranks": math.prod(config.sizes),
        "rates_bits_per_s": list(config.rates_bits_per_s),
        "collective": config.collective.value,
        "messages_bytes": list(config.messages_bytes),
        "warmup": config.warmup,
        "repeats": config.repeats,
        "max_repeats": config.max_repeats,
        "precision": config.precision,
        "jobs": config.jobs,
        "extra_jobs": config.extra_jobs,
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
        # Present when the predictions used a calibration refitted among the rows: the plans' one.
        "calibration_before_rows": (
            result.calibration_before_rows.to_dict() if result.calibration_before_rows else None
        ),
        "topology": topology_to_dict(result.topology),
        "rows": rows,
        # Per message size: the fidelity numbers and the four goals (hipipe.testbed.fidelity).
        "cells": [_cell_to_dict(result, cell) for cell in result_fidelity(result)],
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


def _cell_to_dict(result: BenchResult, cell: CellFidelity) -> dict[str, Any]:
    """One cell of the JSON: per-row numbers, spread, pair order, reduction vs themis, tuning, goals."""
    rows = [r for r in result.rows if r.message_bytes == cell.message_bytes]
    entry = result.tuning_entry(cell.message_bytes)
    tuned = cell.tuned
    return {
        "message_bytes": cell.message_bytes,
        "planners": {
            r.name: {
                "median_s": r.median_s,
                "min_s": r.min_s,
                "max_s": r.max_s,
                "predicted_s": r.predicted_s,
                "measured_over_predicted": _finite(r.measured_over_predicted),
                "spread": _finite(cell.spreads[r.name]),
                "host_bound": r.name in cell.host_bound,
            }
            for r in rows
        },
        "spread": _finite(cell.spread),
        "pairs": {
            "ranked_as_predicted": cell.pairs_ranked,
            "of": len(cell.pairs),
            "misordered": [[p.first, p.second] for p in cell.misordered],
            "pairs": [
                {
                    "first": p.first,
                    "second": p.second,
                    "predicted_s": list(p.predicted_s),
                    "measured_s": list(p.measured_s),
                    "agrees": p.agrees,
                    "ranges_overlap": p.ranges_overlap,
                }
                for p in cell.pairs
            ],
        },
        "reduction_vs_themis": {
            "planner": REDUCTION_PLANNER,
            "measured": _finite(cell.reduction_measured),
            "simulated": _finite(cell.reduction_simulated),
            "gap_points": _finite(cell.reduction_gap_points),
        },
        "tuned": None
        if tuned is None
        else {
            "kept": cell.tuned_choice,
            "median_s": tuned.tuned_s,
            "fastest_baseline": tuned.baseline,
            "fastest_baseline_median_s": tuned.baseline_s,
            "slower_by": tuned.slower_by,
            "tolerance": _finite(tuned.tolerance),
            "met": tuned.met,
        },
        "tuning": None if entry is None else _tuning_to_dict(entry),
        "goals": [{"goal": g.name, "met": g.met, "value": g.value} for g in cell.goals],
    }


def _tuning_to_dict(entry: TunedEntry) -> dict[str, Any]:
    return {
        "kept": entry.chosen,
        "candidates": [m.to_dict() for m in entry.measurements],
    }


def describe_calibration(calibration: Calibration) -> str:
    """``dim 0 48.2 Mbit/s + 1.2 ms/op; ...; +0.8 ms per op in pipelined runs``."""
    parts = [
        f"dim {f.dim} {f.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s + {f.constant_s * 1e3:.2f} ms/op"
        f" (worst residual {100 * f.max_relative_residual:.0f}%)"
        for f in calibration.fits
    ]
    if calibration.overhead_times_s:
        parts.append(f"overheads {calibration.overheads.describe()}")
    if calibration.host_cpu_scale is not None:
        parts.append(
            f"host CPU x{calibration.host_cpu_scale:.2f} of the isolated fit (measured in the overhead run)"
        )
    return "; ".join(parts)


def calibration_lines(result: BenchResult) -> list[str]:
    """What the plans and the predictions were made on: one calibration, or the one before
    the rows and the one refitted among them."""
    if result.calibration is None:
        return []
    if result.calibration_before_rows is None:
        return [f"calibration: {describe_calibration(result.calibration)}"]
    return [
        f"calibration (plans): {describe_calibration(result.calibration_before_rows)}",
        "calibration (predictions; its overhead schedule run again among the rows):"
        f" {describe_calibration(result.calibration)}",
    ]


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
    out = []
    for row in (r for r in result.rows if r.message_bytes == message_bytes):
        vs_themis = result.reduction(row.name, THEMIS, message_bytes)
        sim_themis = result.reduction(row.name, THEMIS, message_bytes, simulated=True)
        torch_name = result.config.torch_name
        vs_torch = result.reduction(row.name, torch_name, message_bytes)
        torch_row = result.row(torch_name, message_bytes)
        speedup = f" ({torch_row.median_s / row.median_s:.2f}x)" if torch_row is not None else ""
        out.append(
            [
                row.name,
                format_time(row.median_s),
                f"{format_time(row.min_s)} - {format_time(row.max_s)}",
                f"{row.busbw_bytes_per_s * 8 / 1e6:.1f} Mbit/s",
                format_time(row.predicted_s),
                f"{row.measured_over_predicted:.3f}",
                f"{100 * relative_spread(row):.1f}%",
                _cpus(row.host_busy_cpus),
                str(len(row.times_s)),
                f"{_pct(vs_themis)} (sim {_pct(sim_themis)})" if row.name != THEMIS else "-",
                (_pct(vs_torch) + speedup) if row.name != torch_name else "-",
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
    "spread",
    "host CPUs busy",
    "runs",
    "reduction vs themis",
    "reduction vs torch",
)


def _cpus(busy: float) -> str:
    return f"{busy:.2f}" if math.isfinite(busy) else "-"


def _what(config: BenchConfig) -> str:
    """The collective in a title, only when it is not the default AllReduce."""
    return "" if config.collective is Collective.ALL_REDUCE else f"{config.collective.value} of "


def _runs(config: BenchConfig) -> str:
    fewest, most = config.runs_range
    runs = f"{fewest}" if fewest == most else f"{fewest}-{most}"
    extra = config.usable_extra_jobs
    return (
        f"{runs} runs"
        + (f" in {config.jobs} jobs" if config.jobs > 1 else "")
        + (f", up to {extra} more jobs if unsettled" if extra else "")
    )


def _repeats(config: BenchConfig) -> str:
    """How a row is timed, in words: the rule, and its share per worker job."""
    extra = config.usable_extra_jobs
    more = (
        f" (up to {extra} more jobs for a row whose median is unsettled over all its runs)" if extra else ""
    )
    if config.jobs == 1:
        return config.repeat_rule.describe() + " per row" + more
    return (
        f"{config.repeat_rule.per_job(config.jobs).describe()} in each of {config.jobs} worker jobs per row"
        + more
    )


def goal_mark(met: bool | None) -> str:
    """``met``, ``MISSED`` or ``n/a`` (not measured in this run) for a goal's ``met``."""
    return "n/a" if met is None else ("met" if met else "MISSED")


def cell_lines(result: BenchResult, message_bytes: int) -> list[str]:
    """Plain-text lines under one size's table: spread, misordered pairs, the tuning, the four goals.

    The terminal prints them as they are; :func:`render_markdown` makes them bullets.
    """
    cell = cell_fidelity(result, message_bytes)
    lines = []
    if math.isfinite(cell.spread):
        noisiest = max(cell.spreads, key=lambda name: cell.spreads[name])
        lines.append(
            f"spread (max - min) / median of the timed repeats: up to {100 * cell.spread:.1f}% ({noisiest})"
        )
    lines += [f"misordered: {p.describe()}" for p in cell.misordered]
    lines += _cpu_lines(result, cell)
    entry = result.tuning_entry(message_bytes)
    if entry is not None:
        measured = ", ".join(f"{m.name} {format_time(m.median_s)}" for m in entry.measurements)
        lines.append(f"tuning kept {entry.chosen} (medians: {measured}); measured again as hipipe-tuned")
    lines += [f"{goal_mark(g.met)}: {g.name}: {g.value}" for g in cell.goals]
    return lines


def _cpu_lines(result: BenchResult, cell: CellFidelity) -> list[str]:
    """The host's CPUs busy per row beside each plan's CPU bound and how closely its runs'
    times followed their CPU: which rows the host's CPU bound, and which were host-bound."""
    rows = [
        r for r in result.rows if r.message_bytes == cell.message_bytes and math.isfinite(r.host_busy_cpus)
    ]
    if not rows:
        return []
    overheads = result.topology.overheads
    of = f" (the ranks can keep {overheads.host_cores:.2f} busy)" if overheads.charges_cpu else ""
    parts = []
    for r in rows:
        notes = []
        if r.cpu_bound_s:
            notes.append(f"CPU bound {format_time(r.cpu_bound_s)} of predicted {format_time(r.predicted_s)}")
        if math.isfinite(r.cpu_time_correlation):
            notes.append(f"time vs CPU r {r.cpu_time_correlation:.2f}")
        parts.append(f"{r.name} {r.host_busy_cpus:.2f}" + (f" ({', '.join(notes)})" if notes else ""))
    lines = [f"host CPUs busy during the runs{of}: " + ", ".join(parts)]
    if cell.host_bound:
        lines.append(
            f"host-bound (>= {HOST_BOUND_BUSY_SHARE:.0%} of those CPUs busy, time vs CPU r >="
            f" {HOST_BOUND_CORRELATION}): {', '.join(cell.host_bound)}: their run-to-run spread follows the CPU the host spent"
        )
    return lines


def summary_tables(result: BenchResult) -> list[Table]:
    """One terminal table per message size (the CLI and the benchmark script print these)."""
    tables = []
    shape = "x".join(str(s) for s in result.config.sizes)
    for message_bytes in result.config.messages_bytes:
        title = (
            f"{shape}, {_what(result.config)}{format_size(message_bytes)} (median of {_runs(result.config)})"
        )
        table = Table(title=title)
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
        f"## {_what(config)}{shape} at " + ", ".join(format_rate(r) for r in config.rates_bits_per_s),
        "",
        f"- ranks: {math.prod(config.sizes)}; warm-up {config.warmup}, {_repeats(config)};"
        f" kernel: {result.kernel}",
    ]
    if result.rates:
        lines.append(f"- rate check (TCP goodput, all ranks at once): {describe_rates(result)}")
    lines += [f"- {line}" for line in calibration_lines(result)]
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
        lines.append("")
        lines += [f"- {line}" for line in cell_lines(result, message_bytes)]
    if gantt_png:
        lines += ["", f"![planned vs measured Gantt]({gantt_png})"]
    return "\n".join(lines) + "\n"


FIDELITY_COLUMNS: tuple[str, ...] = (
    "testbed",
    "size",
    "measured/predicted (worst)",
    "spread",
    "pairs as predicted",
    "reduction vs themis: measured / simulated",
    "hipipe-tuned vs fastest baseline",
    "goals met",
)


def fidelity_summary_markdown(results: Sequence[BenchResult]) -> str:
    """One table row per cell of every run: the fidelity report's summary."""
    lines = ["| " + " | ".join(FIDELITY_COLUMNS) + " |", "|" + "---|" * len(FIDELITY_COLUMNS)]
    for result in results:
        testbed = (
            "x".join(map(str, result.config.sizes))
            + " at "
            + ", ".join(format_rate(r) for r in result.config.rates_bits_per_s)
        )
        for cell in result_fidelity(result):
            ratios = {n: v for n, v in cell.ratios.items() if not is_torch_row(n) and math.isfinite(v)}
            worst = max(ratios, key=lambda n: abs(ratios[n] - 1), default=None)
            tuned = cell.tuned
            checked = [g for g in cell.goals if g.met is not None]
            cells = [
                testbed,
                format_size(cell.message_bytes),
                f"{ratios[worst]:.3f} ({worst})" if worst is not None else "-",
                f"{100 * cell.spread:.1f}%" if math.isfinite(cell.spread) else "-",
                f"{cell.pairs_ranked}/{len(cell.pairs)}" if cell.pairs else "-",
                f"{_pct(cell.reduction_measured)} / {_pct(cell.reduction_simulated)}"
                + (
                    f" ({cell.reduction_gap_points:+.1f} pts)"
                    if math.isfinite(cell.reduction_gap_points)
                    else ""
                ),
                f"{100 * tuned.slower_by:+.1f}% vs {tuned.baseline} (spread {100 * tuned.tolerance:.1f}%)"
                if tuned is not None
                else "-",
                f"{sum(bool(g.met) for g in checked)}/{len(checked)}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
