"""Plan a schedule once and give it to every rank.

Every rank of a job needs the same schedule for a message. Planning it on every rank
would cost N times the CPU (the ranks of a testbed share the host) and could, in
principle, differ by a floating-point hair between machines; so rank 0 plans and
broadcasts the JSON. If planning fails on rank 0 every rank must hear it, not wait in
the broadcast until the timeout: the error travels in the same message.
"""

from typing import Any

import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.planners import plan
from hipipe.schedule import Collective, Schedule
from hipipe.topology import Topology


def plan_on_rank0(
    topology: Topology,
    message_bytes: int,
    *,
    planner: str,
    collective: Collective = Collective.ALL_REDUCE,
    num_chunks: int | None = None,
    what: str,
    group: Any = None,
) -> Schedule:
    """The schedule rank 0 of ``group`` (default: the world) planned, on every rank.

    ``what`` names the message in the error every rank raises if planning fails, e.g.
    ``"a 1048576-element gradient bucket"``.
    """
    payload: list[tuple[str, str] | None] = [None]
    source = 0 if group is None else dist.get_global_rank(group, 0)
    if dist.get_rank() == source:
        try:
            schedule = plan(topology, message_bytes, planner, num_chunks=num_chunks, collective=collective)
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
