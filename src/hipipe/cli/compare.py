"""``hipipe compare``: every planner on one network, a table per message size."""

import argparse
import json
import sys

from rich.progress import Progress

from hipipe.cli.common import (
    add_collective_argument,
    add_topology_argument,
    collective_from_args,
    stderr_console,
    stdout_console,
    topology_from_args,
)
from hipipe.compare import DEFAULT_PLANNERS, DEFAULT_SIZES_BYTES, compare, comparison_to_dict
from hipipe.report.table import print_comparison
from hipipe.units import format_size, parse_sizes_bytes


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("compare", help="compare planners on one network")
    add_topology_argument(parser, optional=True)
    parser.add_argument(
        "--sizes",
        default=",".join(format_size(s).replace(" ", "") for s in DEFAULT_SIZES_BYTES),
        help="comma-separated message sizes (default: %(default)s)",
    )
    parser.add_argument(
        "--planners",
        default=",".join(DEFAULT_PLANNERS),
        help="comma-separated planners (default: %(default)s)",
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="number of chunks of every planner (hipipe and exact: at most this many)",
    )
    add_collective_argument(parser)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout and nothing else"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    sizes = parse_sizes_bytes(args.sizes)
    collective = collective_from_args(args)
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    total = len(sizes) * len(planners)
    if sys.stderr.isatty() and not args.json:
        with Progress(console=stderr_console(), transient=True) as progress:
            task = progress.add_task("planning", total=total)
            comparison = compare(
                topology,
                sizes,
                planners,
                num_chunks=args.chunks,
                collective=collective,
                on_progress=lambda name, size: progress.advance(task),
            )
    else:
        comparison = compare(topology, sizes, planners, num_chunks=args.chunks, collective=collective)
    if args.json:
        print(json.dumps(comparison_to_dict(comparison), indent=1))
    else:
        print_comparison(comparison, stdout_console())
    return 0
