"""``hipipe calibrate``: measure each dimension's latency and bandwidth, write a topology YAML.

On the emulated testbed (``--testbed 2x4 --rates 50,200Mbit``, root) it brings a
testbed up, calibrates and removes it. Under torchrun on a real cluster
(``torchrun ... -m hipipe.cli calibrate --shape 2x4``: RANK and WORLD_SIZE set) every
rank measures and rank 0 writes the file. Either way ``hipipe plan`` reads the YAML.
"""

import argparse
import os
import tempfile
from datetime import timedelta
from pathlib import Path

from hipipe.cli.common import check_output_path, stdout_console
from hipipe.files import atomic_write_text
from hipipe.testbed.calibrate import (
    CONCURRENT_WINDOW_S,
    DEFAULT_CALIBRATION_SIZES_BYTES,
    DimFit,
    calibrated_topology,
    fit_all,
)
from hipipe.testbed.layout import TestbedError, parse_rates_bits_per_s, parse_shape
from hipipe.topology_io import topology_to_yaml
from hipipe.units import format_size, parse_sizes_bytes


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit latency and bandwidth per dimension on a testbed or under torchrun"
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--testbed", metavar="SHAPE", help="emulated testbed shape, e.g. 2x4 (needs --rates, root)"
    )
    where.add_argument("--shape", help="under torchrun: ranks per dimension of the running world, e.g. 8x4")
    parser.add_argument("--rates", help="testbed rate per dimension, e.g. 50,200Mbit")
    parser.add_argument(
        "--sizes",
        default=None,
        help="per-rank op sizes to time (default: four sizes up to ~1 s on the slowest dimension;"
        f" under torchrun {','.join(format_size(s).replace(' ', '') for s in DEFAULT_CALIBRATION_SIZES_BYTES)})",
    )
    parser.add_argument(
        "--concurrent-s",
        type=float,
        default=CONCURRENT_WINDOW_S,
        help="window of the pass that times every dimension while all are busy; 0: isolated only"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed repeats per size (default: %(default)s)"
    )
    parser.add_argument("-o", "--output", default="calibrated.yaml", help="topology YAML to write")
    parser.set_defaults(func=run)


def _yaml(fits: list[DimFit], source: str) -> str:
    header = [f"# hipipe calibrate: {source}"]
    for fit in fits:
        header.append(
            f"# dim {fit.dim}: {fit.bandwidth_bytes_per_s * 8 / 1e6:.2f} Mbit/s, {fit.constant_s * 1e3:.3f} ms"
            f" per RS/AG, {fit.num_samples} samples, worst residual {100 * fit.max_relative_residual:.1f}%"
        )
    return "\n".join(header) + "\n" + topology_to_yaml(calibrated_topology(fits, name="calibrated"))


def run(args: argparse.Namespace) -> int:
    output = check_output_path(args.output)
    sizes_bytes = parse_sizes_bytes(args.sizes) if args.sizes else None
    if args.repeats < 1:
        raise TestbedError("--repeats must be >= 1")
    fits: list[DimFit] | None
    if args.testbed:
        fits, source = _on_testbed(args, sizes_bytes)
    else:
        fits, source = _under_torchrun(args, sizes_bytes)
    if fits is None:
        return 0  # a torchrun rank other than 0: rank 0 writes the file
    text = _yaml(fits, source)
    if output is None:
        print(text, end="")
    else:
        atomic_write_text(output, text)
    console = stdout_console()
    for fit in fits:
        console.print(
            f"dim {fit.dim} (n={fit.size}): {fit.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s,"
            f" {fit.constant_s * 1e3:.2f} ms per op (worst residual {100 * fit.max_relative_residual:.0f}%)"
        )
    if output is not None:
        console.print(f"[dim]wrote {output}: hipipe plan {output} --size ...[/dim]")
    return 0


def _on_testbed(args: argparse.Namespace, sizes_bytes: list[int] | None) -> tuple[list[DimFit], str]:
    from hipipe.testbed import netns
    from hipipe.testbed.bench import calibrate_testbed

    if not args.rates:
        raise TestbedError("--testbed needs --rates, e.g. --rates 50,200Mbit")
    sizes = parse_shape(args.testbed)
    rates = parse_rates_bits_per_s(args.rates, len(sizes))
    testbed = netns.up(sizes, rates)
    try:
        fits = calibrate_testbed(
            testbed.layout,
            sizes_bytes=sizes_bytes,
            repeats=args.repeats,
            concurrent_window_s=args.concurrent_s,
            workdir=Path(tempfile.mkdtemp(prefix="hipipe-calibrate-")),
        )
    finally:
        netns.down(testbed.layout.prefix)
    return fits, f"testbed {args.testbed} at {args.rates}"


def _under_torchrun(
    args: argparse.Namespace, sizes_bytes: list[int] | None
) -> tuple[list[DimFit] | None, str]:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise TestbedError("--shape is for runs under torchrun (RANK/WORLD_SIZE unset); use --testbed here")
    import torch.distributed as dist

    from hipipe.testbed.calibrate import measure_in_process
    from hipipe.torch.groups import dimension_groups

    sizes = parse_shape(args.shape)
    timeout_s = 600.0
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    try:
        groups = dimension_groups(sizes, timeout_s=timeout_s)
        samples = measure_in_process(
            sizes,
            groups,
            sizes_bytes=sizes_bytes or DEFAULT_CALIBRATION_SIZES_BYTES,
            repeats=args.repeats,
            timeout_s=timeout_s,
            concurrent_window_s=args.concurrent_s,
        )
        rank = dist.get_rank()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None, ""
    return fit_all(sizes, samples), f"torchrun world {args.shape}"
