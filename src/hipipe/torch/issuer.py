"""Issue every op of one run from one thread, in the schedule's global order (the CUDA path).

NCCL asks that every rank enqueue the operations of concurrently used communicators in
one global order, or they may deadlock; per-dim host threads give no such order. Here
the calling thread walks :func:`hipipe.issue_order.issue_order` (identical on every
rank) and only enqueues: each op goes on the CUDA stream of its lowest dim, after
waiting, on the GPU, for the event of its chain predecessor and the last event of each
of its dims. The host never waits between ops (unless a trace asks for real times), so
the dims still overlap on the GPU.

Without streams (CPU tensors, e.g. Gloo) the same loop runs the ops one after another:
a correct but serial execution, useful to test this path where there is no GPU. The
Gloo path of the executor is :class:`~hipipe.torch.threads.DimThreads`.
"""

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch

from hipipe.torch.threads import CollectiveError, OpPlan, RunState, describe, one_line


class OrderedIssue(RunState):
    """One run issued from the caller's thread in ``order``; the same interface as ``DimThreads``."""

    def __init__(self, *, order: Sequence[int], num_dims: int, **setup: Any) -> None:
        super().__init__(**setup)
        self.order = tuple(order)
        self.num_dims = num_dims

    def execute(self, timeout_s: float) -> None:
        """Issue (CUDA) or run (CPU) every op in order; one-line :class:`CollectiveError` on failure."""
        events: list[Any] = [None] * len(self.plans)
        last_on_dim: list[Any] = [None] * self.num_dims
        if self.streams is not None:
            torch.cuda.set_device(self.flat.device)
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.flat.device))
            for stream in self.streams:
                stream.wait_event(ready)  # the caller's writes to the tensor come first
        for index in self.order:
            plan = self.plans[index]
            remaining_s = self.deadline_s - time.monotonic()
            if remaining_s <= 0:
                raise CollectiveError(
                    f"rank {self.rank}: timed out after {timeout_s:g} s before issuing {describe(plan.op)}"
                )
            try:
                self._issue(index, plan, events, last_on_dim, remaining_s)
            except Exception as exc:
                raise CollectiveError(
                    f"rank {self.rank}: {describe(plan.op)} failed: {type(exc).__name__}: {one_line(exc)}"
                ) from exc

    def _issue(
        self, index: int, plan: OpPlan, events: list[Any], last_on_dim: list[Any], remaining_s: float
    ) -> None:
        op = plan.op
        stream = self.streams[min(op.dims)] if self.streams is not None else None
        context: Any = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            if stream is not None:
                # GPU-side waits only: the chain predecessor, and whatever last ran on the op's dims
                # (a multi-dim op runs on its lowest dim's stream, so the others must see it too).
                waits = [last_on_dim[k] for k in op.dims]
                if op.step > 0:
                    waits.append(events[index - 1])
                for event in waits:
                    if event is not None:
                        stream.wait_event(event)
            event = self.run_timed(index, remaining_s, stream)
            if event is not None:
                events[index] = event
                for k in op.dims:
                    last_on_dim[k] = event
