"""``hipipe topologies``: the presets with N, bandwidths and the bounds for 1 GiB."""

import argparse
import json

from rich.table import Table

from hipipe.bounds import order_mix_bound_s
from hipipe.cli.common import stdout_console
from hipipe.cost import lower_bound_s
from hipipe.presets import PRESETS
from hipipe.topology_io import topology_to_dict
from hipipe.units import format_time

REFERENCE_MESSAGE_BYTES = 2**30


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("topologies", help="list the preset networks")
    parser.add_argument("--json", action="store_true", help="print a JSON document instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    topologies = [factory() for factory in PRESETS.values()]
    if args.json:
        print(json.dumps([{"num_npus": t.num_npus, **topology_to_dict(t)} for t in topologies], indent=1))
        return 0
    table = Table(title="Preset networks (bounds for a 1 GiB AllReduce)", title_justify="left")
    for column in ("name", "N", "dimensions (kind size @ GB/s / latency)", "T*", "T_mix"):
        table.add_column(column, justify="right" if column in {"N", "T*", "T_mix"} else "left")
    for topo in topologies:
        dims = "\n".join(
            f"{d.kind.value} {d.size} @ {d.bandwidth_bytes_per_s / 1e9:g} / {d.latency_s * 1e9:g} ns"
            for d in topo.dims
        )
        table.add_row(
            topo.name,
            str(topo.num_npus),
            dims,
            format_time(lower_bound_s(topo, REFERENCE_MESSAGE_BYTES)),
            format_time(order_mix_bound_s(topo, REFERENCE_MESSAGE_BYTES)),
        )
    stdout_console().print(table)
    return 0
