"""``hipipe bench``: run every planner and torch's own collective on an emulated testbed.

Brings a testbed up, calibrates it, runs the plans (and with ``--tuned CACHE`` the
schedule ``hipipe tune`` kept, as a ``hipipe-tuned`` row; with ``--tune`` it tunes each
size on this testbed first and measures the kept schedule as that row), tears it down
whatever happens, then prints one table per message size with the fidelity lines and
goals under it, and writes ``<output>.json`` and ``<output>.png`` (the measured Gantt of
one hipipe run beside its plan). ``--json PATH`` writes the JSON there instead (``-``:
stdout, the tables then go to stderr so stdout is the document alone).
"""

import argparse
import json
import signal
import sys
from datetime import datetime
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hipipe.cli import bench_training
from hipipe.cli.common import (
    add_collective_argument,
    add_jobs_argument,
    add_repeat_arguments,
    check_output_path,
    jobs_from_args,
    max_repeats_from_args,
    stderr_console,
    stdout_console,
)
from hipipe.files import atomic_write_text
from hipipe.planners import PLANNERS
from hipipe.repeats import DEFAULT_EXTRA_JOBS
from hipipe.report.bench import (
    calibration_lines,
    cell_lines,
    describe_rates,
    result_to_dict,
    summary_tables,
)
from hipipe.schedule import Collective, Schedule
from hipipe.testbed.bench import run_bench
from hipipe.testbed.layout import TestbedError, nominal_topology, parse_rates_bits_per_s, parse_shape
from hipipe.testbed.results import DEFAULT_PLANNERS, BenchConfig
from hipipe.testbed.shaping import require_host
from hipipe.tuning.cache import TuningError, load_tuned
from hipipe.tuning.candidates import DEFAULT_BEST_FEW
from hipipe.units import format_size, parse_sizes_bytes


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "bench", help="measure planners and torch's collective on an emulated testbed (root, Linux, torch)"
    )
    add_collective_argument(parser)
    parser.add_argument("--testbed", required=True, metavar="SHAPE", help="ranks per dimension, e.g. 2x4")
    parser.add_argument("--rates", required=True, help="rate per dimension, e.g. 50,200Mbit")
    parser.add_argument(
        "--size", default="16MiB", help="comma-separated message sizes (default: %(default)s)"
    )
    parser.add_argument(
        "--planners",
        default=",".join(DEFAULT_PLANNERS),
        help="comma-separated planners (default: %(default)s)",
    )
    parser.add_argument(
        "--no-torch", action="store_true", help="skip the torch.distributed.all_reduce reference"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per row (default: %(default)s)")
    add_repeat_arguments(parser, what="row")
    add_jobs_argument(parser, what="each row (and the calibration's overhead run)")
    parser.add_argument(
        "--extra-jobs",
        type=int,
        default=DEFAULT_EXTRA_JOBS,
        help="testbed: more jobs a row (and the overhead run among the rows) may take while its median"
        " is unsettled over all its runs; 0: exactly --jobs (default: %(default)s)",
    )
    parser.add_argument(
        "--no-calibrate", action="store_true", help="predict with the nominal rates instead of calibrating"
    )
    parser.add_argument(
        "--gantt", default="hipipe", help="planner whose run the PNG draws (default: %(default)s)"
    )
    parser.add_argument(
        "--tuned",
        metavar="CACHE",
        default=None,
        help="add a hipipe-tuned row: the schedule `hipipe tune` kept for this testbed and size",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="tune each size here first (hipipe tune's candidates, this run's baselines, same calibration)"
        " and measure the kept schedule again as the hipipe-tuned row",
    )
    parser.add_argument(
        "--best-few",
        type=int,
        default=DEFAULT_BEST_FEW,
        help="with --tune: hipipe plans among the candidates (default: %(default)s)",
    )
    parser.add_argument("--rate-check-s", type=float, default=1.0, help="rate check per dimension, 0 to skip")
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help="path prefix of the JSON and PNG files (default without --json: hipipe-bench-<shape>-<time>)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the JSON document here ('-': stdout, tables on stderr); no PNG unless -o is given",
    )
    bench_training.add_arguments(parser)
    parser.set_defaults(func=run)


def _tuned(
    cache: str,
    sizes: tuple[int, ...],
    rates: tuple[float, ...],
    messages: tuple[int, ...],
    collective: Collective,
) -> tuple[Schedule, ...]:
    """The cached schedule for each size, keyed by the nominal testbed topology; all must be there."""
    topology = nominal_topology(sizes, rates)
    if not Path(cache).exists():
        raise TuningError(f"tuning cache {cache!r} not found: run hipipe tune first")
    out = []
    for message_bytes in messages:
        schedule = load_tuned(cache, topology, collective, message_bytes, "float32")
        if schedule is None:
            raise TuningError(
                f"{cache!r} has no float32 {collective.value} of {format_size(message_bytes)} for {topology.name}"
                f" at these rates: hipipe tune --testbed {'x'.join(map(str, sizes))} --size {message_bytes}"
                f" --collective {collective.value}"
            )
        out.append(schedule)
    return tuple(out)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    if args.workload is not None:
        if args.json is not None or args.tune:
            raise TestbedError("--json and --tune are for the collective bench, not --workload (use -o)")
        if Collective.parse(args.collective) is not Collective.ALL_REDUCE:
            raise TestbedError(
                "--collective is for the collective bench: --workload runs its own (DDP, FSDP2)"
            )
        signal.signal(signal.SIGTERM, _exit_on_sigterm)  # a plain `kill` still tears the testbed down
        return bench_training.run_training(args)
    collective = Collective.parse(args.collective)
    sizes = parse_shape(args.testbed)
    rates = parse_rates_bits_per_s(args.rates, len(sizes))
    messages = tuple(parse_sizes_bytes(args.size))
    planners = tuple(p.strip() for p in args.planners.split(",") if p.strip())
    unknown = [p for p in planners if p not in PLANNERS]
    if unknown:
        raise TestbedError(f"unknown planner {unknown[0]!r} (available: {', '.join(PLANNERS)})")
    output = args.output
    if output is None and args.json is None:
        output = f"hipipe-bench-{args.testbed}-{datetime.now():%Y%m%d-%H%M%S}"
    if output is not None:
        check_output_path(output + ".json")
    json_path = check_output_path(args.json) if args.json not in (None, "-") else None
    if args.tune and args.tuned:
        raise TestbedError("give --tune (tune here) or --tuned CACHE (a tuning done before), not both")
    if args.best_few != DEFAULT_BEST_FEW and not args.tune:
        raise TestbedError("--best-few chooses the tuning candidates: it needs --tune")
    tuned = _tuned(args.tuned, sizes, rates, messages, collective) if args.tuned else ()
    config = BenchConfig(
        sizes=sizes,
        rates_bits_per_s=rates,
        messages_bytes=messages,
        collective=collective,
        planners=planners,
        include_torch=not args.no_torch,
        warmup=args.warmup,
        repeats=args.repeats,
        max_repeats=max_repeats_from_args(args),
        precision=args.precision,
        jobs=jobs_from_args(args),
        extra_jobs=args.extra_jobs,
        calibrate=not args.no_calibrate,
        rate_check_s=args.rate_check_s,
        gantt_planner=args.gantt,
        tuned=tuned,
        tune=args.tune,
        tune_best_few=args.best_few,
    )
    require_host()
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TestbedError("hipipe bench needs torch: pip install torch==2.13.0 (CPU wheel)") from None
    # A plain `kill` must still tear the testbed down: turn SIGTERM into an exception.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console(), transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("bringing the testbed up", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        result = run_bench(config, progress=progress)
    # With --json - stdout carries the document alone: everything for people goes to stderr.
    console = stderr_console() if args.json == "-" else stdout_console()
    if result.rates:
        console.print(f"rate check: {describe_rates(result)}")
    for line in calibration_lines(result):
        console.print(line)
    for table, message_bytes in zip(summary_tables(result), config.messages_bytes, strict=True):
        console.print(table)
        for line in cell_lines(result, message_bytes):
            console.print(line, markup=False)
    document = json.dumps(result_to_dict(result), indent=1) + "\n"
    written = []
    if output is not None:
        atomic_write_text(output + ".json", document)
        written.append(output + ".json")
    if json_path is not None:
        atomic_write_text(json_path, document)
        written.append(str(json_path))
    if output is not None and result.gantt_panels:
        from hipipe.report.gantt import write_gantt

        write_gantt(output + ".png", list(result.gantt_panels))
        written.append(output + ".png")
    if args.json == "-":
        sys.stdout.write(document)
        sys.stdout.flush()
    console.print(
        f"[dim]wrote {', '.join(written) or 'the JSON to stdout'}; testbed {result.prefix} removed[/dim]"
    )
    return 0
