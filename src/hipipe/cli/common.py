"""Arguments and output helpers shared by the subcommands."""

import argparse
import sys
from pathlib import Path

from rich.console import Console

from hipipe.errors import HipipeError
from hipipe.presets import DEFAULT_PRESET
from hipipe.repeats import DEFAULT_JOBS, DEFAULT_MAX_REPEATS, DEFAULT_PRECISION
from hipipe.schedule import Collective
from hipipe.topology import Topology
from hipipe.topology_io import load_topology

TOPOLOGY_HELP = (
    "preset name (see `hipipe topologies`), one-line spec such as "
    "'ring:4:100GB/s:1us,switch:8:50GB/s:2us', or a hipipe / ASTRA-sim YAML file"
)


def add_topology_argument(parser: argparse.ArgumentParser, *, optional: bool) -> None:
    if optional:
        parser.add_argument(
            "topology", nargs="?", default=DEFAULT_PRESET, help=f"{TOPOLOGY_HELP} (default: {DEFAULT_PRESET})"
        )
    else:
        parser.add_argument("topology", help=TOPOLOGY_HELP)


def add_collective_argument(parser: argparse.ArgumentParser) -> None:
    """``--collective``; checked by :meth:`Collective.parse` (one-line error, exit 2), not
    argparse choices (whose error is a usage block)."""
    names = "|".join(c.value for c in Collective)
    parser.add_argument(
        "--collective",
        default=Collective.ALL_REDUCE.value,
        metavar=names,
        help="what to plan; message sizes are the full per-rank buffer (default: %(default)s)",
    )


def add_repeat_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--repeats``, ``--max-repeats``, ``--precision``: the timed runs of each ``what`` (a
    bench row, a tuning candidate) repeat until its median is settled (:mod:`hipipe.repeats`)."""
    parser.add_argument(
        "--repeats", type=int, default=3, help=f"timed runs per {what}, at least (default: %(default)s)"
    )
    parser.add_argument(
        "--max-repeats",
        type=int,
        default=None,
        help=f"timed runs per {what}, at most: it repeats until its median is settled"
        f" (default: {DEFAULT_MAX_REPEATS}; equal to --repeats: a fixed count)",
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=DEFAULT_PRECISION,
        help=f"stop a {what} once its median's relative standard error is within this (default: %(default)s)",
    )


def add_jobs_argument(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--jobs``: worker jobs a testbed measurement's runs are spread over."""
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"testbed: worker jobs the runs of {what} are spread over; a many-op schedule's median"
        f" moves 10-30%% from job to job on a shared host (default: {DEFAULT_JOBS})",
    )


def jobs_from_args(args: argparse.Namespace) -> int:
    """``--jobs``, or the default (the flag's own default is None, so a caller can tell it was given)."""
    return int(args.jobs) if args.jobs is not None else DEFAULT_JOBS


def max_repeats_from_args(args: argparse.Namespace) -> int:
    """``--max-repeats``, or the default cap (never below ``--repeats``)."""
    return int(args.max_repeats) if args.max_repeats is not None else max(args.repeats, DEFAULT_MAX_REPEATS)


def collective_from_args(args: argparse.Namespace) -> Collective:
    return Collective.parse(args.collective)


def topology_from_args(args: argparse.Namespace) -> Topology:
    return load_topology(args.topology)


MIN_PIPE_WIDTH = 120
"""Tables written to a pipe or file get this width instead of rich's 80 columns."""


def stdout_console() -> Console:
    if sys.stdout.isatty():
        return Console(file=sys.stdout, highlight=False)
    return Console(file=sys.stdout, highlight=False, width=MIN_PIPE_WIDTH)


def stderr_console() -> Console:
    """Progress bars, and the tables when stdout carries a document (``bench --json -``)."""
    if sys.stderr.isatty():
        return Console(file=sys.stderr, highlight=False)
    return Console(file=sys.stderr, highlight=False, width=MIN_PIPE_WIDTH)


def check_output_path(path: str | None, *, suffix: str | None = None) -> Path | None:
    """Refuse an output path whose folder does not exist before doing any work."""
    if path is None or path == "-":
        return None
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise HipipeError(f"cannot write {path!r}: folder {str(folder)!r} does not exist")
    if suffix is not None and target.suffix.lower() != suffix:
        raise HipipeError(f"{path!r}: expected a {suffix} file")
    return target
