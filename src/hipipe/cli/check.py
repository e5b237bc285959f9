"""``hipipe check``: prove that a schedule JSON is the collective it says it is, or say why not."""

import argparse
import sys
from pathlib import Path

from hipipe.checker import SYMBOLIC_MAX_NPUS, check
from hipipe.schedule import Schedule

EXIT_INVALID_SCHEDULE = 2
"""Same code as any user error: the schedule the user gave us is wrong."""


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "check",
        help="prove that a schedule JSON is its collective (symbolic run up to 64 NPUs)",
    )
    parser.add_argument("schedule", help="schedule JSON written by `hipipe plan --json`")
    parser.add_argument(
        "--symbolic-max-npus",
        type=int,
        default=SYMBOLIC_MAX_NPUS,
        metavar="N",
        help=f"run the symbolic check up to N NPUs, structural checks above (default: {SYMBOLIC_MAX_NPUS})",
    )
    parser.add_argument(
        "--no-durations",
        action="store_true",
        help="do not compare op durations with the cost model (e.g. for measured schedules)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    schedule = Schedule.from_json(Path(args.schedule).read_text())
    report = check(schedule, symbolic_max_npus=args.symbolic_max_npus, check_durations=not args.no_durations)
    if report.ok:
        print(report.summary())
        return 0
    print(f"{schedule.planner} schedule on {report.topology_label}: {len(report.problems)} problem(s)")
    for problem in report.problems:
        print(f"  - {problem}")
    print(f"hipipe: error: {report.summary()}", file=sys.stderr)
    return EXIT_INVALID_SCHEDULE
