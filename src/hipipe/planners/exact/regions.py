"""One region of a split exact MIP, solved here or in worker processes.

Why worker processes: the regions of a first-dims split (and of its refinements) are
independent MIPs, and HiGHS' branch and bound runs on one core whatever its ``threads``
option, so a floor proof on an idle 2-core host used half of it. Each worker is a Python
process of its own running :func:`serve`, not a ``multiprocessing`` child: spawn would re-run the caller's ``__main__`` (a script without the main guard starts
workers of its own), and fork copies HiGHS' thread pool without its threads.

The protocol is pickles over pipes, each one prefixed by its length: the parent sends
``(model, settings, prefixes, limit_s, cutoff)`` and reads back a :class:`RegionResult` or
the exception the solve raised. A worker's own stdout is the protocol channel; anything else
written to file descriptor 1 (a C library's banner) goes to stderr instead.
"""

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from typing import IO, Any, Generic, TypeVar

import highspy
import numpy as np

import hipipe
from hipipe.errors import HipipeError
from hipipe.planners.exact.model import ExactModel, Order, hold_order_prefixes, new_solver, solver_values

_LENGTH = struct.Struct(">Q")
Tag = TypeVar("Tag")


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionResult:
    """What one region's MIP returned."""

    settled: bool
    """Pruned, infeasible or solved to optimality."""
    dual_bound: float
    values: np.ndarray | None
    """Its best solution if below the cutoff it was given, else None."""
    nodes: int


def solve_region(
    model: ExactModel, settings: Mapping[str, Any], prefixes: Sequence[Order], limit_s: float, cutoff: float
) -> RegionResult:
    """Solve ``model`` with chunk j's order held to begin with ``prefixes[j]``, looking only
    below ``cutoff`` (HiGHS' ``objective_bound``) for at most ``limit_s``."""
    solver = new_solver(model, {**settings, "time_limit": limit_s, "objective_bound": cutoff})
    hold_order_prefixes(solver, model, prefixes)
    solver.run()
    status = solver.getModelStatus()
    info = solver.getInfo()
    values = None
    if int(info.primal_solution_status) != 0:
        found = solver_values(solver)
        if float(found[model.makespan_col]) < cutoff:
            values = found
    return RegionResult(
        settled=status in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible),
        dual_bound=float(info.mip_dual_bound),
        values=values,
        nodes=int(info.mip_node_count),
    )


def _send(stream: IO[bytes], payload: object) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> object | None:
    """The next pickle on ``stream``; None at its end."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    data = stream.read(_LENGTH.unpack(header)[0])
    return pickle.loads(data)


class RegionRunner(Generic[Tag]):
    """Runs :func:`solve_region` calls, here (``jobs = 1``) or in ``jobs`` worker processes,
    and hands back each result with the tag it was submitted with, in the order they finish.

    Use as a context manager: leaving it kills the workers, so an early stop (a schedule
    found below a floor, the deadline) does not wait for the MIPs still running.
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.running = 0
        self._finished: SimpleQueue[tuple[int, Any, object]] = SimpleQueue()
        self._idle: list[int] = []
        self._workers: list[subprocess.Popen[bytes]] = []
        self._readers: list[threading.Thread] = []
        self._tags: dict[int, Any] = {}

    def __enter__(self) -> "RegionRunner[Tag]":
        try:
            for index in range(self.jobs if self.jobs > 1 else 0):
                worker = subprocess.Popen(
                    [sys.executable, "-c", f"from {__name__} import serve; serve()"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=_worker_environment(),
                )
                self._workers.append(worker)
                reader = threading.Thread(target=self._read, args=(index,), daemon=True)
                reader.start()
                self._readers.append(reader)
                self._idle.append(index)
        except BaseException:
            self.__exit__()  # the workers already started must not outlive a failed start
            raise
        return self

    def _read(self, index: int) -> None:
        """Forward worker ``index``'s results to the queue until its output ends."""
        worker = self._workers[index]
        assert worker.stdout is not None
        while (result := _receive(worker.stdout)) is not None:
            self._finished.put((index, None, result))
        self._finished.put((index, None, None))

    def submit(self, tag: Tag, args: tuple[Any, ...]) -> None:
        """Start ``solve_region(*args)``; at most ``jobs`` may run at once."""
        if self.running >= self.jobs:
            raise RuntimeError("every worker is busy: take a result first")
        if not self._workers:
            self._finished.put((-1, tag, solve_region(*args)))
            self.running += 1
            return
        index = self._idle.pop()
        worker = self._workers[index]
        assert worker.stdin is not None
        try:
            _send(worker.stdin, args)
        except OSError as error:  # the worker is gone
            raise HipipeError(
                f"an exact-MIP worker process is gone (exit code {worker.poll()}): {error}"
            ) from None
        self._tags[index] = tag
        self.running += 1

    def next_result(self) -> tuple[Tag, RegionResult]:
        """The next result to finish, with its tag; a worker's error is raised here."""
        index, tag, result = self._finished.get()
        self.running -= 1
        if index >= 0:
            tag = self._tags.pop(index, None)
            self._idle.append(index)
            if result is None:  # the worker's output ended
                code = self._workers[index].wait()
                raise HipipeError(f"an exact-MIP worker process ended without an answer (exit code {code})")
        if isinstance(result, BaseException):
            raise result
        if not isinstance(result, RegionResult):
            raise HipipeError(f"an exact-MIP worker process answered {type(result).__name__}, not a result")
        return tag, result

    def __exit__(self, *exc: object) -> None:
        for worker in self._workers:
            worker.kill()
            worker.wait()
            with contextlib.suppress(OSError):  # a task half-sent to a dead worker
                assert worker.stdin is not None
                worker.stdin.close()
        for reader in self._readers:
            reader.join()  # each saw its worker's output end
        for worker in self._workers:
            assert worker.stdout is not None
            worker.stdout.close()


def _worker_environment() -> dict[str, str]:
    """The caller's environment, with the directory this hipipe was imported from first on
    the path: a worker must run the same code as its parent."""
    root = str(Path(hipipe.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else os.pathsep.join((root, path))}


def serve() -> None:
    """A worker's loop: solve each region sent on stdin, answer on the original stdout."""
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray writes to stdout (C libraries) must not corrupt the channel
    while (task := _receive(sys.stdin.buffer)) is not None:
        try:
            answer: object = solve_region(*task)  # type: ignore[misc]
        except Exception as error:  # sent back and raised in the parent
            answer = error
        _send(channel, answer)
