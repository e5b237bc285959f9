"""Plan a schedule once and give it to every rank.

Every rank of a job needs the same schedule for a message. Planning it on every rank
would cost N times the CPU (the ranks of a testbed share the host) and could, in
principle, differ by a floating-point hair between machines; so rank 0 plans and
broadcasts the JSON. If planning fails on rank 0 every rank must hear it, not wait in
the broadcast until the timeout: the error travels in the same message.

With a tuning cache (``hipipe tune``), rank 0 first looks the message up there and
sends the measured-fastest schedule when the cache has one; messages the cache does not
know are planned. Which of the two happened is in the schedule's ``info["source"]``.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.planners import plan
from hipipe.schedule import Collective, Schedule
from hipipe.topology import Topology
from hipipe.torch.executor import HierarchicalCollective
from hipipe.torch.groups import DEFAULT_TIMEOUT_S, dimension_groups
from hipipe.tuning.cache import load_tuned


def plan_on_rank0(
    topology: Topology,
    message_bytes: int,
    *,
    planner: str,
    collective: Collective = Collective.ALL_REDUCE,
    num_chunks: int | None = None,
    what: str,
    group: Any = None,
    tuned_cache: str | Path | None = None,
    dtype: str = "float32",
) -> Schedule:
    """The schedule rank 0 of ``group`` (default: the world) planned, on every rank.

    ``what`` names the message in the error every rank raises if planning fails, e.g.
    ``"a 1048576-element gradient bucket"``. ``tuned_cache`` and ``dtype``: look the
    message up in a ``hipipe tune`` cache first.
    """
    payload: list[tuple[str, str] | None] = [None]
    source = 0 if group is None else dist.get_global_rank(group, 0)
    if dist.get_rank() == source:
        try:
            tuned = None
            if tuned_cache is not None:
                tuned = load_tuned(tuned_cache, topology, collective, message_bytes, dtype)
            if tuned is not None:
                schedule = replace(tuned, info={**tuned.info, "source": f"tuned ({tuned_cache})"})
            else:
                schedule = plan(
                    topology, message_bytes, planner, num_chunks=num_chunks, collective=collective
                )
                schedule = replace(schedule, info={**schedule.info, "source": f"planned ({planner})"})
            payload[0] = ("schedule", schedule.to_json())
        except HipipeError as exc:
            payload[0] = ("error", str(exc))
    dist.broadcast_object_list(payload, src=source, group=group)
    if payload[0] is None:
        raise HipipeError(f"rank {source} sent no schedule for {what}")
    kind, text = payload[0]
    if kind == "error":
        raise HipipeError(f"planning {what} failed: {text}")
    return Schedule.from_json(text)


@dataclass(kw_only=True)
class ExecutorCache:
    """Executors by (collective, buffer length, dtype), each schedule planned once.

    What the DDP hook and the FSDP2 collectives share: training meets the same few
    message sizes at every step, in the same order on every rank, so each is planned (or
    looked up in a tuning cache) by rank 0 the first time, and its executor kept. Building
    an executor is collective, which that same order makes safe.
    """

    topology: Topology
    planner: str
    groups: Sequence[Any]
    timeout_s: float = DEFAULT_TIMEOUT_S
    num_chunks: int | None = None
    tuned_cache: str | None = None
    """A ``hipipe tune`` cache: messages it knows run their measured-fastest schedule."""
    executors: dict[tuple[Collective, int, Any], HierarchicalCollective] = field(default_factory=dict)

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
    ) -> "ExecutorCache":
        """Make the per-dim process groups (a collective call on every rank) unless given."""
        if groups is None:
            groups = dimension_groups(topology.sizes, timeout_s=timeout_s)
        return cls(
            topology=topology,
            planner=planner,
            groups=groups,
            timeout_s=timeout_s,
            num_chunks=num_chunks,
            tuned_cache=tuned_cache,
        )

    def executor(
        self, collective: Collective, numel: int, dtype: Any, *, what: str
    ) -> HierarchicalCollective:
        """The executor for a full buffer of ``numel`` elements of ``dtype`` (``what`` names it in errors)."""
        key = (collective, numel, dtype)
        if key not in self.executors:
            import torch

            schedule = plan_on_rank0(
                self.topology,
                numel * torch.empty((), dtype=dtype).element_size(),
                planner=self.planner,
                collective=collective,
                num_chunks=self.num_chunks,
                what=what,
                tuned_cache=self.tuned_cache,
                dtype=str(dtype).removeprefix("torch."),
            )
            self.executors[key] = HierarchicalCollective(
                None, schedule, groups=self.groups, timeout_s=self.timeout_s, check_peers=False
            )
        return self.executors[key]
