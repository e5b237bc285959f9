"""Why the testbed pins its ranks' TCP to cubic: streamed op time per size, BBR vs cubic.

    sudo .venv/bin/python benchmarks/congestion.py [--out benchmarks/results]

Brings up a 4x2 testbed at 25/200 Mbit/s and, once with every rank's route on BBR and
once on cubic (``ip route replace ... congctl``; the testbed itself always sets cubic,
docs/MODEL.md section 10), times streamed ring ReduceScatters and AllGathers on the
25 Mbit/s ring of 4 at sizes around the 64 KiB pieces a 64-chunk plan of 4 MiB carries
(``hipipe calibrate``'s own measurement: about 0.25 s of back-to-back ops per run,
median of 3 runs). Prints each op's time over its wire time ``(n-1)/n S / rate``: a link
gives a smooth ratio near 1 at every size; the table shows where a congestion control
does not. Ends with one JSON line; ``--out DIR`` writes ``congestion-<machine>-<date>.md``.
"""

import argparse
import datetime
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hipipe.files import atomic_write_text, scratch_dir
from hipipe.testbed import host, netns
from hipipe.testbed.bench import calibrate_testbed
from hipipe.testbed.layout import Layout
from hipipe.testbed.shaping import detect_host

SHAPE = (4, 2)
RATES_BITS_PER_S = (25e6, 200e6)
DIM = 0
SIZES_BYTES = (32 * 1024, 48 * 1024, 56 * 1024, 64 * 1024, 72 * 1024, 96 * 1024, 128 * 1024)
CONTROLS = ("bbr", "cubic")
QUIET_WAIT_S = 300.0


def set_congestion_control(layout: Layout, control: str) -> None:
    """Every rank's route on the testbed subnet to ``control`` (as ``netns.link_commands`` does)."""
    for rank in range(layout.num_ranks):
        netns.run(
            [
                *("ip", "-n", layout.rank_netns(rank), "route", "replace", f"{layout.subnet_base}.0/24"),
                *("dev", layout.rank_ifname(rank), "proto", "kernel", "scope", "link"),
                *("src", layout.rank_address(rank), "congctl", control),
            ]
        )


def available_controls() -> set[str]:
    path = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
    return set(path.read_text().split()) if path.exists() else set()


def measure(layout: Layout, control: str) -> dict[str, Any]:
    """Streamed op times on :data:`DIM` under ``control``: per phase, ``{bytes: seconds}``."""
    set_congestion_control(layout, control)
    with scratch_dir(None, prefix="hipipe-congestion-") as workdir:
        calibration = calibrate_testbed(
            layout,
            sizes_bytes=SIZES_BYTES,
            repeats=3,
            concurrent_window_s=0.0,
            overhead=False,
            workdir=workdir,
        )
    return {
        curve.phase: {int(b): t for b, t in curve.points}
        for curve in calibration.overheads.op_curves
        if curve.dim == DIM
    }


def wire_s(full_bytes: int) -> float:
    n = SHAPE[DIM]
    return (n - 1) / n * full_bytes / (RATES_BITS_PER_S[DIM] / 8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    console = Console(highlight=False)
    problem = detect_host().problem()
    missing = set(CONTROLS) - available_controls()
    if problem is None and missing:
        problem = f"the kernel lacks TCP congestion control {', '.join(sorted(missing))}"
    if problem is not None:
        console.print(f"congestion benchmark skipped: {problem}")
        print(json.dumps({"benchmark": "congestion", "skipped": problem}))
        return 0
    busy = host.wait_for_quiet_host(QUIET_WAIT_S)
    testbed = netns.up(SHAPE, RATES_BITS_PER_S)
    try:
        times = {control: measure(testbed.layout, control) for control in CONTROLS}
    finally:
        netns.down(testbed.layout.prefix)
    table = Table(
        title=f"streamed ops on the {RATES_BITS_PER_S[DIM] / 1e6:g} Mbit/s ring of {SHAPE[DIM]}:"
        " time / wire time (RS, AG)",
        title_justify="left",
    )
    table.add_column("op size")
    for control in CONTROLS:
        table.add_column(control, justify="right")
    rows = []
    for size in SIZES_BYTES:
        full = max(1, size // 4) * 4
        cells = [
            ", ".join(f"{times[c][phase][full] / wire_s(full):.2f}" for phase in ("RS", "AG"))
            for c in CONTROLS
        ]
        rows.append([f"{size // 1024} KiB", *cells])
        table.add_row(*rows[-1])
    console.print(table)
    worst = {c: max(times[c][p][b] / wire_s(b) for p in ("RS", "AG") for b in times[c][p]) for c in CONTROLS}
    console.print("worst ratio: " + ", ".join(f"{c} {w:.2f}" for c, w in worst.items()))
    machine = f"{os.cpu_count()}cpu"
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"congestion-{machine}-{datetime.date.today().isoformat()}"
        lines = [
            f"# Streamed op time per size under BBR and cubic ({machine}, {datetime.date.today().isoformat()})",
            "",
            "Generated by `benchmarks/congestion.py`: a 4x2 testbed at 25/200 Mbit/s, streamed ring",
            "ops on the 25 Mbit/s ring of 4 (median of 3 runs of ~0.25 s), time over wire time.",
            f"CPU busy before: {busy:.0%}.",
            "",
            "| op size | " + " | ".join(f"{c} (RS, AG)" for c in CONTROLS) + " |",
            "|---" * (len(CONTROLS) + 1) + "|",
            *("| " + " | ".join(row) + " |" for row in rows),
            "",
            "Worst ratio: " + ", ".join(f"{c} {w:.2f}" for c, w in worst.items()) + ".",
            "",
        ]
        atomic_write_text(args.out / f"{stem}.md", "\n".join(lines))
        console.print(f"[dim]wrote {args.out / stem}.md[/dim]")
    print(
        json.dumps(
            {
                "benchmark": "congestion",
                "machine": machine,
                "cpu_busy_before": busy,
                "times_s": times,
                "worst_ratio": worst,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
