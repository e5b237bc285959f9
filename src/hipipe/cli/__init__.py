"""The ``hipipe`` command: a thin layer over the public Python API.

Each subcommand lives in its own module ``hipipe.cli.<name>`` that exposes
``add_parser(subparsers)``; the parser it adds sets ``func`` to a handler
``(args) -> int``. User errors (:class:`~hipipe.errors.HipipeError`, unreadable
files) print one line on stderr and exit with code 2, never a traceback.
"""

import argparse
import importlib
import sys
from collections.abc import Sequence

from hipipe.errors import HipipeError

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "topologies",
    "plan",
    "compare",
    "simulate",
    "check",
    "run",
    "testbed",
    "bench",
    "calibrate",
    "tune",
)
"""Subcommands in the order ``hipipe --help`` lists them."""

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hipipe",
        description="Plan, simulate, check and run pipelined hierarchical collectives.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"hipipe.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (tests call it in-process)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and the error
        return int(exc.code or 0)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    try:
        return int(args.func(args))
    except HipipeError as exc:
        print(f"hipipe: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        name = f" {exc.filename!r}" if exc.filename else ""
        print(f"hipipe: error: {exc.strerror or exc}{name}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("hipipe: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())
