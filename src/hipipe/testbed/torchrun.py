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
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from hipipe.testbed.layout import Layout
from hipipe.testbed.netns import kill_netns_processes
from hipipe.testbed.processes import follow_processes, log_lines, stop_processes

RENDEZVOUS_PORT = 29400
"""Inside node 0's namespace: nothing else listens there, and the host's ports are untouched."""


def torchrun_argv(
    layout: Layout,
    node: int,
    module_argv: Sequence[str],
    *,
    rendezvous_id: str,
    join_timeout_s: float,
    log_dir: Path,
    python: str = sys.executable,
) -> list[str]:
    """The command that starts node ``node`` of the job in its namespace (one process per node).

    ``log_dir`` is where torchrun keeps its per-run directory: without ``--log-dir`` it makes
    a ``torchelastic_*`` directory in the system's temporary directory and never removes it,
    one per node per job.
    """
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
        f"--log-dir={log_dir}",
        "-m",
        *module_argv,
    ]


_WORKER_LINE = re.compile(r"rank \d+: ")
"""The worker's own one-line error (``hipipe.training.worker`` writes it before exiting)."""
_EXITCODE_LINE = re.compile(r"exitcode\s*:\s*(-?\d+)\s*\(pid: \d+\)\s*(?:\((SIG\w+)\))?")
_RANK_LINE = re.compile(r"rank\s*:\s*(\d+)")
_ERROR_LINE = re.compile(
    r"(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception)\b.*|terminate called.*|what\(\):.*"
    r"|Fatal Python error:.*)"
)
"""A Python exception's last traceback line, C++'s std::terminate report (Gloo aborts so), or
the fatal-error line the worker's faulthandler writes on a signal."""


def node_failure_reason(lines: Sequence[str]) -> str:
    """One line for a failed node's log: the worker's own error, else torchrun's summary.

    The worker ends a failure it understands with ``rank N: REASON``; torchrun then prints a
    summary box whose last line is a border of ``=`` signs, so "the last line" would say
    nothing. A failure the worker could not report (a signal, a C++ abort) is told from the
    box: the rank, its exit code or signal, and the last exception or abort line before it.
    Without a box (the torchrun agent itself failed, e.g. in the rendezvous) the last line is
    the agent's exception.
    """
    worker = [line for line in lines if _WORKER_LINE.match(line)]
    if worker:
        return worker[-1]
    box = next((i for i, line in enumerate(lines) if line.startswith("Root Cause")), None)
    if box is None:
        return lines[-1] if lines else ""
    exit_match = next((m for line in lines[box:] if (m := _EXITCODE_LINE.search(line))), None)
    rank_match = next((m for line in lines[box:] if (m := _RANK_LINE.match(line))), None)
    start = next((i for i in range(box, -1, -1) if lines[i].startswith("=" * 8)), box)
    errors = [m.group(1) for line in lines[:start] if (m := _ERROR_LINE.match(line))]
    errors = [e for e in errors if not e.startswith("torch.distributed.elastic.multiprocessing.errors")]
    # "Fatal Python error: Aborted" only repeats the signal; an exception or abort message says why
    errors = [e for e in errors if not e.startswith("Fatal Python error")] or errors
    who = f"rank {rank_match.group(1)}" if rank_match else "the worker"
    if exit_match is None:
        how = "failed"
    elif exit_match.group(2):
        how = f"was killed by {exit_match.group(2)}"
    else:
        how = f"exited with code {exit_match.group(1)}"
    return f"{who} {how}" + (f": {errors[-1]}" if errors else " (no error line before torchrun's summary)")


def _pump(stream: IO[str], mark: str, log: IO[str], events: "queue.Queue[dict[str, Any] | None]") -> None:
    """Copy node 0's stdout to its log; pass the event lines on."""
    for line in stream:
        log.write(line)
        log.flush()
        if line.startswith(mark):
            events.put(json.loads(line[len(mark) :]))
    events.put(None)


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
                layout,
                node,
                module_argv,
                rendezvous_id=layout.prefix,
                join_timeout_s=join_timeout_s,
                log_dir=workdir / f"node{node}-torchrun",
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

        def on_item(event: dict[str, Any]) -> None:
            collected.append(event)
            if on_event is not None:
                on_event(event)

        follow_processes(
            processes,
            logs,
            events,
            deadline_s=deadline_s,
            workdir=workdir,
            label="node",
            on_event=on_item,
            reason=lambda log: node_failure_reason(log_lines(log)),
        )
        return collected
    finally:
        stop_processes(processes)
        for node in range(layout.num_ranks):
            kill_netns_processes(layout.rank_netns(node))  # torchrun's workers live in their own sessions
        for handle in handles:
            handle.close()
