"""Launch a job on a testbed the way multi-node jobs are launched: torchrun, one node per namespace.

Each rank namespace is one *node*: its own ``torchrun --nnodes N --node-rank i`` with the
c10d rendezvous hosted by node 0 (``--rdzv-conf is_host=1`` there, ``is_host=0``
elsewhere) at node 0's address. The namespaces share the host's hostname, so torchrun
cannot tell the nodes apart by name: ``--local-addr`` gives each node its own address,
and without ``is_host`` no node would know it must host the store. A real cluster runs
the same command with the hosts' addresses (see the README).

Node 0's stdout carries the job's JSON events; every node's output goes to a log whose
last line becomes the error if the node fails. The first failing node stops the job:
the others are stopped, then every process left in the rank namespaces is killed by
pid, so nothing outlives the call.
"""

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from hipipe.testbed.layout import Layout, TestbedError
from hipipe.testbed.netns import kill_netns_processes

RENDEZVOUS_PORT = 29400
"""Inside node 0's namespace: nothing else listens there, and the host's ports are untouched."""


def torchrun_argv(
    layout: Layout,
    node: int,
    module_argv: Sequence[str],
    *,
    rendezvous_id: str,
    join_timeout_s: float,
    python: str = sys.executable,
) -> list[str]:
    """The command that starts node ``node`` of the job in its namespace (one process per node)."""
    is_host = 1 if node == 0 else 0
    return [
        "ip",
        "netns",
        "exec",
        layout.rank_netns(node),
        "env",
        f"GLOO_SOCKET_IFNAME={layout.rank_ifname(node)}",
        "OMP_NUM_THREADS=1",
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={layout.num_ranks}",
        f"--node-rank={node}",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={layout.rank_address(0)}:{RENDEZVOUS_PORT}",
        f"--rdzv-id={rendezvous_id}",
        f"--rdzv-conf=is_host={is_host},join_timeout={int(join_timeout_s)}",
        f"--local-addr={layout.rank_address(node)}",
        "-m",
        *module_argv,
    ]


def _pump(stream: IO[str], mark: str, log: IO[str], events: "queue.Queue[dict[str, Any] | None]") -> None:
    """Copy node 0's stdout to its log; pass the event lines on."""
    for line in stream:
        log.write(line)
        log.flush()
        if line.startswith(mark):
            events.put(json.loads(line[len(mark) :]))
    events.put(None)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("rank ")]
    return (errors or lines or [""])[-1].strip()


def run_torchrun_job(
    layout: Layout,
    module_argv: Sequence[str],
    *,
    workdir: Path,
    event_mark: str,
    deadline_s: float,
    join_timeout_s: float = 120.0,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``python -m MODULE ARGS`` on every node under torchrun; return node 0's events."""
    workdir.mkdir(parents=True, exist_ok=True)
    logs = [workdir / f"node{n}.log" for n in range(layout.num_ranks)]
    processes: list[subprocess.Popen[str]] = []
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    collected: list[dict[str, Any]] = []
    handles = [log.open("w") for log in logs]
    try:
        for node in range(layout.num_ranks):
            argv = torchrun_argv(
                layout, node, module_argv, rendezvous_id=layout.prefix, join_timeout_s=join_timeout_s
            )
            processes.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if node == 0 else handles[node],
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        assert processes[0].stdout is not None
        threading.Thread(
            target=_pump, args=(processes[0].stdout, event_mark, handles[0], events), daemon=True
        ).start()
        end = time.monotonic() + deadline_s
        finished = False
        while True:
            failed = [n for n, p in enumerate(processes) if p.poll() not in (None, 0)]
            if failed:
                time.sleep(0.5)  # let the peers of the first failure report theirs too
                for handle in handles:
                    handle.flush()
                first = min(failed, key=lambda n: logs[n].stat().st_mtime)
                reason = (
                    _last_line(logs[first]) or f"node {first} exited with code {processes[first].returncode}"
                )
                raise TestbedError(f"node {first} failed: {reason} (logs in {workdir})")
            if finished and all(p.poll() == 0 for p in processes):
                return collected
            if time.monotonic() > end:
                raise TestbedError(f"the job did not finish within {deadline_s:.0f} s (logs in {workdir})")
            try:
                event = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if event is None:
                finished = True
                continue
            collected.append(event)
            if on_event is not None:
                on_event(event)
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in processes:
            try:
                proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for node in range(layout.num_ranks):
            kill_netns_processes(layout.rank_netns(node))  # torchrun's workers live in their own sessions
        for handle in handles:
            handle.close()
