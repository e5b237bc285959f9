"""The threads that run one AllReduce: one per dim, each walking its sequence.

Split from :mod:`hipipe.torch.executor`, which decides *what* each op does on this
rank (:class:`OpPlan`); this module decides *when*: an op starts once its chunk's
previous op has ended (any dim) and its dim's previous op has ended (same thread).
Errors in any thread end the run on the caller with the op named; the deadline is
enforced by the caller's wait, so a stuck transfer can never hang the caller.
"""

import contextlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hipipe.errors import HipipeError
from hipipe.schedule import Op, Phase
from hipipe.torch.collectives import (
    ReduceOp,
    native_all_gather,
    native_reduce_scatter,
    ring_all_gather,
    ring_reduce_scatter,
)
from hipipe.torch.groups import Ring


class CollectiveError(HipipeError):
    """The AllReduce failed or timed out on this rank (a peer died, a mismatch, a timeout)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpPlan:
    """What this rank does for one op: the element range on the op's wide side."""

    op: Op
    ring: Ring
    start: int
    stop: int
    native: bool
    """Use the backend's own collective (NCCL) rather than the isend/irecv ring."""


class _Progress:
    """Shared state of one run: done flags, arrivals at multi-dim ops, the first error."""

    def __init__(self, num_ops: int, deadline_s: float) -> None:
        self.cond = threading.Condition()
        self.done = [False] * num_ops
        self.arrived = [0] * num_ops
        self.error: BaseException | None = None
        self.finished_dims = 0
        self.waiting_on: dict[int, str] = {}
        self.deadline_s = deadline_s

    def wait_for(self, dim: int, what: str, ready: Callable[[], bool]) -> None:
        """Block until ``ready()``; raise if another thread failed or the deadline passed."""
        with self.cond:
            self.waiting_on[dim] = what
            while not ready():
                if self.error is not None:
                    raise _Aborted
                remaining_s = self.deadline_s - time.monotonic()
                if remaining_s <= 0:
                    raise TimeoutError(f"waited for {what}")
                self.cond.wait(remaining_s)
            self.waiting_on.pop(dim, None)

    def wait_done(self, dim: int, what: str, index: int) -> None:
        self.wait_for(dim, what, lambda: self.done[index])

    def wait_arrived(self, dim: int, what: str, index: int, count: int) -> None:
        self.wait_for(dim, what, lambda: self.arrived[index] >= count)

    def mark_done(self, index: int) -> None:
        with self.cond:
            self.done[index] = True
            self.cond.notify_all()

    def mark_arrived(self, index: int) -> None:
        with self.cond:
            self.arrived[index] += 1
            self.cond.notify_all()

    def fail(self, error: BaseException, message: str, failures: list[str]) -> None:
        """Record the first error only: it is the cause, later ones are its echoes."""
        with self.cond:
            if self.error is None:
                self.error = error
                failures.append(message)
            self.cond.notify_all()

    def finish_dim(self) -> None:
        with self.cond:
            self.finished_dims += 1
            self.cond.notify_all()


class _Aborted(Exception):
    """Another dim's thread failed first; this one just stops."""


class RunState:
    """One run of a schedule on this rank: what both ways of issuing its ops share.

    :class:`DimThreads` (one thread per dim, Gloo) and
    :class:`~hipipe.torch.issuer.OrderedIssue` (one thread in the global issue order,
    CUDA) differ in who waits for what; running one op and recording its times is the
    same in both (:meth:`run_timed`).
    """

    def __init__(
        self,
        *,
        plans: list[OpPlan],
        flat: torch.Tensor,
        op: ReduceOp,
        tag_offset: int,
        tag_stride: int,
        rank: int,
        streams: list[Any] | None,
        sync_for_trace: bool,
        deadline_s: float,
    ) -> None:
        self.plans = plans
        self.flat = flat
        self.op = op
        self.tag_offset = tag_offset
        self.tag_stride = tag_stride
        self.rank = rank
        self.streams = streams
        self.sync_for_trace = sync_for_trace
        self.deadline_s = deadline_s
        self.starts_s = [0.0] * len(plans)
        self.ends_s = [0.0] * len(plans)
        self.t0 = time.perf_counter()

    def run_timed(self, index: int, remaining_s: float, stream: Any) -> Any:
        """Run op ``index``'s transfers and record its host times; on CUDA (``stream`` given)
        return the event recorded on ``stream`` after it, else None."""
        self.starts_s[index] = time.perf_counter() - self.t0
        plan = self.plans[index]
        run_plan(plan, self.flat, self.op, self.tag_offset + index * self.tag_stride, remaining_s)
        event = None
        if stream is not None:
            event = torch.cuda.Event()
            event.record(stream)
            if self.sync_for_trace:
                event.synchronize()  # host times mean nothing until the GPU is done
        self.ends_s[index] = time.perf_counter() - self.t0
        return event


class DimThreads(RunState):
    """One run in flight: one thread per dim walks its sequence (see module docstring)."""

    def __init__(self, *, sequences: Sequence[Sequence[int]], **setup: Any) -> None:
        super().__init__(**setup)
        self.sequences = sequences
        self.progress = _Progress(len(self.plans), self.deadline_s)
        self.failure: list[str] = []
        # CUDA only: the caller's stream state at the start, and each op's completion event.
        self.ready = None
        self.events: list[Any] = [None] * len(self.plans)
        if self.streams is not None:
            self.ready = torch.cuda.Event()
            self.ready.record(torch.cuda.current_stream(self.flat.device))

    def execute(self, timeout_s: float) -> None:
        """Start the dims' threads and wait for all of them, the first error, or the deadline."""
        progress = self.progress
        threads = [
            threading.Thread(target=self.walk, args=(k,), name=f"hipipe-dim{k}", daemon=True)
            for k in range(len(self.sequences))
        ]
        for thread in threads:
            thread.start()
        with progress.cond:
            while progress.finished_dims < len(threads) and progress.error is None:
                remaining_s = progress.deadline_s - time.monotonic()
                if remaining_s <= 0:
                    waits = "; ".join(
                        f"dim {k} waits for {w}" for k, w in sorted(progress.waiting_on.items())
                    )
                    message = f"rank {self.rank}: AllReduce timed out after {timeout_s:g} s ({waits or 'in transfer'})"
                    # Threads between ops stop at their next wait instead of carrying on.
                    progress.error = TimeoutError(message)
                    progress.cond.notify_all()
                    raise CollectiveError(message)
                progress.cond.wait(remaining_s + 0.05)
            if progress.error is not None:
                # Threads still blocked in a transfer are daemons: they end with the process group.
                raise CollectiveError(self.failure[0]) from progress.error
        for thread in threads:
            thread.join()

    def walk(self, dim: int) -> None:
        """Thread body for one dim: its sequence, in order, each op after its chain predecessor."""
        progress = self.progress
        current: Op | None = None
        try:
            if self.streams is not None:
                torch.cuda.set_device(self.flat.device)
                stream = self.streams[dim]
                stream.wait_event(self.ready)
                context: Any = torch.cuda.stream(stream)
            else:
                context = contextlib.nullcontext()
            with context:
                for index in self.sequences[dim]:
                    current = self.plans[index].op
                    if dim != min(current.dims):
                        # Another dim's thread runs this multi-dim op; this dim is busy until it ends.
                        progress.mark_arrived(index)
                        progress.wait_done(dim, f"{describe(current)} to end", index)
                        continue
                    if current.step > 0:
                        progress.wait_done(dim, f"op {index - 1} before {describe(current)}", index - 1)
                    others = len(current.dims) - 1
                    if others:
                        progress.wait_arrived(
                            dim, f"dims {current.dims} to reach {describe(current)}", index, others
                        )
                    self.run_op(index)
                    progress.mark_done(index)
        except _Aborted:
            pass
        except BaseException as exc:
            where = describe(current) if current is not None else f"dim {dim}"
            progress.fail(
                exc, f"rank {self.rank}: {where} failed: {type(exc).__name__}: {one_line(exc)}", self.failure
            )
        finally:
            progress.finish_dim()

    def run_op(self, index: int) -> None:
        plan = self.plans[index]
        op = plan.op
        remaining_s = self.progress.deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError("no time left before the deadline")
        stream = torch.cuda.current_stream(self.flat.device) if self.streams is not None else None
        if stream is not None and op.step > 0:
            stream.wait_event(self.events[index - 1])
        self.events[index] = self.run_timed(index, remaining_s, stream)


def run_plan(plan: OpPlan, flat: torch.Tensor, op: ReduceOp, tag_base: int, timeout_s: float) -> None:
    """Do one op's transfers on ``flat``: its RS or AG over its ring, on its element range."""
    ring, start, stop = plan.ring, plan.start, plan.stop
    if plan.op.phase is Phase.RS and plan.native:
        native_reduce_scatter(flat, ring, start=start, stop=stop, op=op, timeout_s=timeout_s)
    elif plan.op.phase is Phase.RS:
        ring_reduce_scatter(flat, ring, start=start, stop=stop, op=op, tag_base=tag_base, timeout_s=timeout_s)
    elif plan.native:
        native_all_gather(flat, ring, start=start, stop=stop, timeout_s=timeout_s)
    else:
        ring_all_gather(flat, ring, start=start, stop=stop, tag_base=tag_base, timeout_s=timeout_s)


def describe(op: Op) -> str:
    """An op as error messages name it."""
    return f"op {op.index} (chunk {op.chunk} step {op.step}: {op.phase.value} on dims {op.dims})"


def one_line(exc: BaseException) -> str:
    """First line of an error, without the ``[/path/to/gloo/pair.cc:553] `` source prefix."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return re.sub(r"^\[[^\]]*:\d+\]\s*", "", text)
