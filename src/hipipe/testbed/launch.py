"""Start one worker per rank on a testbed and follow them until they finish.

The parent owns the rendezvous ``TCPStore``: a dedicated thread enters the hub
namespace and creates it there, bound to the bridge, so the workers reach it over
their veths and the host's own namespace never listens on anything. Workers are
separate processes (``python -m hipipe.testbed.worker``), each in its own session so
a Ctrl-C reaches only the parent, which then stops them by pid.

Rank 0's stdout carries typed events (:mod:`hipipe.testbed.protocol`); every rank's
stderr goes to a log file whose last line becomes the error message if the rank fails.
The first failing rank stops the run: the others are killed instead of waiting for a
timeout. An event handler may answer an event with store entries the workers wait for
(the calibration's overhead schedule): the parent publishes them in its store.
"""

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hipipe.files import atomic_write_text
from hipipe.testbed.layout import Layout, TestbedError
from hipipe.testbed.nsenter import enter_netns
from hipipe.testbed.protocol import Event, Job, Task, event_from_line, job_to_json

EventHandler = Callable[[Event], Mapping[str, str] | None]
"""Sees each event of rank 0; may return ``{store key: text}`` for the workers to read."""


def start_store(layout: Layout, timeout_s: float) -> Any:
    """A master ``TCPStore`` listening in the hub namespace on a free port."""
    from datetime import timedelta

    import torch.distributed as dist

    box: dict[str, Any] = {}

    def make() -> None:
        try:
            enter_netns(layout.hub_netns)
            box["store"] = dist.TCPStore(
                layout.hub_address,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=timeout_s),
            )
        except Exception as exc:
            box["error"] = exc

    thread = threading.Thread(target=make, name="hipipe-store", daemon=True)
    thread.start()
    thread.join(timeout=30)
    if "store" not in box:
        raise TestbedError(f"cannot start the rendezvous store in {layout.hub_netns}: {box.get('error')}")
    return box["store"]


def _pump(stream: IO[str], events: "queue.Queue[Event | BaseException | None]") -> None:
    try:
        for line in stream:
            event = event_from_line(line)
            if event is not None:
                events.put(event)
    except Exception as exc:  # a malformed event line: report it instead of hanging
        events.put(exc)
    events.put(None)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _stop(processes: list[subprocess.Popen[str]]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 3.0
    for proc in processes:
        try:
            proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_job(
    layout: Layout,
    tasks: Sequence[Task],
    *,
    workdir: Path,
    timeout_s: float,
    deadline_s: float,
    on_event: EventHandler | None = None,
) -> list[Event]:
    """Run ``tasks`` on every rank; return rank 0's events. ``deadline_s`` bounds the whole job."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = start_store(layout, timeout_s)
    job = Job(
        netns=tuple(layout.rank_netns(r) for r in range(layout.num_ranks)),
        ifnames=tuple(layout.rank_ifname(r) for r in range(layout.num_ranks)),
        store_host=layout.hub_address,
        store_port=int(store.port),
        sizes=layout.sizes,
        timeout_s=timeout_s,
        tasks=tuple(tasks),
    )
    job_path = workdir / "job.json"
    atomic_write_text(job_path, job_to_json(job))
    processes: list[subprocess.Popen[str]] = []
    logs = [workdir / f"rank{r}.log" for r in range(layout.num_ranks)]
    events: queue.Queue[Event | BaseException | None] = queue.Queue()
    collected: list[Event] = []
    try:
        for rank in range(layout.num_ranks):
            with logs[rank].open("w") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "hipipe.testbed.worker", str(job_path), str(rank)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                        stderr=log,
                        text=True,
                        start_new_session=True,
                    )
                )
        assert processes[0].stdout is not None
        threading.Thread(target=_pump, args=(processes[0].stdout, events), daemon=True).start()
        end = time.monotonic() + deadline_s
        finished = False
        while True:
            failed = [r for r, p in enumerate(processes) if p.poll() not in (None, 0)]
            if failed:
                time.sleep(0.3)  # let the first failure's peers report theirs too
                first = min(failed, key=lambda r: logs[r].stat().st_mtime)
                reason = (
                    _last_line(logs[first]) or f"rank {first} exited with code {processes[first].returncode}"
                )
                raise TestbedError(f"worker failed: {reason} (logs in {workdir})")
            if finished and all(p.poll() == 0 for p in processes):
                return collected
            if time.monotonic() > end:
                raise TestbedError(f"the run did not finish within {deadline_s:.0f} s (logs in {workdir})")
            try:
                event = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if isinstance(event, BaseException):
                raise TestbedError(f"unreadable worker event: {event} (logs in {workdir})")
            if event is None:
                finished = True
                continue
            collected.append(event)
            if on_event is not None:
                for key, text in (on_event(event) or {}).items():
                    store.set(key, text)
    finally:
        _stop(processes)
        del store
