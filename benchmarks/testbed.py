"""Measured AllReduce on the emulated testbed: hipipe vs baselines vs torch all_reduce.

    sudo .venv/bin/python benchmarks/testbed.py [--quick] [--out benchmarks/results]

Runs ``hipipe bench`` (:func:`hipipe.testbed.bench.run_bench`) on a 2x4 and a 2x2x2
testbed with heterogeneous rates, prints a card per shape and the goals (met or missed,
with the numbers), and ends with one JSON line. With ``--out DIR`` it also writes
``testbed-<machine>-<date>.md`` and ``.png`` (planned vs measured Gantt of one hipipe
run per shape).

Goals (HIPIPE.md, issue 5): hipipe >= 2x faster than torch all_reduce on 2x4 at
50/200 Mbit/s for 64 MiB; measured/predicted within 15% for the calibrated hipipe plan
at 16 MiB and above; measured reduction vs themis within 5 points of the simulated one.
Before each shape it waits (bounded) for the host to be quiet, since 8 ranks on 2
cores are sensitive to other work; the load average is reported either way.
"""

import argparse
import datetime
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from hipipe.files import atomic_write_bytes, atomic_write_text
from hipipe.report.bench import render_markdown, result_to_dict, summary_tables
from hipipe.report.gantt import render_gantt_png
from hipipe.testbed import host
from hipipe.testbed.bench import run_bench
from hipipe.testbed.layout import parse_rates_bits_per_s, parse_shape
from hipipe.testbed.results import THEMIS, TORCH_NAME, BenchConfig, BenchResult
from hipipe.testbed.shaping import detect_host

MIB = 1024**2
SHAPES: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("2x4", "50,200Mbit", (16 * MIB, 64 * MIB)),
    ("2x2x2", "200,50,100Mbit", (16 * MIB, 64 * MIB)),
)
QUICK_SHAPES: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("2x4", "50,200Mbit", (16 * MIB,)),
    ("2x2x2", "200,50,100Mbit", (16 * MIB,)),
)
PLANNERS = ("hipipe", "themis", "themis-ideal", "pipelined", "hierarchical")
SPEEDUP_GOAL = 2.0
RATIO_GOAL = 0.15
REDUCTION_GOAL_POINTS = 5.0
QUIET_WAIT_S = 300.0


def wait_for_quiet_host(console: Console) -> float:
    """Wait (bounded) until other work uses under a quarter of the CPU; return the last reading."""
    return host.wait_for_quiet_host(
        QUIET_WAIT_S,
        on_wait=lambda busy: console.print(
            f"[dim]host CPU {100 * busy:.0f}% busy with other work: waiting for a quieter machine[/dim]"
        ),
    )


def goals(result: BenchResult, shape: str) -> list[dict[str, Any]]:
    """Each goal that applies to this shape, per message size, with its numbers."""
    out: list[dict[str, Any]] = []
    for message_bytes in result.config.messages_bytes:
        hipipe, torch_row = result.row("hipipe", message_bytes), result.row(TORCH_NAME, message_bytes)
        size = f"{message_bytes // MIB} MiB"
        if hipipe is None:
            continue
        if shape == "2x4" and message_bytes == 64 * MIB and torch_row is not None:
            speedup = torch_row.median_s / hipipe.median_s
            out.append(
                {"goal": f"hipipe >= {SPEEDUP_GOAL:g}x torch all_reduce", "shape": shape, "size": size}
                | {"value": round(speedup, 3), "met": speedup >= SPEEDUP_GOAL}
            )
        if message_bytes >= 16 * MIB:
            ratio = hipipe.measured_over_predicted
            out.append(
                {"goal": "hipipe measured/predicted within 15%", "shape": shape, "size": size}
                | {"value": round(ratio, 3), "met": abs(ratio - 1) <= RATIO_GOAL}
            )
        measured = result.reduction("hipipe", THEMIS, message_bytes)
        simulated = result.reduction("hipipe", THEMIS, message_bytes, simulated=True)
        if math.isfinite(measured):
            gap = 100 * (measured - simulated)
            out.append(
                {"goal": "reduction vs themis within 5 points of simulated", "shape": shape, "size": size}
                | {
                    "value": f"measured {100 * measured:.1f}%, simulated {100 * simulated:.1f}%",
                    "gap_points": round(gap, 1),
                    "met": abs(gap) <= REDUCTION_GOAL_POINTS,
                }
            )
    return out


def card(console: Console, result: BenchResult) -> None:
    for table in summary_tables(result):
        console.print(table)


def write_report(
    out: Path,
    stem: str,
    results: list[tuple[str, BenchResult]],
    all_goals: list[dict[str, Any]],
    busy: dict[str, float],
) -> None:
    machine = stem.split("-")[1]
    lines = [
        f"# Testbed benchmark ({machine}, {datetime.date.today().isoformat()})",
        "",
        "Emulated network: one Linux network namespace per rank behind a bridge, one htb class",
        "per dimension on each rank's veth (classified by destination, packets < 128 B unshaped),",
        "Gloo on CPU. Predictions come from the topology calibrated on the same testbed",
        "(`hipipe calibrate`), and every plan is made on it. Times are the slowest rank's, median",
        "of the timed repeats after one warm-up; `busbw = M/t * 2(N-1)/N`. Reductions are",
        "`1 - t/t_ref`; for themis the simulated one (from the predictions) is shown beside.",
        "Produced by `benchmarks/testbed.py`.",
        "",
        "## Goals",
        "",
        "| goal | shape | size | value | met |",
        "|---|---|---|---|---|",
    ]
    for goal in all_goals:
        value = (
            goal["value"] if "gap_points" not in goal else f"{goal['value']} (gap {goal['gap_points']} pts)"
        )
        lines.append(
            f"| {goal['goal']} | {goal['shape']} | {goal['size']} | {value} | {'yes' if goal['met'] else 'NO'} |"
        )
    lines.append("")
    for shape, result in results:
        lines.append(render_markdown(result))
        lines.append(
            f"Other work on the host just before this shape: {100 * busy.get(shape, 0):.0f}% CPU busy.\n"
        )
    lines += ["", f"![planned vs measured Gantt of hipipe runs]({stem}.png)", ""]
    atomic_write_text(out / f"{stem}.md", "\n".join(lines))
    panels = [panel for _, result in results for panel in result.gantt_panels]
    if panels:
        atomic_write_bytes(out / f"{stem}.png", render_gantt_png(panels))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report and PNG here")
    args = parser.parse_args()
    # `kill` must still tear the testbed down (run_bench's finally): make SIGTERM an exception.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    console = Console(highlight=False)
    problem = detect_host().problem()
    if problem is not None:
        console.print(f"testbed benchmark skipped: {problem}")
        print(json.dumps({"benchmark": "testbed", "skipped": problem}))
        return 0
    results: list[tuple[str, BenchResult]] = []
    all_goals: list[dict[str, Any]] = []
    busy: dict[str, float] = {}
    for shape, rates, messages in QUICK_SHAPES if args.quick else SHAPES:
        busy_before = wait_for_quiet_host(console)
        sizes = parse_shape(shape)
        config = BenchConfig(
            sizes=sizes,
            rates_bits_per_s=parse_rates_bits_per_s(rates, len(sizes)),
            messages_bytes=messages,
            planners=PLANNERS,
            repeats=args.repeats,
        )
        console.print(f"[bold]{shape} at {rates}[/bold]: {', '.join(f'{m // MIB} MiB' for m in messages)}")
        result = run_bench(config, progress=lambda done, total, what: None)
        results.append((shape, result))
        busy[shape] = busy_before
        card(console, result)
        all_goals += goals(result, shape)
    for goal in all_goals:
        mark = "[green]met[/green]" if goal["met"] else "[red]MISSED[/red]"
        console.print(f"{mark} {goal['goal']} ({goal['shape']}, {goal['size']}): {goal['value']}")
    machine = f"{os.cpu_count()}cpu"
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"testbed-{machine}-{datetime.date.today().isoformat()}"
        write_report(args.out, stem, results, all_goals, busy)
        console.print(f"[dim]wrote {args.out / stem}.md and .png[/dim]")
    print(
        json.dumps(
            {
                "benchmark": "testbed",
                "machine": machine,
                "goals": all_goals,
                "cpu_busy_before": busy,
                "runs": [result_to_dict(r) for _, r in results],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
