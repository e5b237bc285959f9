"""``hipipe simulate``: replay a schedule JSON under the cost model."""

import argparse
from pathlib import Path

from hipipe.cli.common import check_output_path, stdout_console
from hipipe.files import atomic_write_text
from hipipe.report.gantt import write_gantt
from hipipe.report.table import schedule_summary
from hipipe.schedule import Schedule
from hipipe.simulator import Policy, simulate
from hipipe.units import format_time


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("simulate", help="replay a schedule JSON in the discrete-event simulator")
    parser.add_argument("schedule", help="schedule JSON written by `hipipe plan --json`")
    parser.add_argument(
        "--policy",
        choices=[p.value for p in Policy],
        default=Policy.FIXED.value,
        help="fixed: the schedule's own per-dimension sequences; fifo / scf: re-queue its chunks",
    )
    parser.add_argument("--json", metavar="FILE", help="write the simulated schedule as JSON")
    parser.add_argument("--gantt", metavar="FILE.png", help="write a Gantt chart of the simulated run")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    json_path = check_output_path(args.json)
    gantt_path = check_output_path(args.gantt, suffix=".png")
    original = Schedule.from_json(Path(args.schedule).read_text())
    simulated = simulate(original, policy=args.policy)
    if json_path is not None:
        atomic_write_text(json_path, simulated.to_json())
    if gantt_path is not None:
        write_gantt(gantt_path, [("recorded", original), (f"simulated ({args.policy})", simulated)])
    console = stdout_console()
    console.print(schedule_summary(simulated))
    delta = simulated.makespan_s - original.makespan_s
    console.print(
        f"recorded makespan {format_time(original.makespan_s)}, simulated {format_time(simulated.makespan_s)}"
        f" ({delta / original.makespan_s:+.2e} relative)"
    )
    return 0
