"""Run a :class:`~hipipe.schedule.Schedule` for real: :class:`HierarchicalAllReduce`.

Each dim walks its sequence in the schedule's order, in its own thread, concurrently
with the other dims (Gloo runs ops on different process groups in parallel); an op
starts only when its chunk's previous op has finished on this rank. Every rank runs
the same schedule, so the ranks of a group meet in the same ops in the same order.

An op over several dims (the flat ``ring`` baseline) sits in the sequence of each of
them: the thread of its lowest dim runs it once the other dims' threads have reached
it, and those wait for it to end, as the simulator's ``fixed`` policy times it.

Chunk byte sizes become element ranges by rounding the cumulative byte offsets to
whole elements (:func:`element_bounds`): boundaries are monotone and the ranges
partition the tensor exactly, whatever the dtype, length or chunk sizes. Inside an op,
the current piece is split into n near-equal parts (:func:`~hipipe.torch.collectives.split`).
"""

import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError, ScheduleError
from hipipe.schedule import DimGroup, Phase, Schedule, validate_layout
from hipipe.simulator import Policy, simulate
from hipipe.torch.collectives import ReduceOp, check_dtype, parse_reduce_op, split
from hipipe.torch.groups import (
    DEFAULT_TIMEOUT_S,
    Ring,
    add_missing_rings,
    layout_rank,
    mesh_rank,
    rings_for_layout,
    rings_from_mesh,
)
from hipipe.torch.threads import CollectiveError, DimThreads, OpPlan

__all__ = [
    "MAX_TAG",
    "CollectiveError",
    "HierarchicalAllReduce",
    "OpTiming",
    "Trace",
    "element_bounds",
    "trace_to_schedule",
]

MAX_TAG = 2**31 - 1
"""Point-to-point tags are 32-bit signed in torch's Gloo bindings."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTiming:
    """When one op ran on one rank, relative to the start of :meth:`HierarchicalAllReduce.run`."""

    index: int
    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Trace:
    """Measured op times of one run on one rank (``ops[i]`` is op ``i``)."""

    rank: int
    ops: tuple[OpTiming, ...]
    total_s: float


def element_bounds(schedule: Schedule, numel: int) -> list[int]:
    """Element index where each chunk starts, plus ``numel`` at the end.

    Cumulative byte offsets scaled to the tensor's length and rounded, so chunks of any
    float size map to whole elements, no element is lost or counted twice, and every
    rank computes the same split.
    """
    total_bytes = sum(c.size_bytes for c in schedule.chunks)
    bounds = [0]
    for offset_bytes in schedule.chunk_offsets_bytes()[1:]:
        at = round(offset_bytes * numel / total_bytes) if total_bytes > 0 else 0
        bounds.append(min(numel, max(bounds[-1], at)))
    bounds.append(numel)
    return bounds


def trace_to_schedule(schedule: Schedule, trace: Trace) -> Schedule:
    """The schedule with measured op times, so a Gantt chart can draw it beside the plan."""
    if len(trace.ops) != len(schedule.ops):
        raise ScheduleError(f"the trace has {len(trace.ops)} ops, the schedule {len(schedule.ops)}")
    ops = tuple(
        dataclasses.replace(op, start_s=t.start_s, end_s=t.end_s)
        for op, t in zip(schedule.ops, trace.ops, strict=True)
    )
    return dataclasses.replace(
        schedule,
        ops=ops,
        makespan_s=max((t.end_s for t in trace.ops), default=0.0),
        info={**dict(schedule.info), "measured": True, "rank": trace.rank},
    )


class HierarchicalAllReduce:
    """In-place AllReduce of a flat tensor that follows one schedule, on every rank.

    Give either a ``DeviceMesh`` whose mesh dim k is topology dim k, or ``groups``: one
    process group per dim in the topology layout (dim 0 fastest; see
    :func:`~hipipe.torch.groups.dimension_groups`), or a mapping from dim groups to
    process groups. Groups for multi-dim ops missing from them are created here, which
    is collective: construct the executor on every rank with the same schedule. The
    constructor also checks that all ranks hold the same schedule, so a mismatch fails
    at once on every rank instead of deadlocking later.

    ``collectives``: ``ring`` (exact isend/irecv rings), ``native`` (the backend's own
    ReduceScatter/AllGather) or ``auto`` (native on NCCL, rings elsewhere: Gloo's own
    ReduceScatter moves twice the bytes).

    One :meth:`run` at a time per set of groups: runs derive their point-to-point tags
    from op indices, so two runs in flight on the same groups (from two threads, or two
    executors) could take each other's messages.
    """

    def __init__(
        self,
        mesh: Any | None,
        schedule: Schedule,
        *,
        groups: Sequence[Any] | Mapping[DimGroup, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backend: str | None = None,
        check_peers: bool = True,
        collectives: str = "auto",
    ) -> None:
        validate_layout(schedule)
        # Sequences that contradict the chunks' chains would deadlock every rank until the
        # timeout; the simulator's fixed policy finds that now, in one clear line.
        simulate(schedule, policy=Policy.FIXED)
        if collectives not in ("auto", "ring", "native"):
            raise HipipeError(f"collectives must be auto, ring or native, got {collectives!r}")
        if (mesh is None) == (groups is None):
            raise HipipeError("give either a DeviceMesh or the per-dimension process groups, not both")
        if timeout_s <= 0:
            raise HipipeError(f"timeout must be positive, got {timeout_s}")
        sizes = schedule.topology.sizes
        rank_at: Callable[[tuple[int, ...]], int]
        if mesh is not None:
            rings = rings_from_mesh(mesh, sizes)
            rank_at = mesh_rank(mesh)
        else:
            assert groups is not None
            rings = rings_for_layout(sizes, dict(groups) if isinstance(groups, Mapping) else list(groups))
            rank_at = layout_rank(sizes)
        self.schedule = schedule
        self.timeout_s = timeout_s
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if check_peers:
            # Before any group is created: ranks with different schedules would create different groups.
            self._check_same_schedule()
        needed = sorted({tuple(sorted(g)) for c in schedule.chunks for g in c.order})
        self.rings: dict[DimGroup, Ring] = add_missing_rings(
            rings, needed, sizes, rank_at, backend=backend, timeout_s=timeout_s
        )
        self._runs = 0
        self._broken = ""
        """Why an earlier run failed: its threads may still hold transfers, so no run may follow."""
        self._plans: dict[int, list[OpPlan]] = {}
        self._streams: dict[str, list[Any]] = {}
        self._native = {
            dims: collectives == "native"
            or (collectives == "auto" and dist.get_backend(ring.group) == "nccl")
            for dims, ring in self.rings.items()
        }

    def _check_same_schedule(self) -> None:
        """All ranks must run the same schedule; compare a digest over the world."""
        digest = hashlib.sha256(self.schedule.to_json().encode()).digest()
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        mine = torch.tensor([int.from_bytes(digest[:7], "little")], dtype=torch.int64, device=device)
        everyone = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine)
        differ = [r for r, t in enumerate(everyone) if int(t.item()) != int(mine.item())]
        if differ:
            raise HipipeError(
                f"rank {self.rank}: ranks {differ} hold a different schedule; every rank must run the same one"
            )

    def _op_plans(self, numel: int) -> list[OpPlan]:
        """Per op, this rank's element range on its wide side (cached per tensor length)."""
        if numel in self._plans:
            return self._plans[numel]
        bounds = element_bounds(self.schedule, numel)
        plans: list[OpPlan | None] = [None] * len(self.schedule.ops)
        for chunk in self.schedule.chunks:
            pieces = [(bounds[chunk.index], bounds[chunk.index + 1])]
            for group in chunk.order:
                ring = self.rings[tuple(sorted(group))]
                pieces.append(split(*pieces[-1], ring.size)[ring.position])
            levels = len(chunk.order)
            for op in self.schedule.chunk_ops(chunk.index):
                level = op.step if op.phase is Phase.RS else 2 * levels - 1 - op.step
                ring = self.rings[tuple(sorted(op.dims))]
                plans[op.index] = OpPlan(
                    op=op,
                    ring=ring,
                    start=pieces[level][0],
                    stop=pieces[level][1],
                    native=self._native[ring.dims],
                )
        assert all(p is not None for p in plans)
        self._plans[numel] = [p for p in plans if p is not None]
        return self._plans[numel]

    def run(self, tensor: torch.Tensor, op: object = ReduceOp.SUM, trace: bool = False) -> Trace | None:
        """AllReduce ``tensor`` in place across all ranks; return a :class:`Trace` if asked.

        ``op``: ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or the same ``dist.ReduceOp`` members.

        Raises :class:`CollectiveError` (naming the op and the cause) if any op fails or
        the whole run takes longer than ``timeout_s``; never waits longer than that.
        """
        if self._broken:
            raise CollectiveError(f"this executor failed before and cannot run again ({self._broken})")
        op = parse_reduce_op(op)
        check_dtype(tensor.dtype, op)
        if not tensor.is_contiguous():
            raise HipipeError("the tensor must be contiguous (it is reduced in place)")
        size_bytes = tensor.numel() * tensor.element_size()
        if size_bytes != self.schedule.message_bytes:
            raise HipipeError(
                f"the schedule was planned for {self.schedule.message_bytes} bytes,"
                f" the tensor has {size_bytes} bytes ({tensor.numel()} x {tensor.dtype})"
            )
        flat = tensor.view(-1)
        plans = self._op_plans(flat.numel())
        # Tags: op index x ring step, alternating between two ranges on successive runs so
        # that a fast rank's next run never matches a slow rank's messages of this one.
        stride = self.world_size
        tag_offset = (self._runs % 2) * len(plans) * stride
        if 2 * len(plans) * stride > MAX_TAG:
            raise HipipeError(
                f"{len(plans)} ops on {stride} ranks need more point-to-point tags than Gloo has"
            )
        self._runs += 1
        streams = self._cuda_streams(flat) if flat.is_cuda else None
        state = DimThreads(
            plans=plans,
            sequences=self.schedule.sequences,
            flat=flat,
            op=op,
            tag_offset=tag_offset,
            tag_stride=stride,
            rank=self.rank,
            streams=streams,
            sync_for_trace=trace,
            deadline_s=time.monotonic() + self.timeout_s,
        )
        try:
            state.execute(self.timeout_s)
        except CollectiveError as exc:
            self._broken = str(exc)
            raise
        if streams is not None:
            for stream in streams:
                torch.cuda.current_stream(flat.device).wait_stream(stream)
        if op is ReduceOp.AVG:
            flat.div_(self.world_size)
        if not trace:
            return None
        return Trace(
            rank=self.rank,
            ops=tuple(
                OpTiming(index=i, start_s=state.starts_s[i], end_s=state.ends_s[i]) for i in range(len(plans))
            ),
            total_s=time.perf_counter() - state.t0,
        )

    def _cuda_streams(self, flat: torch.Tensor) -> list[Any]:
        """One CUDA stream per dim, so that the dims' ops overlap on the GPU too."""
        key = str(flat.device)
        if key not in self._streams:
            self._streams[key] = [torch.cuda.Stream(flat.device) for _ in self.schedule.sequences]
        return self._streams[key]
