"""``hipipe plan``: one planner, one message; schedule JSON, Gantt chart, explanation."""

import argparse

from hipipe.cli.common import (
    add_collective_argument,
    add_topology_argument,
    check_output_path,
    collective_from_args,
    stdout_console,
    topology_from_args,
)
from hipipe.errors import HipipeError
from hipipe.files import atomic_write_text
from hipipe.planners import PLANNERS, REFERENCE_PLANNERS, plan
from hipipe.planners.exact import DEFAULT_TIME_LIMIT_S, METHODS, plan_exact
from hipipe.report.explain import explain
from hipipe.report.gantt import write_gantt
from hipipe.report.table import schedule_summary
from hipipe.units import parse_size_bytes


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("plan", help="plan one collective and write its schedule")
    add_topology_argument(parser, optional=False)
    parser.add_argument("--size", required=True, help="message size, e.g. 64MiB or 1GB")
    add_collective_argument(parser)
    parser.add_argument(
        "--planner",
        default="hipipe",
        help=f"one of: {', '.join([*PLANNERS, *REFERENCE_PLANNERS])} (default: hipipe)",
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="number of chunks: at most this many for hipipe and exact, exactly this many for the chunked baselines",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"exact planner only: stop the MIP after this long and keep the best schedule found"
        f" with its gap (default: {DEFAULT_TIME_LIMIT_S:g}); the seed planners run before it"
        " (info: seed_time_s)",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="exact planner only: one MIP (whole), one per multiset of the chunks' first dims"
        " (first-dims: proves K = 5 on 4 dims where the whole MIP stalls), or auto (default:"
        " first-dims from 5 chunks on 3+ dims)",
    )
    parser.add_argument(
        "--mip-jobs",
        type=int,
        default=None,
        metavar="N",
        help="exact planner only: first-dims MIPs solved at once, one worker process each (default: 1)",
    )
    parser.add_argument("--json", metavar="FILE", help="write the schedule as JSON ('-' for stdout)")
    parser.add_argument("--gantt", metavar="FILE.png", help="write a Gantt chart of the schedule")
    parser.add_argument("--explain", action="store_true", help="print what the planner decided and why")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    size_bytes = parse_size_bytes(args.size)
    collective = collective_from_args(args)
    json_path = check_output_path(args.json, suffix=None)
    gantt_path = check_output_path(args.gantt, suffix=".png")
    if args.planner == "exact":
        if args.chunks is None:
            raise HipipeError(
                "--planner exact needs --chunks K (the MIP proves the best schedule for a given K)"
            )
        time_limit_s = DEFAULT_TIME_LIMIT_S if args.time_limit is None else args.time_limit
        schedule = plan_exact(
            topology,
            size_bytes,
            num_chunks=args.chunks,
            collective=collective,
            time_limit_s=time_limit_s,
            method=args.method or "auto",
            jobs=1 if args.mip_jobs is None else args.mip_jobs,
        )
    elif args.time_limit is not None:
        raise HipipeError("--time-limit applies to --planner exact only")
    elif args.method is not None:
        raise HipipeError("--method applies to --planner exact only")
    elif args.mip_jobs is not None:
        raise HipipeError("--mip-jobs applies to --planner exact only")
    else:
        schedule = plan(topology, size_bytes, args.planner, num_chunks=args.chunks, collective=collective)
    if args.json == "-":
        print(schedule.to_json(), end="")
        return 0
    if json_path is not None:
        atomic_write_text(json_path, schedule.to_json())
    if gantt_path is not None:
        write_gantt(gantt_path, [("plan", schedule)])
    console = stdout_console()
    console.print(schedule_summary(schedule))
    if args.explain:
        console.print(explain(schedule))
    for label, path in (("schedule", json_path), ("gantt chart", gantt_path)):
        if path is not None:
            console.print(f"wrote {label} to {path}")
    return 0
