"""``hipipe calibrate``: measure each dimension's latency and bandwidth, write a topology YAML.

On the emulated testbed (``--testbed 2x4 --rates 50,200Mbit``, root) it brings a
testbed up, calibrates and removes it. Under torchrun on a real cluster
(``torchrun ... -m hipipe.cli calibrate --shape 2x4``: RANK and WORLD_SIZE set) every
rank measures and rank 0 writes the file. Either way ``hipipe plan`` reads the YAML.
"""

import argparse
import os
from datetime import timedelta

from hipipe.cli.common import add_jobs_argument, check_output_path, jobs_from_args, stdout_console
from hipipe.files import atomic_write_text
from hipipe.hostcpu import usable_cores
from hipipe.repeats import DEFAULT_MAX_REPEATS, DEFAULT_PRECISION, jobs_problem
from hipipe.report.bench import describe_calibration
from hipipe.testbed.fit import (
    CONCURRENT_WINDOW_S,
    DEFAULT_CALIBRATION_SIZES_BYTES,
    OVERHEAD_PLANNER,
    Calibration,
    calibration_from_samples,
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
        help="per-rank op sizes to time (default: nine sizes a factor 2 apart, 1/256 to 1 of ~1 s on the slowest dimension;"
        f" under torchrun {','.join(format_size(s).replace(' ', '') for s in DEFAULT_CALIBRATION_SIZES_BYTES)})",
    )
    parser.add_argument(
        "--concurrent-s",
        type=float,
        default=CONCURRENT_WINDOW_S,
        help="seconds per size of the pass that times every dimension while all are busy (the"
        " concurrency slowdown); 0: isolated only, no slowdown (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed repeats per size (default: %(default)s)"
    )
    parser.add_argument(
        "--no-overhead",
        action="store_true",
        help=f"skip the {OVERHEAD_PLANNER} run that measures the per-op cost, hand-off, jitter and memory"
        " bandwidth (docs/MODEL.md section 10)",
    )
    add_jobs_argument(parser, what="the overhead run")
    parser.add_argument("-o", "--output", default="calibrated.yaml", help="topology YAML to write")
    parser.set_defaults(func=run)


def _yaml(calibration: Calibration, source: str) -> str:
    header = [f"# hipipe calibrate: {source}"]
    for fit in calibration.fits:
        header.append(
            f"# dim {fit.dim}: {fit.bandwidth_bytes_per_s * 8 / 1e6:.2f} Mbit/s, {fit.constant_s * 1e3:.3f} ms"
            f" per RS/AG, {fit.num_samples} samples, worst residual {100 * fit.max_relative_residual:.1f}%"
        )
    if calibration.overhead_times_s:
        header.append(
            f"# overheads measured inside {OVERHEAD_PLANNER} runs: {calibration.overheads.describe()}"
        )
    if calibration.host_cpu_scale is not None:
        header.append(
            f"# host CPU per step and per byte: the isolated runs' fit x{calibration.host_cpu_scale:.3g},"
            f" the CPU the {OVERHEAD_PLANNER} runs spent"
        )
    return "\n".join(header) + "\n" + topology_to_yaml(calibration.topology())


def run(args: argparse.Namespace) -> int:
    output = check_output_path(args.output)
    sizes_bytes = parse_sizes_bytes(args.sizes) if args.sizes else None
    if args.repeats < 1:
        raise TestbedError("--repeats must be >= 1")
    if args.jobs is not None and not args.testbed:
        raise TestbedError("--jobs is for the testbed: under torchrun the job is the one torchrun started")
    problem = jobs_problem(jobs_from_args(args))
    if problem is not None:
        raise TestbedError(problem)
    calibration: Calibration | None
    if args.testbed:
        calibration, source = _on_testbed(args, sizes_bytes)
    else:
        calibration, source = _under_torchrun(args, sizes_bytes)
    if calibration is None:
        return 0  # a torchrun rank other than 0: rank 0 writes the file
    text = _yaml(calibration, source)
    if output is None:
        print(text, end="")
    else:
        atomic_write_text(output, text)
    console = stdout_console()
    console.print(describe_calibration(calibration))
    if output is not None:
        console.print(f"[dim]wrote {output}: hipipe plan {output} --size ...[/dim]")
    return 0


def _on_testbed(args: argparse.Namespace, sizes_bytes: list[int] | None) -> tuple[Calibration, str]:
    from hipipe.files import scratch_dir
    from hipipe.testbed import netns
    from hipipe.testbed.bench import calibrate_testbed

    if not args.rates:
        raise TestbedError("--testbed needs --rates, e.g. --rates 50,200Mbit")
    sizes = parse_shape(args.testbed)
    rates = parse_rates_bits_per_s(args.rates, len(sizes))
    testbed = netns.up(sizes, rates)
    try:
        with scratch_dir(None, prefix="hipipe-calibrate-") as workdir:
            calibration = calibrate_testbed(
                testbed.layout,
                sizes_bytes=sizes_bytes,
                repeats=args.repeats,
                concurrent_window_s=args.concurrent_s,
                overhead=not args.no_overhead,
                # the overhead run's median sets the per-op cost: settled and spread over jobs as a
                # bench row is (hipipe bench calibrates the same way)
                overhead_max_repeats=max(args.repeats, DEFAULT_MAX_REPEATS),
                overhead_precision=DEFAULT_PRECISION,
                overhead_jobs=jobs_from_args(args),
                workdir=workdir,
            )
    finally:
        netns.down(testbed.layout.prefix)
    return calibration, f"testbed {args.testbed} at {args.rates}"


def _under_torchrun(
    args: argparse.Namespace, sizes_bytes: list[int] | None
) -> tuple[Calibration | None, str]:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise TestbedError("--shape is for runs under torchrun (RANK/WORLD_SIZE unset); use --testbed here")
    import torch.distributed as dist

    from hipipe.testbed.calibrate import calibrate_in_process
    from hipipe.torch.groups import dimension_groups

    sizes = parse_shape(args.shape)
    sizes_bytes = sizes_bytes or list(DEFAULT_CALIBRATION_SIZES_BYTES)
    timeout_s = 600.0
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    try:
        groups = dimension_groups(sizes, timeout_s=timeout_s)
        samples, overhead = calibrate_in_process(
            sizes,
            groups,
            sizes_bytes=sizes_bytes,
            repeats=args.repeats,
            timeout_s=timeout_s,
            concurrent_window_s=args.concurrent_s,
            overhead_message_bytes=0 if args.no_overhead else max(sizes_bytes) // 4 * 4,
        )
        rank = dist.get_rank()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None, ""
    # Rank 0's host: LOCAL_WORLD_SIZE ranks (torchrun sets it) share its CPUs.
    calibration = calibration_from_samples(
        sizes,
        samples,
        overhead=overhead,
        host_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "0")),
        host_cores=usable_cores(),
    )
    return calibration, f"torchrun world {args.shape}"
