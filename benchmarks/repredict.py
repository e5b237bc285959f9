"""Recorded testbed runs predicted again by today's cost model, in seconds instead of an hour.

    .venv/bin/python benchmarks/repredict.py FILE [FILE ...] [--keep-op-s] [--calibration-of OTHER]

Each FILE is a ``hipipe bench --json`` document, or the JSON of ``benchmarks/testbed.py``
(its ``--out`` file, or a log whose last line is its JSON line), which holds one such
document per testbed. Every planner row is predicted again on the calibration it was
predicted on when it ran (:mod:`hipipe.testbed.repredict`), with the per-op cost fitted
again on the recorded overhead run unless ``--keep-op-s``. The card shows, per row, the
recorded measured / predicted beside today's, and in total how many rows are within 10%
and the RMS of ``log(measured / predicted)`` then and now. Rows re-planned because the
document predates recorded schedules are marked ``*``. A document with a traced run
(``hipipe bench --gantt``) gets a second table: that run's op times, measured on rank 0,
against the replay's mean op times, per (dims, phase, size) and per dim. With
``--calibration-of OTHER`` every document is predicted on the calibration (lines and
overheads) that OTHER recorded for the same testbed (shape and rates) instead of its own:
how far a prediction moves with the calibration alone. Documents whose testbed OTHER has
no run of are skipped and named; none left is an error. Needs no root, no testbed and no
torch. Ends with one JSON line.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hipipe.errors import HipipeError
from hipipe.testbed.layout import format_rate
from hipipe.testbed.repredict import (
    RepredictedRun,
    repredict_document,
    rms_log_error,
    same_testbed,
    testbed_name,
)
from hipipe.testbed.residuals import TraceResiduals
from hipipe.units import format_size, format_time

WITHIN = 0.10
"""The fidelity goal of issue 12: measured / predicted within 10%."""


def documents_in(path: Path) -> list[dict[str, Any]]:
    """The bench documents of one file: a document, a testbed benchmark JSON, or a log
    whose last non-empty line is one of those."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            data = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            data = None
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return list(data["runs"])
    if isinstance(data, dict) and "rows" in data:
        return [data]
    raise HipipeError(f"{path}: neither a hipipe bench document nor a testbed benchmark's JSON")


def within(ratio: float) -> bool:
    return abs(ratio - 1.0) <= WITHIN


def card(console: Console, run: RepredictedRun) -> None:
    rates = "/".join(format_rate(r) for r in run.rates_bits_per_s)
    table = Table(
        title=f"{run.shape} at {rates}: per-op cost {run.recorded_op_s * 1e3:.3f} ms recorded, "
        f"{run.op_s * 1e3:.3f} ms now"
    )
    for column in ("row", "size", "measured", "predicted then", "then", "predicted now", "now"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for row in run.rows:
        table.add_row(
            row.name + (" *" if row.replanned else ""),
            format_size(row.message_bytes),
            format_time(row.measured_s),
            format_time(row.recorded_s),
            _ratio(row.recorded_ratio),
            format_time(row.predicted_s),
            _ratio(row.ratio),
        )
    console.print(table)
    if run.residuals is not None:
        residual_card(console, run.residuals)


def residual_card(console: Console, residuals: TraceResiduals) -> None:
    """The traced run's op times against the model, per (dims, phase, size) and per dim."""
    table = Table(
        title=f"traced {residuals.planner} {format_size(residuals.message_bytes)} (rank 0): op time "
        f"measured / modelled (the replay's mean, jitter included); run {format_time(residuals.measured_makespan_s)}"
    )
    for column in ("dims", "phase", "op size", "ops", "measured", "modelled", "ratio"):
        table.add_column(column, justify="right")
    for group in residuals.groups:
        table.add_row(
            ",".join(map(str, group.dims)),
            group.phase,
            format_size(group.full_bytes),
            str(group.count),
            format_time(group.measured_s),
            format_time(group.modelled_s),
            _ratio(group.ratio),
        )
    for load in residuals.dims:
        table.add_row(
            str(load.dim),
            "all",
            "",
            str(load.ops),
            format_time(load.measured_busy_s),
            format_time(load.modelled_busy_s),
            _ratio(load.measured_busy_s / load.modelled_busy_s) if load.modelled_busy_s > 0 else "",
            style="bold",
        )
    console.print(table)


def _ratio(value: float) -> str:
    text = f"{value:.3f}"
    return text if within(value) else f"[red]{text}[/red]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+", help="bench documents or testbed benchmark JSON")
    parser.add_argument(
        "--keep-op-s", action="store_true", help="keep the recorded per-op cost instead of fitting it again"
    )
    parser.add_argument(
        "--calibration-of",
        type=Path,
        metavar="OTHER",
        help="predict on the calibration OTHER (a bench document or testbed benchmark JSON) recorded for the same testbed",
    )
    args = parser.parse_args()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    runs: list[RepredictedRun] = []
    try:
        others = documents_in(args.calibration_of) if args.calibration_of is not None else None
        skipped: list[str] = []
        for path in args.files:
            for document in documents_in(path):
                other = (
                    None if others is None else next((o for o in others if same_testbed(o, document)), None)
                )
                if others is not None and other is None:
                    skipped.append(testbed_name(document))
                    continue
                runs.append(repredict_document(document, refit_op_s=not args.keep_op_s, calibration_of=other))
        if not runs:
            raise HipipeError(
                f"{args.calibration_of}: no run of {', '.join(skipped)} to take the calibration of"
            )
    except (OSError, HipipeError) as error:
        console.print(f"[red]error:[/red] {error}", markup=True)
        return 2
    if args.calibration_of is not None:
        console.print(
            f"predicted on the calibrations {args.calibration_of} recorded for the same testbeds"
            + (f"; skipped (no such calibration there): {', '.join(skipped)}" if skipped else "")
        )
    for run in runs:
        card(console, run)
    rows = [row for run in runs for row in run.rows]
    then = [row.recorded_ratio for row in rows]
    now = [row.ratio for row in rows]
    summary = {
        "benchmark": "repredict",
        "rows": len(rows),
        "replanned": sum(row.replanned for row in rows),
        "within_10pct_recorded": sum(map(within, then)),
        "within_10pct_now": sum(map(within, now)),
        "rms_log_error_recorded": rms_log_error(then),
        "rms_log_error_now": rms_log_error(now),
        "op_s_refitted": not args.keep_op_s,
        "calibration_of": None if args.calibration_of is None else str(args.calibration_of),
        "traced_dim_busy_measured_over_modelled": [
            {
                "shape": run.shape,
                "planner": run.residuals.planner,
                "per_dim": [round(d.measured_busy_s / d.modelled_busy_s, 4) for d in run.residuals.dims],
            }
            for run in runs
            if run.residuals is not None
        ],
    }
    console.print(
        f"within 10%: {summary['within_10pct_recorded']} of {len(rows)} as recorded, "
        f"{summary['within_10pct_now']} now; RMS log error {summary['rms_log_error_recorded']:.4f} "
        f"recorded, {summary['rms_log_error_now']:.4f} now"
        + (f"; {summary['replanned']} rows re-planned (*)" if summary["replanned"] else "")
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
