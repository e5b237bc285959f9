"""``hipipe run``: run a collective on a real buffer with a schedule on torch.distributed.

Launched by ``torchrun`` (one node or many), or with ``--nproc N`` to start N local
Gloo processes itself. Plans (or loads a schedule JSON) an AllReduce, ReduceScatter or
AllGather (``--collective``), checks the result against torch's own collective
(``all_reduce``, ``reduce_scatter_tensor``, ``all_gather_into_tensor``) on the same
data and prints time, algbw and busbw for both. A thin layer over :mod:`hipipe.torch.bench`; torch is imported only here.
"""

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from hipipe.cli import EXIT_USER_ERROR
from hipipe.cli.common import TOPOLOGY_HELP, check_output_path, stdout_console
from hipipe.errors import HipipeError
from hipipe.files import atomic_write_text
from hipipe.planners import PLANNERS, plan
from hipipe.schedule import Collective, Schedule
from hipipe.topology_io import load_topology
from hipipe.units import format_size, parse_size_bytes

DEFAULT_PLANNER = "hipipe" if "hipipe" in PLANNERS else "pipelined"
_TITLES = {
    Collective.ALL_REDUCE: "AllReduce",
    Collective.REDUCE_SCATTER: "ReduceScatter",
    Collective.ALL_GATHER: "AllGather",
}


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a schedule on torch.distributed and compare with torch's own collective",
        description="Run under torchrun, or pass --nproc N to start N local Gloo processes.",
    )
    parser.add_argument("topology", nargs="?", help=f"{TOPOLOGY_HELP} (not needed with --schedule)")
    parser.add_argument("--size", help="message size, e.g. 4MiB (not needed with --schedule)")
    parser.add_argument("--schedule", metavar="FILE", help="run this schedule JSON instead of planning")
    parser.add_argument(
        "--planner",
        default=DEFAULT_PLANNER,
        help=f"one of: {', '.join(PLANNERS)} (default: {DEFAULT_PLANNER})",
    )
    parser.add_argument("--chunks", type=int, default=None, help="force the number of chunks")
    parser.add_argument(
        "--tuned",
        metavar="CACHE",
        help="run the schedule `hipipe tune` kept in CACHE for this topology, collective, size and dtype",
    )
    parser.add_argument(
        "--collective",
        choices=[c.value for c in Collective],
        default=None,
        help="what to run (default: all_reduce, or the --schedule file's own collective)",
    )
    parser.add_argument("--nproc", type=int, default=None, help="start N local processes (else: torchrun)")
    parser.add_argument(
        "--dtype", default="float32", help="float32 (default), float64, float16, bfloat16, int64, int32"
    )
    parser.add_argument(
        "--op", default="sum", choices=["sum", "avg", "min", "max"], help="reduction (default: sum)"
    )
    parser.add_argument("--iters", type=int, default=5, help="timed iterations (default: 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default: 1)")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before a stuck run fails (default: 60)"
    )
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="default: gloo")
    parser.add_argument("--trace", metavar="FILE", help="write rank 0's measured op times as a schedule JSON")
    parser.add_argument("--gantt", metavar="FILE.png", help="draw the plan beside rank 0's measured run")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(func=run)


def _schedule(args: argparse.Namespace) -> Schedule:
    if args.schedule and args.tuned:
        raise HipipeError("give --schedule FILE or --tuned CACHE, not both")
    if args.schedule:
        schedule = Schedule.from_json(Path(args.schedule).read_text())
        if args.topology and load_topology(args.topology).sizes != schedule.topology.sizes:
            raise HipipeError(
                f"the schedule in {args.schedule} is for another topology than {args.topology!r}"
            )
        if args.collective and Collective.parse(args.collective) is not schedule.collective:
            raise HipipeError(
                f"the schedule in {args.schedule} plans {schedule.collective.value}, not"
                f" {args.collective}: drop --collective or plan a {args.collective} schedule"
            )
        if args.size and parse_size_bytes(args.size) != schedule.message_bytes:
            raise HipipeError(
                f"the schedule in {args.schedule} is for {schedule.message_bytes} bytes, not {args.size}"
            )
        return schedule
    if not args.topology or not args.size:
        raise HipipeError("give a topology and --size, or --schedule FILE")
    if args.tuned:
        from hipipe.tuning.cache import load_tuned

        collective = Collective.parse(args.collective or Collective.ALL_REDUCE)
        tuned = load_tuned(
            args.tuned, load_topology(args.topology), collective, parse_size_bytes(args.size), args.dtype
        )
        if tuned is None:
            raise HipipeError(
                f"{args.tuned} has no tuned {collective.value} of {args.size} ({args.dtype}) for this"
                " topology: run hipipe tune for it first, or drop --tuned"
            )
        return tuned
    return plan(
        load_topology(args.topology),
        parse_size_bytes(args.size),
        args.planner,
        num_chunks=args.chunks,
        collective=args.collective or Collective.ALL_REDUCE,
    )


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("torch") is None:
        raise HipipeError("hipipe run needs torch: install hipipe[torch]")
    from hipipe.torch import bench
    from hipipe.torch.executor import CollectiveError

    trace_path = check_output_path(args.trace)
    gantt_path = check_output_path(args.gantt, suffix=".png")
    if args.nproc is None and not bench.launched_by_torchrun():
        raise HipipeError("start hipipe run under torchrun, or pass --nproc N to start N local processes")
    schedule = _schedule(args)
    config = bench.RunConfig(
        schedule=schedule,
        dtype=args.dtype,
        op=args.op,
        iterations=args.iters,
        warmup=args.warmup,
        timeout_s=args.timeout,
        backend=args.backend,
        trace=trace_path is not None or gantt_path is not None,
    )
    if args.nproc is not None:
        rank, result = 0, bench.run_local(config, args.nproc)
    else:
        try:
            rank, result = bench.run_from_env(config)
        except CollectiveError as exc:
            # The process group is broken (a peer died or hung): a normal interpreter exit can
            # abort in Gloo's destructors, so report in one line and leave at once.
            print(f"hipipe: error: {exc}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_USER_ERROR)
    if rank != 0:
        return 0 if result.verified else 1
    if result.measured is not None:
        if trace_path is not None:
            atomic_write_text(trace_path, result.measured.to_json())
        if gantt_path is not None:
            from hipipe.report.gantt import write_gantt

            write_gantt(gantt_path, [("plan", schedule), ("measured (rank 0)", result.measured)])
    if args.json:
        print(json.dumps(_as_dict(result), allow_nan=False))
    else:
        _print_table(result, args.backend)
    if not result.verified:
        print(
            f"hipipe: error: result differs from {_torch_name(result)} (max abs error {result.max_abs_error:g})",
            file=sys.stderr,
        )
        return 1
    return 0


def _torch_name(result: Any) -> str:
    from hipipe.torch.bench import TORCH_NAMES

    return f"torch.distributed.{TORCH_NAMES[result.collective]}"


def _as_dict(result: Any) -> dict[str, Any]:
    return {
        "collective": result.collective.value,
        "world_size": result.world_size,
        "message_bytes": result.message_bytes,
        "dtype": result.dtype,
        "planner": result.planner,
        "num_chunks": result.num_chunks,
        "planned_s": result.planned_s,
        "verified": result.verified,
        "max_abs_error": result.max_abs_error,
        "timings": [
            {
                "name": t.name,
                "time_s": t.time_s,
                "min_time_s": t.min_time_s,
                "algbw_gbps": t.algbw_bytes_per_s / 1e9,
                "busbw_gbps": t.busbw_bytes_per_s / 1e9,
            }
            for t in result.timings
        ],
    }


def _print_table(result: Any, backend: str) -> None:
    from rich.table import Table

    table = Table(
        title=(
            f"{_TITLES[result.collective]} of {format_size(result.message_bytes)} {result.dtype}"
            f" on {result.world_size} ranks"
            f" ({backend}), planner {result.planner}, {result.num_chunks} chunks"
        )
    )
    for column in ("implementation", "time (ms)", "min (ms)", "algbw (GB/s)", "busbw (GB/s)"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for t in result.timings:
        table.add_row(
            t.name,
            f"{t.time_s * 1e3:.3f}",
            f"{t.min_time_s * 1e3:.3f}",
            f"{t.algbw_bytes_per_s / 1e9:.3f}",
            f"{t.busbw_bytes_per_s / 1e9:.3f}",
        )
    console = stdout_console()
    console.print(table)
    verdict = "matches" if result.verified else "DIFFERS from"
    console.print(
        f"planned makespan {result.planned_s * 1e3:.3f} ms under the topology's cost model"
        " (the network modelled, not necessarily this one)"
    )
    console.print(f"result {verdict} {_torch_name(result)} (max abs error {result.max_abs_error:g})")
    factor = "2(N-1)/N" if result.collective is Collective.ALL_REDUCE else "(N-1)/N"
    console.print(
        f"time: mean of the slowest rank per iteration; algbw = size / time; busbw = algbw * {factor}"
        " (size: the full per-rank buffer)"
    )
