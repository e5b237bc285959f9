"""Start N local Gloo processes, run one function in each, collect what each returns.

Used by ``hipipe run --nproc N`` and by the tests, which run many cases in one job so
that the processes (and their ``import torch``) start once. The parent owns the
``TCPStore`` (bound to a free port chosen by the OS, so there is no port race); each
child joins it, calls ``init_process_group`` with a timeout, runs ``fn(rank,
world_size, *args)`` and sends back its result or its error. The parent never waits
past its deadline: stragglers are killed by pid and the job ends with an error.
Processes fork from a forkserver that has imported torch, so a job starts in about a
second instead of paying ``import torch`` once per rank.
"""

import dataclasses
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hipipe.errors import HipipeError

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, kw_only=True, slots=True)
class RankOutcome:
    """What one process did: its result, or its error (one line) and details."""

    rank: int
    ok: bool
    value: Any = None
    error: str = ""
    details: str = ""
    exitcode: int | None = None


class LaunchError(HipipeError):
    """Some ranks failed or did not finish in time; the message names them."""

    def __init__(self, message: str, outcomes: Sequence[RankOutcome]) -> None:
        super().__init__(message)
        self.outcomes = tuple(outcomes)


def _child(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    env: dict[str, str],
) -> None:
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    outcome: tuple[Any, ...]
    try:
        store = dist.TCPStore(
            LOOPBACK, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s)
        )
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        value = fn(rank, world_size, *args)
        outcome = (rank, True, value, "", "")
    except BaseException as exc:
        lines = str(exc).strip().splitlines()
        summary = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        outcome = (rank, False, None, summary, traceback.format_exc())
    results.put(outcome)
    try:
        if outcome[1] and dist.is_initialized():
            dist.destroy_process_group()
    finally:
        # A failed rank may have Gloo threads blocked on dead peers: leave without waiting for them.
        results.close()
        results.join_thread()
        os._exit(0 if outcome[1] else 1)


def spawn(
    fn: Callable[..., Any],
    nproc: int,
    *,
    args: Sequence[Any] = (),
    timeout_s: float = 120.0,
    pg_timeout_s: float = 30.0,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
) -> list[RankOutcome]:
    """Run ``fn(rank, nproc, *args)`` in ``nproc`` fresh processes; outcomes in rank order.

    Returns normally even if ranks fail (tests look at every rank's error); raises
    :class:`LaunchError` only when the job as a whole did not end by ``timeout_s``.
    ``fn`` must be importable by name (a module-level function).
    """
    if nproc < 1:
        raise HipipeError(f"--nproc must be >= 1, got {nproc}")
    import torch.distributed as dist

    store = dist.TCPStore(LOOPBACK, 0, nproc, is_master=True, wait_for_workers=False)
    # Fork from a server that imported torch once: start-up drops from ~10 s to ~1 s for 8 ranks
    # on 2 cores. The server keeps the environment it started with, so children get the current one.
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "hipipe.torch"])
    results = context.Queue()
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    processes = [
        context.Process(
            target=_child,
            args=(rank, nproc, store.port, backend, pg_timeout_s, fn, tuple(args), results, child_env),
            name=f"hipipe-rank{rank}",
            daemon=True,
        )
        for rank in range(nproc)
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, RankOutcome] = {}
    deadline_s = time.monotonic() + timeout_s
    try:
        while len(outcomes) < nproc:
            try:
                rank, ok, value, error, details = results.get(timeout=0.2)
                outcomes[rank] = RankOutcome(rank=rank, ok=ok, value=value, error=error, details=details)
                continue
            except queue.Empty:
                pass
            for rank, process in enumerate(processes):
                if rank not in outcomes and process.exitcode is not None:
                    # Exited without reporting: give its message a moment to arrive, then record the death.
                    try:
                        got = results.get(timeout=0.5)
                        outcomes[got[0]] = RankOutcome(
                            rank=got[0], ok=got[1], value=got[2], error=got[3], details=got[4]
                        )
                    except queue.Empty:
                        outcomes[rank] = RankOutcome(
                            rank=rank, ok=False, error=f"process exited with code {process.exitcode}"
                        )
            if time.monotonic() > deadline_s:
                missing = sorted(set(range(nproc)) - set(outcomes))
                raise LaunchError(
                    f"ranks {missing} did not finish within {timeout_s:g} s",
                    [
                        outcomes.get(r, RankOutcome(rank=r, ok=False, error="did not finish"))
                        for r in range(nproc)
                    ],
                )
    finally:
        _reap(processes)
        results.close()
        del store
    return [dataclasses.replace(outcomes[r], exitcode=processes[r].exitcode) for r in range(nproc)]


def _reap(processes: Sequence[Any], grace_s: float = 5.0) -> None:
    """Give every process a moment to exit, then kill the rest by pid."""
    deadline_s = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline_s - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(2.0)


def raise_on_failure(outcomes: Sequence[RankOutcome]) -> list[Any]:
    """The values of a job where every rank must succeed; else one line naming the first failure."""
    failed = [o for o in outcomes if not o.ok]
    if failed:
        first = failed[0]
        ranks = ", ".join(str(o.rank) for o in failed)
        raise LaunchError(f"ranks {ranks} failed; rank {first.rank}: {first.error}", outcomes)
    return [o.value for o in outcomes]
