"""How much CPU a host spent, and how much it has: the host term's measurements.

On a host that runs many ranks (the testbed: 8 ranks on 2 cores) a many-op schedule is
bound by the CPU, not the wire: every ring step wakes threads and makes system calls on
every rank, and every byte crosses the kernel's network stack (on the testbed the
emulated links too) on the same cores. ``/proc/stat`` counts all of it, softirq and
kernel threads included, which a process's own CPU time misses; so the calibration
reads the host's busy time around each timed run. Torch-free; Linux only (elsewhere
there is nothing to read, and the host term is simply not calibrated).
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

PROC_STAT = Path("/proc/stat")

_BUSY_FIELDS = (0, 1, 2, 5, 6)
"""user, nice, system, irq, softirq of the ``cpu`` line: iowait, idle and steal are not
work this host's ranks did."""


def busy_cpu_s(stat_path: Path = PROC_STAT) -> float | None:
    """CPU seconds the whole host has been busy since boot; None where it cannot be read."""
    try:
        first = stat_path.read_text().splitlines()[0].split()
        ticks = [int(value) for value in first[1:]]
    except (OSError, IndexError, ValueError):
        return None
    if first[0] != "cpu" or len(ticks) < 7:
        return None
    return sum(ticks[i] for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def usable_cores() -> int:
    """CPUs this process (and the ranks it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def reading_cpu(run: Callable[[], T], readings: list[float | None]) -> Callable[[], T]:
    """``run``, appending the host's busy CPU seconds over each call to ``readings``
    (None where ``/proc/stat`` cannot be read). Read inside the timed window, so the CPU
    and the time of one run cover the same span."""

    def wrapped() -> T:
        before = busy_cpu_s()
        out = run()
        end = busy_cpu_s()
        readings.append(None if before is None or end is None else end - before)
        return out

    return wrapped


def timed_readings(readings: list[float | None], warmup: int) -> tuple[float, ...]:
    """The readings of the timed runs (after ``warmup``); empty if any could not be read."""
    timed = readings[warmup:]
    return tuple(c for c in timed if c is not None) if None not in timed else ()
