"""``hipipe testbed up|down|show|check``: the emulated network, by hand.

``up`` prints the new testbed's prefix, which ``down`` takes; ``down --all`` removes
every testbed this host has a state file for (e.g. after a crash). ``check`` measures
the shaped rates of a testbed that is up.
"""

import argparse

from rich.table import Table

from hipipe.cli.common import stdout_console
from hipipe.testbed import netns
from hipipe.testbed.layout import (
    Layout,
    TestbedError,
    check_prefix,
    format_rate,
    parse_rates_bits_per_s,
    parse_shape,
)
from hipipe.testbed.ratecheck import check_rates
from hipipe.testbed.shaping import detect_host


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "testbed", help="emulated network: one namespace per rank, tc rate limits per dimension (root, Linux)"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="create a testbed and print its prefix")
    up.add_argument("shape", help="ranks per dimension, dimension 0 first, e.g. 2x4")
    up.add_argument(
        "--rates", required=True, help="rate per dimension, e.g. 50,200Mbit (one value: all dims)"
    )
    up.add_argument("--prefix", default=None, help="name prefix hp<4 hex> (default: random)")
    up.add_argument("--check", action="store_true", help="measure the shaped rates once it is up")
    up.set_defaults(func=run_up)
    down = actions.add_parser("down", help="remove a testbed (also after a crash)")
    down.add_argument("prefixes", nargs="*", help="prefixes printed by `testbed up`")
    down.add_argument("--all", action="store_true", help="every testbed with a state file on this host")
    down.set_defaults(func=run_down)
    show = actions.add_parser("show", help="list testbeds, their namespaces and tc classes")
    show.add_argument("prefix", nargs="?", help="show one testbed's tc classes in detail")
    show.set_defaults(func=run_show)
    check = actions.add_parser("check", help="measure the rates a testbed delivers per dimension")
    check.add_argument("prefix")
    check.add_argument("--seconds", type=float, default=2.0, help="measuring time per dimension")
    check.set_defaults(func=run_check)


def _require_root() -> None:
    problem = detect_host().problem()
    if problem is not None:
        raise TestbedError(problem)


def _print_rates(layout: Layout, seconds: float) -> None:
    table = Table(title=f"rates of {layout.prefix} ({layout.shape}), TCP goodput, all ranks at once")
    for column in ("dim", "target", "median", "min", "max", "median/target"):
        table.add_column(column, justify="right")
    for r in check_rates(layout, duration_s=seconds):
        table.add_row(
            str(r.dim),
            format_rate(r.target_bits_per_s),
            format_rate(r.median_bits_per_s),
            format_rate(r.min_bits_per_s),
            format_rate(r.max_bits_per_s),
            f"{r.ratio:.3f}",
        )
    stdout_console().print(table)


def run_up(args: argparse.Namespace) -> int:
    sizes = parse_shape(args.shape)
    rates = parse_rates_bits_per_s(args.rates, len(sizes))
    prefix = check_prefix(args.prefix) if args.prefix else None
    testbed = netns.up(sizes, rates, prefix=prefix)
    layout = testbed.layout
    print(testbed.layout.prefix)
    console = stdout_console()
    console.print(
        f"[dim]{layout.num_ranks} ranks in namespaces {layout.rank_netns(0)}..{layout.rank_netns(layout.num_ranks - 1)},"
        f" hub {layout.hub_netns} ({layout.subnet_base}.0/24); rates "
        + ", ".join(format_rate(r) for r in rates)
        + f"; kernel: {testbed.kernel.describe()}[/dim]"
    )
    if args.check:
        try:
            _print_rates(layout, 2.0)
        except TestbedError:
            netns.down(layout.prefix)
            raise
    console.print(f"[dim]remove with: hipipe testbed down {layout.prefix}[/dim]")
    return 0


def run_down(args: argparse.Namespace) -> int:
    _require_root()
    prefixes = [check_prefix(p) for p in args.prefixes]
    if args.all:
        prefixes += [p for p in netns.known_prefixes() if p not in prefixes]
    if not prefixes:
        raise TestbedError("give a testbed prefix (see `hipipe testbed show`) or --all")
    for prefix in prefixes:
        deleted = netns.down(prefix)
        print(f"{prefix}: removed {len(deleted)} namespaces")
    return 0


def run_show(args: argparse.Namespace) -> int:
    _require_root()
    console = stdout_console()
    if args.prefix:
        path = netns.state_path(args.prefix)
        if not path.exists():
            raise TestbedError(f"no testbed {args.prefix} (no state file {path})")
        layout = netns.layout_from_state(netns.read_state(path))
        for rank in range(layout.num_ranks):
            console.print(f"[bold]{layout.rank_netns(rank)}[/bold] {layout.rank_address(rank)}")
            console.print(netns.tc_class_stats(layout, rank), markup=False)
        return 0
    table = Table(title="testbeds")
    for column in ("prefix", "shape", "rates", "status", "namespaces present"):
        table.add_column(column)
    for prefix in netns.known_prefixes():
        state = netns.read_state(netns.state_path(prefix))
        layout = netns.layout_from_state(state)
        present = len(netns.existing_netns(prefix))
        table.add_row(
            prefix,
            layout.shape,
            ", ".join(format_rate(r) for r in layout.rates_bits_per_s),
            str(state.get("status", "?")),
            f"{present}/{len(layout.all_netns())}",
        )
    console.print(table)
    return 0


def run_check(args: argparse.Namespace) -> int:
    _require_root()
    path = netns.state_path(check_prefix(args.prefix))
    if not path.exists():
        raise TestbedError(f"no testbed {args.prefix} (no state file {path})")
    _print_rates(netns.layout_from_state(netns.read_state(path)), args.seconds)
    return 0
