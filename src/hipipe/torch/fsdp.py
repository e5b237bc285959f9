"""FSDP2 with hipipe's ReduceScatter and AllGather: :func:`use_hipipe`.

Usage, on every rank after ``init_process_group`` and ``fully_shard``::

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    hipipe.torch.fsdp.use_hipipe(model, topology)

torch's ``fully_shard`` modules accept a custom AllGather and ReduceScatter
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``). FSDP calls them
with torch's own layout (``all_gather_into_tensor`` / ``reduce_scatter_tensor``: one flat
buffer of N equal shards, shard r for rank r), which is the layout hipipe's executor
takes, so the adapter only picks the executor for the message. A schedule is planned per
(collective, length, dtype): rank 0 plans and broadcasts (:mod:`hipipe.torch.planning`),
the same way the DDP hook does; FSDP meets the same messages in the same order on every
rank, which makes building executors (a collective step) safe.

The interface's contract: FSDP records an event on its stream right after the call and
ignores ReduceScatter's return value, so both collectives finish before they return
(the data is ready when the event is recorded); AllGather returns ``None``, which FSDP
reads as "not asynchronous".
"""

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipipe.errors import HipipeError
from hipipe.schedule import Collective
from hipipe.topology import Topology
from hipipe.torch.groups import DEFAULT_TIMEOUT_S
from hipipe.torch.planning import ExecutorCache


def check_group(group: Any, topology: Topology) -> None:
    """FSDP's group must be the world the topology describes, in rank order."""
    ranks = dist.get_process_group_ranks(group)
    if ranks != list(range(topology.num_npus)):
        raise HipipeError(
            f"FSDP shards over ranks {ranks[:8]}{'...' if len(ranks) > 8 else ''} but hipipe's topology"
            f" {topology.label()} spans ranks 0..{topology.num_npus - 1}: shard over the whole job"
        )


class HipipeAllGather:
    """FSDP2's ``AllGather`` interface, run by a hipipe AllGather schedule."""

    def __init__(self, executors: ExecutorCache) -> None:
        self.executors = executors

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> None:
        del async_op  # finished on return: FSDP treats None as a synchronous all-gather
        check_group(group, self.executors.topology)
        numel = output_tensor.numel()
        executor = self.executors.executor(
            Collective.ALL_GATHER, numel, output_tensor.dtype, what=f"an FSDP all_gather of {numel} elements"
        )
        executor.all_gather(output_tensor, input_tensor)


class HipipeReduceScatter:
    """FSDP2's ``ReduceScatter`` interface, run by a hipipe ReduceScatter schedule."""

    def __init__(self, executors: ExecutorCache) -> None:
        self.executors = executors

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> None:
        del async_op  # FSDP calls it synchronously and ignores the result
        check_group(group, self.executors.topology)
        numel = input_tensor.numel()
        executor = self.executors.executor(
            Collective.REDUCE_SCATTER,
            numel,
            input_tensor.dtype,
            what=f"an FSDP reduce_scatter of {numel} elements",
        )
        executor.reduce_scatter(output_tensor, input_tensor, op=op)


def _fsdp_interface() -> tuple[type, type, type]:
    """``(FSDPModule, AllGather, ReduceScatter)``, or one clear error on a torch without them."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError:
        raise HipipeError(
            f"torch {torch.__version__} has no FSDP2 custom-collective interface"
            " (FSDPModule.set_custom_all_gather): use torch 2.13 or later"
        ) from None
    if not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        raise HipipeError(
            f"torch {torch.__version__} cannot install custom FSDP2 collectives"
            " (no FSDPModule.set_custom_reduce_scatter): use torch 2.13 or later"
        )
    return FSDPModule, AllGather, ReduceScatter


def use_hipipe(
    model: nn.Module,
    topology: Topology,
    *,
    planner: str = "hipipe",
    groups: Sequence[Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    num_chunks: int | None = None,
    tuned_cache: str | None = None,
) -> ExecutorCache:
    """Make every ``fully_shard`` module of ``model`` gather and reduce with hipipe schedules.

    Call on every rank after ``fully_shard``; the per-dim process groups are made here
    (a collective call) unless given; with ``tuned_cache`` the messages a ``hipipe tune``
    cache knows run their measured-fastest schedule. Returns the shared executors.
    """
    fsdp_module, all_gather_api, reduce_scatter_api = _fsdp_interface()
    if dist.get_world_size() != topology.num_npus:
        raise HipipeError(
            f"the job has {dist.get_world_size()} ranks but the topology {topology.label()}"
            f" has {topology.num_npus} NPUs"
        )
    sharded: list[Any] = [m for m in model.modules() if isinstance(m, fsdp_module)]
    if not sharded:
        raise HipipeError("no module of the model is sharded: call fully_shard on it before use_hipipe")
    executors = ExecutorCache.create(
        topology,
        planner=planner,
        groups=groups,
        timeout_s=timeout_s,
        num_chunks=num_chunks,
        tuned_cache=tuned_cache,
    )
    all_gather_api.register(HipipeAllGather)  # type: ignore[attr-defined]  # ABCMeta.register
    reduce_scatter_api.register(HipipeReduceScatter)  # type: ignore[attr-defined]
    all_gather, reduce_scatter = HipipeAllGather(executors), HipipeReduceScatter(executors)
    for module in sharded:
        try:
            module.set_custom_all_gather(all_gather)
            module.set_custom_reduce_scatter(reduce_scatter)
        except ValueError:
            raise HipipeError(
                f"{type(module).__name__} holds several FSDP parameter groups (a per-parameter mesh):"
                " hipipe's collectives need one group per module"
            ) from None
    return executors
