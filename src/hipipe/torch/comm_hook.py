"""A DDP communication hook: ``DistributedDataParallel`` averages gradients with hipipe.

Usage, on every rank after ``init_process_group``::

    state = HipipeHookState.create(topology, planner="hipipe")
    model.register_comm_hook(state, hipipe_hook)

DDP hands the hook one flat gradient bucket at a time, the same buckets in the same
order on every rank. A schedule is planned per bucket size (a schedule is for one
message size) and its executor kept for the next steps; building an executor is
collective, which is safe here because every rank meets the same bucket sizes in the
same order. The result is the mean, as with DDP's default hook.

Buckets are reduced on one background thread, in the order DDP hands them over, so the
backward pass keeps computing while gradients travel (DDP waits for the futures at the
end of backward). One thread, not several: two runs in flight on the same groups would
reuse each other's point-to-point tags.
"""

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hipipe.schedule import Collective
from hipipe.topology import Topology
from hipipe.torch.collectives import ReduceOp
from hipipe.torch.executor import HierarchicalCollective
from hipipe.torch.groups import DEFAULT_TIMEOUT_S
from hipipe.torch.planning import ExecutorCache


@dataclass(kw_only=True)
class HipipeHookState:
    """What the hook needs across steps: the executors (one per bucket) and the worker thread."""

    executors: ExecutorCache
    worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="hipipe-ddp")
    )
    """Runs the buckets one after another, off the backward pass."""

    @classmethod
    def create(
        cls,
        topology: Topology,
        *,
        planner: str = "hipipe",
        groups: Sequence[Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        num_chunks: int | None = None,
        tuned_cache: str | None = None,
    ) -> "HipipeHookState":
        """Make the per-dim groups (collective) unless given; ``tuned_cache``: buckets a
        ``hipipe tune`` cache knows run their measured-fastest schedule."""
        return cls(
            executors=ExecutorCache.create(
                topology,
                planner=planner,
                groups=groups,
                timeout_s=timeout_s,
                num_chunks=num_chunks,
                tuned_cache=tuned_cache,
            )
        )

    @property
    def groups(self) -> Sequence[Any]:
        """The per-dim process groups (to share with another state or executor)."""
        return self.executors.groups

    def executor_for(self, tensor: torch.Tensor) -> HierarchicalCollective:
        return self.executors.executor(
            Collective.ALL_REDUCE,
            tensor.numel(),
            tensor.dtype,
            what=f"a {tensor.numel()}-element gradient bucket",
        )


def hipipe_hook(state: HipipeHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one gradient bucket across all ranks with the bucket's schedule.

    Returns at once; the future completes (or carries the error) when the bucket's
    AllReduce ends on the hook's thread. The annotations are what DDP checks a hook's
    signature against.
    """
    tensor = bucket.buffer()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def reduce() -> None:
        try:
            state.executor_for(tensor).run(tensor, op=ReduceOp.AVG)
        except Exception as exc:
            future.set_exception(exc)  # type: ignore[arg-type]  # torch's stub types it as the result
        else:
            future.set_result(tensor)

    state.worker.submit(reduce)
    return future
