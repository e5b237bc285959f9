"""``hipipe tune``: measure hipipe's best few schedules and every baseline, keep the fastest.

On the emulated testbed (``--testbed 2x4 --rates 50,200Mbit``, root) or under torchrun
on a real cluster (``torchrun ... hipipe tune TOPOLOGY --size 64MiB``, like ``hipipe
run``). Writes the kept schedule (``-o``) and adds it to the tuning cache (``--cache``),
keyed by (topology, collective, size, dtype); ``hipipe bench --tuned CACHE`` and
:func:`hipipe.tuning.load_tuned` read it back.
"""

import argparse
import importlib.util
import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hipipe.cli.common import (
    TOPOLOGY_HELP,
    add_jobs_argument,
    add_repeat_arguments,
    check_output_path,
    jobs_from_args,
    max_repeats_from_args,
    stderr_console,
    stdout_console,
)
from hipipe.errors import HipipeError
from hipipe.files import atomic_write_text
from hipipe.repeats import RepeatRule, repeat_problem
from hipipe.report.tune import tuning_table
from hipipe.schedule import Collective
from hipipe.tuning.cache import TunedEntry, read_cache, write_entry
from hipipe.tuning.candidates import DEFAULT_BEST_FEW
from hipipe.units import format_time, parse_size_bytes

DEFAULT_CACHE = "hipipe-tuned.json"


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "tune",
        help="measure candidate schedules on the network and keep the fastest (testbed or torchrun)",
        description="On an emulated testbed (--testbed, root) or under torchrun with a TOPOLOGY.",
    )
    parser.add_argument("topology", nargs="?", help=f"under torchrun: {TOPOLOGY_HELP}")
    parser.add_argument("--size", required=True, help="message size, e.g. 16MiB")
    parser.add_argument("--testbed", metavar="SHAPE", help="emulated testbed shape, e.g. 2x4 (needs --rates)")
    parser.add_argument("--rates", help="testbed rate per dimension, e.g. 50,200Mbit")
    parser.add_argument(
        "--collective",
        default=Collective.ALL_REDUCE.value,
        help="all_reduce (default), reduce_scatter or all_gather (what FSDP2 calls)",
    )
    parser.add_argument("--dtype", default="float32", help="element type of the message (default: float32)")
    parser.add_argument(
        "--cache", default=DEFAULT_CACHE, help="tuning cache to add the result to (default: %(default)s)"
    )
    parser.add_argument("-o", "--output", default=None, help="also write the kept schedule JSON here")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per candidate (default: 1)")
    add_repeat_arguments(parser, what="candidate")
    add_jobs_argument(parser, what="each candidate (and the calibration's overhead run)")
    parser.add_argument(
        "--best-few",
        type=int,
        default=DEFAULT_BEST_FEW,
        help="hipipe plans to measure: its own and the next-best K of its search (default: %(default)s)",
    )
    parser.add_argument(
        "--no-calibrate", action="store_true", help="testbed: plan on the nominal rates, not calibrated ones"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="torchrun: seconds before a stuck run fails"
    )
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="torchrun: default gloo")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cache = check_output_path(args.cache)
    if cache is None:
        raise HipipeError("--cache needs a file")
    output = check_output_path(args.output)
    read_cache(cache)  # a corrupt cache fails now, not after minutes of measuring
    collective = Collective.parse(args.collective)
    message_bytes = parse_size_bytes(args.size)
    if args.warmup < 0 or args.best_few < 1:
        raise HipipeError("need --warmup >= 0 and --best-few >= 1")
    max_repeats = max_repeats_from_args(args)
    problem = repeat_problem(args.repeats, max_repeats, args.precision)
    if problem is not None:
        raise HipipeError(problem)
    rule = RepeatRule(repeats=args.repeats, max_repeats=max_repeats, precision=args.precision)
    if importlib.util.find_spec("torch") is None:
        raise HipipeError("hipipe tune needs torch: install hipipe[torch]")
    if args.testbed:
        entry = _on_testbed(args, collective, message_bytes, rule)
    else:
        rank, entry = _under_torchrun(args, collective, message_bytes, rule)
        if rank != 0:
            return 0
    write_entry(cache, entry)
    if output is not None:
        atomic_write_text(output, entry.schedule.to_json())
    _report(entry, [str(cache)] + ([str(output)] if output is not None else []))
    return 0


def _on_testbed(
    args: argparse.Namespace, collective: Collective, message_bytes: int, rule: RepeatRule
) -> TunedEntry:
    import signal

    from hipipe.testbed.layout import TestbedError, parse_rates_bits_per_s, parse_shape
    from hipipe.testbed.shaping import require_host
    from hipipe.tuning.testbed import TuneConfig, tune_on_testbed

    if args.topology:
        raise TestbedError("give --testbed SHAPE --rates R, or a topology under torchrun, not both")
    if not args.rates:
        raise TestbedError("--testbed needs --rates, e.g. --rates 50,200Mbit")
    sizes = parse_shape(args.testbed)
    config = TuneConfig(
        sizes=sizes,
        rates_bits_per_s=parse_rates_bits_per_s(args.rates, len(sizes)),
        message_bytes=message_bytes,
        collective=collective,
        dtype=args.dtype,
        warmup=args.warmup,
        repeats=rule.repeats,
        max_repeats=rule.max_repeats,
        precision=rule.precision,
        jobs=jobs_from_args(args),
        best_few=args.best_few,
        calibrate=not args.no_calibrate,
    )
    require_host()
    # A plain `kill` must still tear the testbed down: turn SIGTERM into an exception.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console(), transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("bringing the testbed up", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        result = tune_on_testbed(config, progress=progress)
    return result.entry


def _under_torchrun(
    args: argparse.Namespace, collective: Collective, message_bytes: int, rule: RepeatRule
) -> tuple[int, TunedEntry]:
    from hipipe.topology_io import load_topology
    from hipipe.torch.bench import launched_by_torchrun
    from hipipe.torch.tune import tune_from_env

    if args.jobs is not None:
        raise HipipeError("--jobs is for the testbed: under torchrun the job is the one torchrun started")
    if not launched_by_torchrun():
        raise HipipeError(
            "start hipipe tune under torchrun with a TOPOLOGY, or pass --testbed SHAPE --rates R"
        )
    if not args.topology:
        raise HipipeError("under torchrun, give the TOPOLOGY the ranks form")
    return tune_from_env(
        load_topology(args.topology),
        message_bytes,
        collective=collective,
        dtype=args.dtype,
        warmup=args.warmup,
        repeats=rule,
        best_few=args.best_few,
        timeout_s=args.timeout,
        backend=args.backend,
    )


def _report(entry: TunedEntry, written: list[str]) -> None:
    console = stdout_console()
    console.print(tuning_table(entry))
    kept = next(m for m in entry.measurements if m.name == entry.chosen)
    line = f"kept {entry.chosen}: {format_time(kept.median_s)} median"
    own = next((m for m in entry.measurements if m.name == "hipipe"), None)
    if own is not None and own.name != kept.name:
        line += f", {100 * (1 - kept.median_s / own.median_s):.1f}% faster than hipipe's own plan"
    console.print(line)
    console.print(f"[dim]key {entry.key.label()}; wrote {', '.join(written)}[/dim]")
