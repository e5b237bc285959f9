"""``hipipe bench --workload ddp|fsdp``: the training benchmark (see :mod:`hipipe.testbed.training`)."""

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hipipe.cli.common import check_output_path, stderr_console, stdout_console
from hipipe.files import atomic_write_text
from hipipe.planners import PLANNERS
from hipipe.report.training import training_table, write_training_chart
from hipipe.testbed.layout import TestbedError, parse_rates_bits_per_s, parse_shape
from hipipe.testbed.results import DEFAULT_PLANNERS
from hipipe.testbed.shaping import require_host
from hipipe.testbed.training import TrainingBenchConfig, run_training_bench, training_result_to_dict
from hipipe.training.train import Workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        choices=[w.value for w in Workload],
        default=None,
        help="train a small language model with DDP or FSDP2, torch's collectives vs hipipe's",
    )
    parser.add_argument(
        "--model-mib", type=float, default=64.0, help="gradient MiB of the model (--workload; default: 64)"
    )
    parser.add_argument(
        "--steps", type=int, default=8, help="training steps per run (--workload; default: 8)"
    )


def run_training(args: argparse.Namespace) -> int:
    sizes = parse_shape(args.testbed)
    rates = parse_rates_bits_per_s(args.rates, len(sizes))
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    if args.planners == ",".join(DEFAULT_PLANNERS):
        planners = ["hipipe"]  # the comparison's default list; training runs hipipe's schedules
    if len(planners) != 1:
        raise TestbedError(
            f"--workload trains with one planner's schedules: give --planners NAME, not {args.planners}"
        )
    planner = planners[0]
    if planner not in PLANNERS:
        raise TestbedError(f"unknown planner {planner!r} (available: {', '.join(PLANNERS)})")
    if not args.model_mib > 0:
        raise TestbedError(f"--model-mib must be positive, got {args.model_mib:g}")
    output = args.output or f"hipipe-bench-{args.workload}-{args.testbed}-{datetime.now():%Y%m%d-%H%M%S}"
    check_output_path(output + ".json")
    check_output_path(output + ".png")
    config = TrainingBenchConfig(
        sizes=sizes,
        rates_bits_per_s=rates,
        workload=Workload(args.workload),
        model_bytes=int(args.model_mib * 2**20),
        steps=args.steps,
        planner=planner,
        calibrate=not args.no_calibrate,
    )
    require_host()
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TestbedError("hipipe bench needs torch: pip install torch==2.13.0 (CPU wheel)") from None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console(), transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("bringing the testbed up", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        result = run_training_bench(config, progress=progress)
    document = training_result_to_dict(result)
    console = stdout_console()
    console.print(training_table(document))
    atomic_write_text(output + ".json", json.dumps(document, indent=1) + "\n")
    write_training_chart(Path(output + ".png"), document)
    console.print(f"[dim]wrote {output}.json, {output}.png; testbed {result.prefix} removed[/dim]")
    return 0
