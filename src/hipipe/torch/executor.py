"""Run a :class:`~hipipe.schedule.Schedule` for real: :class:`HierarchicalCollective`.

One class for the three collectives: the schedule says which one it plans, and the
matching method (:meth:`~HierarchicalCollective.all_reduce`,
:meth:`~HierarchicalCollective.reduce_scatter`, :meth:`~HierarchicalCollective.all_gather`)
takes torch's tensors with torch's layout. All three run the same way on one flat
buffer: the AllReduce on the caller's tensor in place, ReduceScatter and AllGather on a
work buffer laid out by :mod:`hipipe.torch.layout` so that every op is a plain ring
over a contiguous range.

On Gloo, each dim walks its sequence in the schedule's order, in its own thread,
concurrently with the other dims (Gloo runs ops on different process groups in
parallel); an op starts only when its chunk's previous op has finished on this rank.
On CUDA, one thread enqueues every op in one global order instead
(:mod:`hipipe.torch.issuer`), as NCCL requires. Every rank runs
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
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError, ScheduleError
from hipipe.issue_order import issue_order
from hipipe.schedule import Collective, DimGroup, Schedule, validate_layout
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
from hipipe.torch.issuer import OrderedIssue
from hipipe.torch.layout import block_of_rank, coordinates_by_rank, own_block, pack_shards, unpack_shards
from hipipe.torch.threads import CollectiveError, DimThreads, OpPlan

__all__ = [
    "MAX_TAG",
    "CollectiveError",
    "HierarchicalAllReduce",
    "HierarchicalCollective",
    "OpTiming",
    "Trace",
    "element_bounds",
    "trace_to_schedule",
]

MAX_TAG = 2**31 - 1
"""Point-to-point tags are 32-bit signed in torch's Gloo bindings."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTiming:
    """When one op ran on one rank, relative to the start of the collective's call."""

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


class HierarchicalCollective:
    """The collective one schedule plans (AllReduce, ReduceScatter or AllGather), on every rank.

    A drop-in for torch's collective of the same kind: :meth:`all_reduce` (in place,
    also :meth:`run`), :meth:`reduce_scatter` and :meth:`all_gather` take the tensors
    ``all_reduce`` / ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` take, and
    the schedule's ``message_bytes`` is the full per-rank buffer (the AllReduce tensor,
    the ReduceScatter input, the AllGather output).

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

    ``issue``: ``threads`` (one host thread per dim, each walking its sequence: the Gloo
    path), ``ordered`` (one thread enqueues every op in the schedule's global
    :func:`~hipipe.issue_order.issue_order`, each dim on its own CUDA stream, chain
    dependencies as CUDA events: the order NCCL needs to be deadlock-free; on CPU tensors
    it runs the ops serially) or ``auto`` (ordered for CUDA tensors, threads otherwise).

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
        issue: str = "auto",
    ) -> None:
        validate_layout(schedule)
        # Sequences that contradict the chunks' chains would deadlock every rank until the
        # timeout; the simulator's fixed policy finds that now, in one clear line.
        simulate(schedule, policy=Policy.FIXED)
        if collectives not in ("auto", "ring", "native"):
            raise HipipeError(f"collectives must be auto, ring or native, got {collectives!r}")
        if issue not in ("auto", "threads", "ordered"):
            raise HipipeError(f"issue must be auto, threads or ordered, got {issue!r}")
        self.issue = issue
        self._order = issue_order(schedule)
        """The global issue order (same on every rank) the ordered path follows."""
        if (mesh is None) == (groups is None):
            raise HipipeError("give either a DeviceMesh or the per-dimension process groups, not both")
        if timeout_s <= 0:
            raise HipipeError(f"timeout must be positive, got {timeout_s}")
        sizes = schedule.topology.sizes
        world = schedule.topology.num_npus
        if schedule.collective is not Collective.ALL_REDUCE and schedule.message_bytes % world:
            raise HipipeError(
                f"a {schedule.collective.value} of {schedule.message_bytes} bytes does not split into"
                f" {world} equal shards: plan a message of {world} shards of whole elements"
            )
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
        self._blocks: list[list[int]] = []
        """RS/AG: per chunk, the block of its piece each rank ends (AG: starts) with; see layout."""
        if schedule.collective is not Collective.ALL_REDUCE:
            coords = coordinates_by_rank(sizes, rank_at)
            self._blocks = [block_of_rank(sizes, c.order, coords) for c in schedule.chunks]
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
        """Per work-buffer length: what each op does on this rank."""
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

    def _chunk_starts(self, numel: int) -> list[int]:
        """Where each chunk starts in the buffer the ops run on, plus its length.

        AllReduce: the caller's tensor of ``numel`` elements. ReduceScatter/AllGather: the
        work buffer of ``numel`` elements (N shards' worth), chunk j being N slices of
        ``element_bounds`` applied to the shard length (see :mod:`hipipe.torch.layout`).
        """
        if self.schedule.collective is Collective.ALL_REDUCE:
            return element_bounds(self.schedule, numel)
        return [self.world_size * b for b in element_bounds(self.schedule, numel // self.world_size)]

    def _op_plans(self, numel: int) -> list[OpPlan]:
        """Per op, this rank's element range on its wide side (cached per buffer length)."""
        if numel in self._plans:
            return self._plans[numel]
        bounds = self._chunk_starts(numel)
        plans: list[OpPlan | None] = [None] * len(self.schedule.ops)
        for chunk in self.schedule.chunks:
            # pieces[l]: what this rank holds before RS on order[l] (= after AG on it).
            pieces = [(bounds[chunk.index], bounds[chunk.index + 1])]
            for group in chunk.order:
                ring = self.rings[tuple(sorted(group))]
                pieces.append(split(*pieces[-1], ring.size)[ring.position])
            for op in self.schedule.chunk_ops(chunk.index):
                level = self.schedule.op_level(op)
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

    def _expect(self, collective: Collective) -> None:
        """Refuse a call the schedule was not planned for, and any call after a failed run."""
        if self._broken:
            raise CollectiveError(f"this executor failed before and cannot run again ({self._broken})")
        if self.schedule.collective is not collective:
            planned = self.schedule.collective.value
            raise HipipeError(
                f"the schedule plans {planned}, not {collective.value}: call {planned}() or plan a"
                f" {collective.value} schedule (hipipe.plan(..., collective={collective.value!r}))"
            )

    def all_reduce(
        self, tensor: torch.Tensor, op: object = ReduceOp.SUM, trace: bool = False
    ) -> Trace | None:
        """AllReduce ``tensor`` in place across all ranks; return a :class:`Trace` if asked.

        ``op``: ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or the same ``dist.ReduceOp`` members.

        Raises :class:`CollectiveError` (naming the op and the cause) if any op fails or
        the whole run takes longer than ``timeout_s``; never waits longer than that.
        """
        self._expect(Collective.ALL_REDUCE)
        op = parse_reduce_op(op)
        check_dtype(tensor.dtype, op)
        if not tensor.is_contiguous():
            raise HipipeError("the tensor must be contiguous (it is reduced in place)")
        self._check_bytes("the tensor", tensor)
        flat = tensor.view(-1)
        result = self._execute(flat, op, trace)
        if op is ReduceOp.AVG:
            flat.div_(self.world_size)
        return result

    def run(self, tensor: torch.Tensor, op: object = ReduceOp.SUM, trace: bool = False) -> Trace | None:
        """:meth:`all_reduce`, under the name the executor had when AllReduce was all it ran."""
        return self.all_reduce(tensor, op=op, trace=trace)

    def reduce_scatter(
        self, output: torch.Tensor, input: torch.Tensor, op: object = ReduceOp.SUM, trace: bool = False
    ) -> Trace | None:
        """Like ``dist.reduce_scatter_tensor(output, input, op)``: rank r gets the reduced shard r.

        ``input`` (N shards, left unchanged) has the schedule's ``message_bytes``; ``output``
        one shard. Copies: ``input`` into a work buffer of the same size (the input is
        read-only, and the copy is also what puts the shards in the layout the chain
        needs), and this rank's blocks out of it (1/N of the message).
        """
        self._expect(Collective.REDUCE_SCATTER)
        op = parse_reduce_op(op)
        check_dtype(input.dtype, op, action="reduce-scatter")
        self._check_shard_pair(output, input, name="input")
        shards = input.view(self.world_size, -1)
        bounds = element_bounds(self.schedule, shards.shape[1])
        work = torch.empty(input.numel(), dtype=input.dtype, device=input.device)
        pack_shards(work, shards, bounds, self._blocks)
        result = self._execute(work, op, trace)
        mine = output.view(-1)
        for (a, b), where in zip(
            itertools.pairwise(bounds),
            own_block(bounds, self._blocks, self.rank, self.world_size),
            strict=True,
        ):
            mine[a:b].copy_(work[where])
        if op is ReduceOp.AVG:
            mine.div_(self.world_size)
        return result

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, trace: bool = False) -> Trace | None:
        """Like ``dist.all_gather_into_tensor(output, input)``: shard r of ``output`` is rank r's input.

        ``output`` (N shards) has the schedule's ``message_bytes``; any dtype (nothing is
        reduced). Copies: ``input`` into its blocks of a work buffer (1/N of the message)
        and the work buffer, in torch's layout, into ``output``.
        """
        self._expect(Collective.ALL_GATHER)
        self._check_shard_pair(input, output, name="output")
        shard_numel = input.numel()
        bounds = element_bounds(self.schedule, shard_numel)
        work = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
        mine = input.view(-1)
        for (a, b), where in zip(
            itertools.pairwise(bounds),
            own_block(bounds, self._blocks, self.rank, self.world_size),
            strict=True,
        ):
            work[where].copy_(mine[a:b])
        result = self._execute(work, ReduceOp.SUM, trace)
        unpack_shards(output.view(self.world_size, shard_numel), work, bounds, self._blocks)
        return result

    def _check_bytes(self, what: str, tensor: torch.Tensor) -> None:
        size_bytes = tensor.numel() * tensor.element_size()
        if size_bytes != self.schedule.message_bytes:
            raise HipipeError(
                f"the schedule was planned for {self.schedule.message_bytes} bytes,"
                f" {what} has {size_bytes} bytes ({tensor.numel()} x {tensor.dtype})"
            )

    def _check_shard_pair(self, shard: torch.Tensor, wide: torch.Tensor, *, name: str) -> None:
        """torch's rules for the one-shard tensor and the N-shard one, in one line each."""
        if shard.dtype != wide.dtype or shard.device != wide.device:
            raise HipipeError(
                f"output and input must share dtype and device, got {shard.dtype} on {shard.device}"
                f" and {wide.dtype} on {wide.device}"
            )
        if not (shard.is_contiguous() and wide.is_contiguous()):
            raise HipipeError("output and input must be contiguous")
        self._check_bytes(f"the {name}", wide)
        if wide.numel() != self.world_size * shard.numel():
            raise HipipeError(
                f"the {name} has {wide.numel()} elements, which must be {self.world_size} x the"
                f" {shard.numel()} of the one-shard tensor"
            )
        # No check that the two do not overlap: torch's in-place form (the input is this rank's
        # slice of the AllGather output, as FSDP2 passes it) is legal, and both collectives copy
        # their input into the work buffer before they write any output.

    def _execute(self, flat: torch.Tensor, op: ReduceOp, trace: bool) -> Trace | None:
        """Run every op of the schedule on ``flat`` (the tensor or the work buffer)."""
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
        common: dict[str, Any] = {
            "plans": plans,
            "flat": flat,
            "op": op,
            "tag_offset": tag_offset,
            "tag_stride": stride,
            "rank": self.rank,
            "streams": streams,
            "sync_for_trace": trace,
            "deadline_s": time.monotonic() + self.timeout_s,
        }
        state: DimThreads | OrderedIssue
        if self.issue == "ordered" or (self.issue == "auto" and flat.is_cuda):
            state = OrderedIssue(order=self._order, num_dims=len(self.schedule.sequences), **common)
        else:
            state = DimThreads(sequences=self.schedule.sequences, **common)
        try:
            state.execute(self.timeout_s)
        except CollectiveError as exc:
            self._broken = str(exc)
            raise
        if streams is not None:
            for stream in streams:
                torch.cuda.current_stream(flat.device).wait_stream(stream)
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


HierarchicalAllReduce = HierarchicalCollective
"""The executor's first name, kept for the code (and the DDP hook) that uses it."""
