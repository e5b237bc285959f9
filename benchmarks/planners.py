"""Every planner over the reference configurations: time, utilization, reductions, plan time.

    python benchmarks/planners.py [--quick] [--collectives all_reduce,...] [--out benchmarks/results]

For each collective (AllReduce, ReduceScatter, AllGather by default) prints one card per
configuration, then the goals (met or missed, with the ceiling the cost model allows),
and ends with one JSON line. With ``--out DIR`` it also writes
``planners-<machine>-<date>.md`` and ``.png`` (utilization vs message size, one line per
planner, one panel per configuration, one row per collective). Plan time is the wall
time of one planner call, chunk-number search included, best of ``--repeat`` calls (the
machine is shared). Message sizes are the full per-rank buffer for every collective.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hipipe import BASELINES, PLANNERS, plan
from hipipe.bounds import latency_aware_bound_s, order_mix_bound_s
from hipipe.cost import lower_bound_s
from hipipe.presets import PRESETS
from hipipe.schedule import Collective

MIB = 1024**2
MESSAGES = (1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB, 4096 * MIB)
QUICK_MESSAGES = (1 * MIB, 256 * MIB, 4096 * MIB)
QUICK_PRESETS = ("rfs-3d", "tpu-2d", "hgx-h100-32")
MIX_GOAL_PRESETS = ("switch-3d-512", "tpu-2d", "hgx-h100-32")
BIG_BYTES = 256 * MIB
MIX_GOAL_BYTES = 1024 * MIB
HALF_MIX_GOAL = 0.95
"""ReduceScatter and AllGather: mean T_mix/T over the >= 256 MiB cells of the six networks."""
PLAN_TIME_SLACK = 1.2
"""An RS/AG plan counts as slower to make than the AllReduce of the same size above this ratio
(plan times are wall times on a shared machine)."""


def _size(message_bytes: int) -> str:
    return f"{message_bytes // 1024**3} GiB" if message_bytes >= 1024**3 else f"{message_bytes // MIB} MiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def run_cell(preset: str, message_bytes: int, repeat: int, collective: Collective) -> dict[str, Any]:
    """All planners on one (configuration, message, collective): times, plan times (best
    of ``repeat`` calls, as timeit does: the machine is shared), bounds."""
    topology = PRESETS[preset]()
    cell: dict[str, Any] = {
        "collective": collective.value,
        "preset": preset,
        "message_bytes": message_bytes,
        "num_dims": topology.num_dims,
        "lower_bound_s": lower_bound_s(topology, message_bytes, collective),
        "order_mix_bound_s": order_mix_bound_s(topology, message_bytes, collective),
        "latency_aware_bound_s": latency_aware_bound_s(topology, message_bytes, collective),
        "planners": {},
    }
    for name in PLANNERS:
        plan_s = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            schedule = plan(topology, message_bytes, name, collective=collective)
            plan_s = min(plan_s, time.perf_counter() - start)
        cell["planners"][name] = {
            "time_s": schedule.makespan_s,
            "utilization": cell["lower_bound_s"] / schedule.makespan_s,
            "plan_s": plan_s,
            "num_chunks": schedule.num_chunks,
        }
    times = {name: cell["planners"][name]["time_s"] for name in BASELINES}
    best = min(times, key=lambda name: times[name])
    hipipe_s = cell["planners"]["hipipe"]["time_s"]
    cell["best_baseline"] = best
    cell["reduction_vs_best"] = 1 - hipipe_s / times[best]
    cell["reduction_vs_themis"] = 1 - hipipe_s / times["themis"]
    cell["reduction_vs_themis_ideal"] = 1 - hipipe_s / times["themis-ideal"]
    cell["ceiling_vs_best"] = 1 - max(cell["order_mix_bound_s"], cell["latency_aware_bound_s"]) / times[best]
    cell["ceiling_vs_themis"] = (
        1 - max(cell["order_mix_bound_s"], cell["latency_aware_bound_s"]) / times["themis"]
    )
    cell["utilization_of_mix_bound"] = cell["order_mix_bound_s"] / hipipe_s
    cell["max_utilization_of_mix_bound"] = cell["order_mix_bound_s"] / cell["latency_aware_bound_s"]
    cell["hipipe_never_slower"] = all(hipipe_s <= t for t in times.values())
    return cell


def card(console: Console, preset: str, cells: list[dict[str, Any]]) -> None:
    topology = PRESETS[preset]()
    collective = cells[0]["collective"]
    table = Table(title=f"{preset} {collective}: {topology.num_npus} NPUs", title_justify="left")
    for column in (
        "message",
        "T* ms",
        "T_mix ms",
        "hipipe ms",
        "U",
        "U/U_mix",
        "best baseline",
        "vs best",
        "themis ms",
        "vs themis",
        "vs themis-ideal",
        "K",
        "plan ms",
        "uniform U",
        "k64 U",
        "fixed-order U",
    ):
        table.add_column(column, justify="right")
    for cell in cells:
        planners = cell["planners"]
        hipipe = planners["hipipe"]
        best = cell["best_baseline"]
        table.add_row(
            _size(cell["message_bytes"]),
            _ms(cell["lower_bound_s"]),
            _ms(cell["order_mix_bound_s"]),
            _ms(hipipe["time_s"]),
            f"{hipipe['utilization']:.3f}",
            f"{cell['utilization_of_mix_bound']:.4f}",
            f"{best} {_ms(planners[best]['time_s'])}",
            f"{cell['reduction_vs_best']:+.1%}",
            _ms(planners["themis"]["time_s"]),
            f"{cell['reduction_vs_themis']:+.1%}",
            f"{cell['reduction_vs_themis_ideal']:+.1%}",
            str(hipipe["num_chunks"]),
            f"{hipipe['plan_s'] * 1e3:.1f}",
            f"{planners['hipipe-uniform']['utilization']:.3f}",
            f"{planners['hipipe-k64']['utilization']:.3f}",
            f"{planners['hipipe-fixed-order']['utilization']:.3f}",
        )
    console.print(table)


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The goals of the issue, each with its measured value and what the cost model allows."""
    big = [c for c in cells if c["message_bytes"] >= BIG_BYTES]
    mix_cells = [c for c in cells if c["preset"] in MIX_GOAL_PRESETS and c["message_bytes"] >= MIX_GOAL_BYTES]
    plan_times = [c["planners"]["hipipe"]["plan_s"] for c in cells if c["num_dims"] <= 4]
    mean = statistics.fmean
    return {
        "collective": cells[0]["collective"] if cells else None,
        "cells": len(cells),
        "mean_utilization_of_mix_bound_256MiB_up": mean(c["utilization_of_mix_bound"] for c in big)
        if big
        else None,
        "ceiling_utilization_of_mix_bound_256MiB_up": mean(c["max_utilization_of_mix_bound"] for c in big)
        if big
        else None,
        "never_slower_violations": sum(not c["hipipe_never_slower"] for c in cells),
        "mean_reduction_vs_best_256MiB_up": mean(c["reduction_vs_best"] for c in big) if big else None,
        "ceiling_reduction_vs_best_256MiB_up": mean(c["ceiling_vs_best"] for c in big) if big else None,
        "mean_reduction_vs_themis": mean(c["reduction_vs_themis"] for c in cells),
        "mean_reduction_vs_themis_ideal": mean(c["reduction_vs_themis_ideal"] for c in cells),
        "ceiling_reduction_vs_themis": mean(c["ceiling_vs_themis"] for c in cells),
        "utilization_of_mix_bound_1GiB_up": {
            f"{c['preset']}@{_size(c['message_bytes'])}": round(c["utilization_of_mix_bound"], 5)
            for c in mix_cells
        },
        "max_utilization_of_mix_bound_1GiB_up": {
            f"{c['preset']}@{_size(c['message_bytes'])}": round(c["max_utilization_of_mix_bound"], 5)
            for c in mix_cells
        },
        "plan_time_median_s": statistics.median(plan_times) if plan_times else None,
        "plan_time_max_s": max(plan_times) if plan_times else None,
    }


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def half_goals_text(summary: dict[str, Any]) -> list[str]:
    """The goals of ReduceScatter and AllGather (issue 8)."""
    lines = [
        f"- hipipe never slower than a baseline: {summary['never_slower_violations']} violations in "
        f"{summary['cells']} cells ({verdict(summary['never_slower_violations'] == 0)})",
    ]
    value = summary["mean_utilization_of_mix_bound_256MiB_up"]
    if value is not None:
        lines.append(
            f"- mean T_mix/T, >= 256 MiB: {value:.4f} (goal {HALF_MIX_GOAL}: {verdict(value >= HALF_MIX_GOAL)};"
            f" ceiling of the cost model, mean T_mix/max(T_mix, latency floor):"
            f" {summary['ceiling_utilization_of_mix_bound_256MiB_up']:.4f})"
        )
    lines.append(
        f"- plan time (<= 4 dims): median {summary['plan_time_median_s'] * 1e3:.1f} ms,"
        f" max {summary['plan_time_max_s'] * 1e3:.1f} ms"
    )
    return lines


def plan_time_comparison(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """RS/AG plan time against the AllReduce plan time of the same (network, size)."""
    allreduce = {
        (c["preset"], c["message_bytes"]): c["planners"]["hipipe"]["plan_s"]
        for c in cells
        if c["collective"] == Collective.ALL_REDUCE.value
    }
    out: dict[str, Any] = {}
    for kind in (Collective.REDUCE_SCATTER.value, Collective.ALL_GATHER.value):
        ratios = [
            c["planners"]["hipipe"]["plan_s"] / allreduce[(c["preset"], c["message_bytes"])]
            for c in cells
            if c["collective"] == kind and (c["preset"], c["message_bytes"]) in allreduce
        ]
        if ratios:
            out[kind] = {
                "median_ratio": statistics.median(ratios),
                "max_ratio": max(ratios),
                "cells_slower": sum(r > PLAN_TIME_SLACK for r in ratios),
                "cells": len(ratios),
            }
    return out


def plan_time_text(comparison: dict[str, Any]) -> list[str]:
    return [
        f"- {kind} plan time / all_reduce plan time, same network and size: median {v['median_ratio']:.2f},"
        f" max {v['max_ratio']:.2f}; {v['cells_slower']} of {v['cells']} cells above {PLAN_TIME_SLACK}"
        f" (goal: no worse: {verdict(v['median_ratio'] <= 1.0)})"
        for kind, v in comparison.items()
    ]


def goals_text(summary: dict[str, Any]) -> list[str]:
    if summary.get("collective") not in (None, Collective.ALL_REDUCE.value):
        return half_goals_text(summary)
    mix_values = summary["utilization_of_mix_bound_1GiB_up"]
    mix_missed = {k: v for k, v in mix_values.items() if v < 0.99}
    lines = [
        f"- hipipe never slower than a baseline: {summary['never_slower_violations']} violations in "
        f"{summary['cells']} cells ({verdict(summary['never_slower_violations'] == 0)})",
    ]
    if summary["mean_reduction_vs_best_256MiB_up"] is not None:
        lines.append(
            f"- mean reduction vs best baseline, >= 256 MiB: {summary['mean_reduction_vs_best_256MiB_up']:.1%}"
            f" (goal 30%: {verdict(summary['mean_reduction_vs_best_256MiB_up'] >= 0.30)};"
            f" ceiling of the cost model, 1 - max(T_mix, latency floor)/T_best:"
            f" {summary['ceiling_reduction_vs_best_256MiB_up']:.1%})"
        )
    lines.append(
        f"- mean reduction vs themis, whole grid: {summary['mean_reduction_vs_themis']:.1%}"
        f" (goal 60%: {verdict(summary['mean_reduction_vs_themis'] >= 0.60)};"
        f" ceiling {summary['ceiling_reduction_vs_themis']:.1%}); vs themis-ideal"
        f" {summary['mean_reduction_vs_themis_ideal']:.1%}"
    )
    if mix_values:
        ceilings = summary["max_utilization_of_mix_bound_1GiB_up"]
        lines.append(
            f"- U / U_mix >= 0.99 at >= 1 GiB on {', '.join(MIX_GOAL_PRESETS)}: "
            f"min {min(mix_values.values()):.4f} ({verdict(not mix_missed)})"
            + (
                "; below 0.99: "
                + ", ".join(
                    f"{k} {v:.4f} (cost-model ceiling {ceilings[k]:.4f})" for k, v in mix_missed.items()
                )
                if mix_missed
                else ""
            )
        )
    lines.append(
        f"- plan time (<= 4 dims): median {summary['plan_time_median_s'] * 1e3:.1f} ms (goal 50 ms:"
        f" {verdict(summary['plan_time_median_s'] <= 0.05)}), max {summary['plan_time_max_s'] * 1e3:.1f} ms"
        f" (goal 500 ms: {verdict(summary['plan_time_max_s'] <= 0.5)})"
    )
    return lines


def write_markdown(
    path: Path,
    cells: list[dict[str, Any]],
    summaries: dict[str, dict[str, Any]],
    plan_times: dict[str, Any],
    machine: str,
    repeat: int,
) -> None:
    lines = [
        f"# Planners benchmark ({machine}, {datetime.date.today().isoformat()})",
        "",
        "Generated by `python benchmarks/planners.py --out benchmarks/results`. Times from the",
        "simulator under the alpha-beta cost model; U = T*/T; U/U_mix = T_mix/T; reductions are",
        f"`1 - T_hipipe / T_baseline`; plan time is the best of {repeat} `hipipe` calls, chunk-number",
        f"search included (1-minute load average when the run ended: {os.getloadavg()[0]:.1f}).",
        "",
        "## Goals",
        "",
    ]
    for kind, summary in summaries.items():
        lines += [f"{kind}:", "", *goals_text(summary), ""]
    if plan_times:
        lines += ["Plan time of ReduceScatter and AllGather:", "", *plan_time_text(plan_times), ""]
    by_preset: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cell in cells:
        by_preset.setdefault((cell["collective"], cell["preset"]), []).append(cell)
    names = list(PLANNERS)
    for (kind, preset), group in by_preset.items():
        topology = PRESETS[preset]()
        lines += [
            f"## {kind}: {preset} ({topology.num_npus} NPUs)",
            "",
            "```",
            topology.describe(),
            "```",
            "",
        ]
        lines.append(
            "| message | T* ms | T_mix ms | hipipe ms | U | U/U_mix | best baseline | vs best | vs themis | vs themis-ideal | K | plan ms |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for cell in group:
            hipipe = cell["planners"]["hipipe"]
            best = cell["best_baseline"]
            lines.append(
                f"| {_size(cell['message_bytes'])} | {_ms(cell['lower_bound_s'])} | {_ms(cell['order_mix_bound_s'])}"
                f" | {_ms(hipipe['time_s'])} | {hipipe['utilization']:.3f} | {cell['utilization_of_mix_bound']:.4f}"
                f" | {best} {_ms(cell['planners'][best]['time_s'])} | {cell['reduction_vs_best']:+.1%}"
                f" | {cell['reduction_vs_themis']:+.1%} | {cell['reduction_vs_themis_ideal']:+.1%}"
                f" | {hipipe['num_chunks']} | {hipipe['plan_s'] * 1e3:.1f} |"
            )
        lines += ["", "Utilization per planner:", ""]
        lines.append("| message | " + " | ".join(names) + " |")
        lines.append("|---|" + "---|" * len(names))
        for cell in group:
            lines.append(
                f"| {_size(cell['message_bytes'])} | "
                + " | ".join(f"{cell['planners'][n]['utilization']:.3f}" for n in names)
                + " |"
            )
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, cells: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(c["preset"] for c in cells))
    kinds = list(dict.fromkeys(c["collective"] for c in cells))
    columns = len(presets)
    rows = len(kinds)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.4 * rows), squeeze=False)
    for index, (kind, preset) in enumerate((k, p) for k in kinds for p in presets):
        axis = axes[index // columns][index % columns]
        group = [c for c in cells if c["preset"] == preset and c["collective"] == kind]
        sizes = [c["message_bytes"] / MIB for c in group]
        for name in PLANNERS:
            style = "-" if name == "hipipe" else ("--" if name.startswith("hipipe") else ":")
            axis.plot(
                sizes,
                [c["planners"][name]["utilization"] for c in group],
                style,
                marker="o",
                markersize=3,
                linewidth=2.2 if name == "hipipe" else 1.2,
                label=name,
            )
        axis.plot(
            sizes,
            [c["lower_bound_s"] / c["order_mix_bound_s"] for c in group],
            color="black",
            linewidth=0.8,
            label="order-mix bound",
        )
        axis.set_xscale("log", base=2)
        axis.set_ylim(0, 1.02)
        axis.set_title(f"{preset} · {kind}")
        axis.set_xlabel("message (MiB)")
        axis.set_ylabel("utilization T*/T")
        axis.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 configurations x 3 messages")
    parser.add_argument("--out", type=Path, help="write the markdown report and the PNG plot here")
    parser.add_argument("--repeat", type=int, default=3, help="plan time = best of this many calls")
    parser.add_argument(
        "--collectives",
        default=",".join(c.value for c in Collective),
        help="comma-separated collectives (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    presets = QUICK_PRESETS if args.quick else tuple(PRESETS)
    messages = QUICK_MESSAGES if args.quick else MESSAGES
    kinds = [Collective.parse(name) for name in args.collectives.split(",") if name.strip()]
    console = Console(width=200)
    cells: list[dict[str, Any]] = []
    plan(PRESETS["tpu-2d"](), MIB, "hipipe")  # warm-up: imports and first-call costs are not plan time
    # Kinds interleaved per (network, size), so the load of the shared machine weighs on the
    # plan times of the three alike (their ratio is a goal).
    for preset in presets:
        for message in messages:
            cells.extend(run_cell(preset, message, args.repeat, kind) for kind in kinds)
        for kind in kinds:
            card(
                console, preset, [c for c in cells if c["preset"] == preset and c["collective"] == kind.value]
            )
    cells.sort(key=lambda c: [k.value for k in kinds].index(c["collective"]))  # stable: by kind
    summaries = {kind.value: summarize([c for c in cells if c["collective"] == kind.value]) for kind in kinds}
    plan_times = plan_time_comparison(cells)
    for kind, summary in summaries.items():
        console.print(f"Goals, {kind}:")
        for line in goals_text(summary):
            console.print(line, highlight=False)
    for line in plan_time_text(plan_times):
        console.print(line, highlight=False)
    summary = {"by_collective": summaries, "plan_time_vs_all_reduce": plan_times}
    machine = f"{os.cpu_count()}cpu"
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"planners-{machine}-{datetime.date.today().isoformat()}"
        write_markdown(args.out / f"{stem}.md", cells, summaries, plan_times, machine, args.repeat)
        write_plot(args.out / f"{stem}.png", cells)
        console.print(f"wrote {args.out / stem}.md and .png")
    sys.stdout.flush()
    print(json.dumps({"benchmark": "planners", "machine": machine, "summary": summary, "cells": cells}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
