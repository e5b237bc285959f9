"""Follow the processes of one job until they all succeed, one fails, or time runs out.

Both ways of starting a job on a testbed (:mod:`hipipe.testbed.launch`, one worker per
rank; :mod:`hipipe.testbed.torchrun`, one torchrun node per namespace) end the same way:
the first process that fails stops the job with the last line of its log as the reason,
and nothing is left running. One process's stdout carries the events; a reader thread
puts them on a queue, ``None`` when the stream ends, an exception for an unreadable line.
"""

import queue
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hipipe.testbed.layout import TestbedError

EventQueue = "queue.Queue[Any]"


def log_lines(path: Path) -> list[str]:
    """The non-empty lines of a log, stripped; none if it cannot be read."""
    try:
        return [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return []


def last_line(path: Path) -> str:
    """The last non-empty line of a log: a failed worker's reason (it ends with its error)."""
    return (log_lines(path) or [""])[-1]


def stop_processes(processes: list[subprocess.Popen[str]], grace_s: float = 3.0) -> None:
    """Terminate what still runs, then kill what does not stop within ``grace_s``."""
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in processes:
        try:
            proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def follow_processes(
    processes: list[subprocess.Popen[str]],
    logs: list[Path],
    events: "queue.Queue[Any]",
    *,
    deadline_s: float,
    workdir: Path,
    label: str,
    on_event: Callable[[Any], None],
    reason: Callable[[Path], str] = last_line,
) -> None:
    """Pass every event to ``on_event`` until the event stream ends and every process exited 0.

    Raises a one-line :class:`TestbedError` naming the first failing ``label`` (e.g.
    ``rank 3``, ``node 1``) and what ``reason`` reads in its log (by default the last line; a
    launcher whose own summary follows the worker's error passes its own reader), or the
    deadline. The caller stops the processes (:func:`stop_processes`) whatever happens.
    """
    end = time.monotonic() + deadline_s
    finished = False
    while True:
        failed = [i for i, p in enumerate(processes) if p.poll() not in (None, 0)]
        if failed:
            time.sleep(0.3)  # let the first failure's peers report theirs too
            first = min(failed, key=lambda i: logs[i].stat().st_mtime if logs[i].exists() else 0.0)
            why = reason(logs[first]) or f"{label} {first} exited with code {processes[first].returncode}"
            raise TestbedError(f"{label} {first} failed: {why} (logs in {workdir})")
        if finished and all(p.poll() == 0 for p in processes):
            return
        if time.monotonic() > end:
            raise TestbedError(f"the job did not finish within {deadline_s:.0f} s (logs in {workdir})")
        try:
            event = events.get(timeout=0.2)
        except queue.Empty:
            continue
        if isinstance(event, BaseException):
            raise TestbedError(f"unreadable event from {label} 0: {event} (logs in {workdir})")
        if event is None:
            finished = True
            continue
        on_event(event)
