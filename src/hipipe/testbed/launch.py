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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hipipe.files import atomic_write_text
from hipipe.testbed.layout import Layout, TestbedError
from hipipe.testbed.nsenter import enter_netns
from hipipe.testbed.processes import follow_processes, stop_processes
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

        publish = store.set  # answers to an event reach the workers through the store

        def on_item(event: Event) -> None:
            collected.append(event)
            if on_event is not None:
                for key, text in (on_event(event) or {}).items():
                    publish(key, text)

        follow_processes(
            processes, logs, events, deadline_s=deadline_s, workdir=workdir, label="rank", on_event=on_item
        )
        return collected
    finally:
        stop_processes(processes)
        del store
