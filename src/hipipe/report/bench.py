"""Reports of a testbed benchmark: the JSON document, terminal tables, a markdown section.

``hipipe bench`` prints :func:`summary_tables` and writes :func:`result_to_dict`;
``benchmarks/testbed.py`` adds :func:`render_markdown`. The cells of the terminal
table and of the markdown table come from one function (:func:`summary_rows`).
"""

import math
import os
from typing import Any

from rich.table import Table

from hipipe.schedule import schedule_to_dict
from hipipe.testbed.fit import Calibration
from hipipe.testbed.layout import format_rate
from hipipe.testbed.results import THEMIS, TORCH_NAME, BenchResult
from hipipe.topology_io import topology_to_dict
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
        parts.append(f"overheads {calibration.overheads.describe()}")
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
