"""How busy the host is: measured runs on the testbed wait for a quiet machine.

Eight ranks on two cores are sensitive to any other work, so a benchmark checks the
CPU before each measurement and reports what it saw. The share of non-idle CPU time
over a few seconds (from ``/proc/stat``) forgets a previous run within seconds, unlike
the load average.
"""

import time
from collections.abc import Callable
from pathlib import Path

QUIET_BUSY_FRACTION = 0.25
"""Other work below a quarter of the CPU counts as quiet."""


def cpu_busy_fraction(sample_s: float = 3.0) -> float:
    """Share of CPU time not idle over ``sample_s``, all cores together."""

    def snapshot() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    idle0, total0 = snapshot()
    time.sleep(sample_s)
    idle1, total1 = snapshot()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_for_quiet_host(wait_s: float, *, on_wait: Callable[[float], None] | None = None) -> float:
    """Wait (at most ``wait_s``) until other work uses under :data:`QUIET_BUSY_FRACTION` of
    the CPU; return the last reading, quiet or not, for the report."""
    deadline = time.monotonic() + wait_s
    busy = cpu_busy_fraction()
    while busy > QUIET_BUSY_FRACTION and time.monotonic() < deadline:
        if on_wait is not None:
            on_wait(busy)
        time.sleep(10)
        busy = cpu_busy_fraction()
    return busy
