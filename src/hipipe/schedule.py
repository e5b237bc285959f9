"""The one output type of every planner: a :class:`Schedule`.

A schedule is the collective it performs, the chunks (size, dimension order), their
ops with start/end times, and for each dimension the sequence of ops it runs. Ops are
numbered chunk-major: the ops of chunk 0 in chain order, then chunk 1, ...
(:meth:`Schedule.op_index`). An entry of ``order`` is a *group* of dimensions: a single
dimension for the hierarchical algorithms, several for a flat ring spanning them.

A chunk's chain depends on the collective (:func:`chain`); ``order`` is always read in
ReduceScatter order, so the three collectives share one data layout:

- ``all_reduce``: RS over ``order[0]``, ``order[1]``, ..., then AG over the same groups
  in reverse;
- ``reduce_scatter``: the RS half alone;
- ``all_gather``: the AG half alone (AG over ``order[-1]`` first, ``order[0]`` last).

``message_bytes`` is always the full per-rank buffer (the RS input, the AG output, the
AllReduce buffer). For AllReduce a chunk is a contiguous piece of the buffer, chunks in
index order. For ReduceScatter and AllGather the buffer is N shards of
``message_bytes / N`` bytes, shard r belonging to rank r (as torch's
``reduce_scatter_tensor`` / ``all_gather_into_tensor`` lay them out); chunk j is the same
contiguous slice of *every* shard (the slice starting at ``offset_j / N`` of length
``size_j / N``), so each rank ends the chain holding chunk j's slice of its own shard.
"""

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hipipe.errors import ScheduleError
from hipipe.topology import Topology

DimGroup = tuple[int, ...]
"""Dimensions an op spans (sorted); ``(k,)`` for a hierarchical op on dimension k."""

SCHEDULE_FORMAT = "hipipe.schedule"
SCHEDULE_VERSION = 2
"""Version 2 added the top-level ``"collective"``; version-1 files load as ``all_reduce``."""
SCHEDULE_VERSIONS_READ = (1, 2)


class Collective(StrEnum):
    """What a schedule computes; torch.distributed's names."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"

    @staticmethod
    def parse(value: "Collective | str") -> "Collective":
        """The collective named ``value``; a one-line :class:`ScheduleError` otherwise."""
        try:
            return Collective(str(value).strip().lower().replace("-", "_"))
        except ValueError:
            names = ", ".join(c.value for c in Collective)
            raise ScheduleError(f"unknown collective {value!r} (use {names})") from None

    @property
    def torch_function(self) -> str:
        """The ``torch.distributed`` function computing it on flat tensors (what users compare with)."""
        return {
            Collective.ALL_REDUCE: "all_reduce",
            Collective.REDUCE_SCATTER: "reduce_scatter_tensor",
            Collective.ALL_GATHER: "all_gather_into_tensor",
        }[self]

    @property
    def moves_per_byte(self) -> int:
        """How many of the halves (RS, AG) a byte of the message takes part in: 2 or 1."""
        return 2 if self is Collective.ALL_REDUCE else 1


class Phase(StrEnum):
    """ReduceScatter shrinks a chunk's piece by the group size; AllGather grows it back."""

    RS = "RS"
    AG = "AG"


@dataclass(frozen=True, kw_only=True, slots=True)
class Chunk:
    """A contiguous piece of the message that travels the dimensions as one unit."""

    index: int
    size_bytes: float
    order: tuple[DimGroup, ...]
    """Groups of dimensions in ReduceScatter order; AllGather runs them in reverse."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(tuple(g) for g in self.order))
        if not (math.isfinite(self.size_bytes) and self.size_bytes >= 0):
            raise ScheduleError(f"chunk {self.index}: size must be >= 0, got {self.size_bytes!r}")

    def dims_order(self) -> tuple[int, ...]:
        """The order as a flat tuple of dimensions (for single-dimension groups)."""
        return tuple(k for group in self.order for k in group)


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One ReduceScatter or AllGather of one chunk over one group of dimensions."""

    index: int
    chunk: int
    step: int
    """Position in the chunk's chain: 0 .. 2*len(order)-1."""
    phase: Phase
    dims: DimGroup
    input_bytes: float
    """Per-NPU bytes going in (RS: the wide side)."""
    output_bytes: float
    """Per-NPU bytes coming out (AG: the wide side)."""
    start_s: float
    end_s: float

    @property
    def full_bytes(self) -> float:
        """The wide side of the op, which the cost model charges."""
        return max(self.input_bytes, self.output_bytes)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def chain_length(collective: Collective, num_groups: int) -> int:
    """Ops in the chain of a chunk whose order has ``num_groups`` groups."""
    return collective.moves_per_byte * num_groups


def chain(
    topology: Topology, chunk: Chunk, collective: Collective = Collective.ALL_REDUCE
) -> list[tuple[Phase, DimGroup, float, float]]:
    """The untimed ops of a chunk: ``(phase, dims, input_bytes, output_bytes)`` in order.

    ``input_bytes``/``output_bytes`` are per NPU; the wide side is ``chunk.size_bytes``
    divided by the sizes of the groups visited before (RS) or after (AG) in ``order``.
    """
    sizes = [chunk.size_bytes]
    for group in chunk.order:
        n = math.prod(topology.dims[k].size for k in group)
        sizes.append(sizes[-1] / n)
    ops: list[tuple[Phase, DimGroup, float, float]] = []
    if collective is not Collective.ALL_GATHER:
        for level, group in enumerate(chunk.order):
            ops.append((Phase.RS, group, sizes[level], sizes[level + 1]))
    if collective is not Collective.REDUCE_SCATTER:
        for level in reversed(range(len(chunk.order))):
            ops.append((Phase.AG, chunk.order[level], sizes[level + 1], sizes[level]))
    return ops


@dataclass(frozen=True, kw_only=True, slots=True, eq=True)
class Schedule:
    """Chunks, timed ops, per-dimension op sequences and the makespan."""

    topology: Topology
    message_bytes: int
    planner: str
    chunks: tuple[Chunk, ...]
    ops: tuple[Op, ...]
    sequences: tuple[tuple[int, ...], ...]
    """For each dimension, the indices of the ops it runs, in execution order."""
    makespan_s: float
    collective: Collective = Collective.ALL_REDUCE
    info: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Why the schedule looks the way it does (planner decisions), JSON-serializable."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "collective", Collective.parse(self.collective))

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    def chain_length(self, chunk: int) -> int:
        """Ops in chunk ``chunk``'s chain (2 per group for AllReduce, 1 for RS or AG)."""
        return chain_length(self.collective, len(self.chunks[chunk].order))

    def op_index(self, chunk: int, step: int) -> int:
        """Index of op ``step`` of ``chunk`` (ops are numbered chunk-major)."""
        return _chain_offsets(self.chunks, self.collective)[chunk] + step

    def chunk_ops(self, chunk: int) -> tuple[Op, ...]:
        start = _chain_offsets(self.chunks, self.collective)[chunk]
        return self.ops[start : start + self.chain_length(chunk)]

    def op_level(self, op: Op) -> int:
        """Position of ``op``'s group in its chunk's order (0 = the group RS visits first)."""
        return self.chunks[op.chunk].order.index(op.dims)

    def ops_on(self, dim: int) -> Iterator[Op]:
        """Ops that dimension ``dim`` runs, in its sequence order."""
        return (self.ops[i] for i in self.sequences[dim])

    def chunk_offsets_bytes(self) -> list[float]:
        """Start of each chunk in the message: chunks are laid out in index order."""
        offsets = [0.0]
        for c in self.chunks[:-1]:
            offsets.append(offsets[-1] + c.size_bytes)
        return offsets

    def to_json(self) -> str:
        """Versioned JSON; byte-identical for the same schedule."""
        return json.dumps(schedule_to_dict(self), indent=1, allow_nan=False) + "\n"

    @staticmethod
    def from_json(text: str) -> "Schedule":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"schedule is not valid JSON: {exc}") from None
        return schedule_from_dict(data)


def _chain_offsets(chunks: Sequence[Chunk], collective: Collective) -> list[int]:
    offsets = [0]
    for c in chunks:
        offsets.append(offsets[-1] + chain_length(collective, len(c.order)))
    return offsets


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    from hipipe.topology_io import topology_to_dict

    return {
        "format": SCHEDULE_FORMAT,
        "version": SCHEDULE_VERSION,
        "collective": schedule.collective.value,
        "planner": schedule.planner,
        "message_bytes": schedule.message_bytes,
        "makespan_s": schedule.makespan_s,
        "topology": topology_to_dict(schedule.topology),
        "chunks": [
            {"size_bytes": c.size_bytes, "order": [list(g) for g in c.order]} for c in schedule.chunks
        ],
        "ops": [
            {
                "chunk": o.chunk,
                "step": o.step,
                "phase": o.phase.value,
                "dims": list(o.dims),
                "input_bytes": o.input_bytes,
                "output_bytes": o.output_bytes,
                "start_s": o.start_s,
                "end_s": o.end_s,
            }
            for o in schedule.ops
        ],
        "sequences": [list(s) for s in schedule.sequences],
        "info": dict(schedule.info),
    }


def schedule_from_dict(data: Any) -> Schedule:
    """Parse and validate the shape of a schedule document (not its semantics: see check)."""
    from hipipe.topology_io import topology_from_dict

    if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
        raise ScheduleError(f'not a hipipe schedule (expected "format": "{SCHEDULE_FORMAT}")')
    if data.get("version") not in SCHEDULE_VERSIONS_READ:
        readable = ", ".join(str(v) for v in SCHEDULE_VERSIONS_READ)
        raise ScheduleError(
            f"schedule format version {data.get('version')!r} is not supported (this hipipe reads {readable})"
        )
    if data["version"] == 1:
        collective = Collective.ALL_REDUCE  # version 1 predates ReduceScatter and AllGather
    elif "collective" in data:
        collective = Collective.parse(data["collective"])
    else:
        raise ScheduleError('malformed schedule: a version-2 schedule needs a "collective"')
    try:
        topology = topology_from_dict(data["topology"])
        chunks = tuple(
            Chunk(
                index=i,
                size_bytes=float(c["size_bytes"]),
                order=tuple(tuple(int(k) for k in g) for g in c["order"]),
            )
            for i, c in enumerate(data["chunks"])
        )
        ops = tuple(
            Op(
                index=i,
                chunk=int(o["chunk"]),
                step=int(o["step"]),
                phase=Phase(o["phase"]),
                dims=tuple(int(k) for k in o["dims"]),
                input_bytes=float(o["input_bytes"]),
                output_bytes=float(o["output_bytes"]),
                start_s=float(o["start_s"]),
                end_s=float(o["end_s"]),
            )
            for i, o in enumerate(data["ops"])
        )
        sequences = tuple(tuple(int(i) for i in s) for s in data["sequences"])
        message_bytes = int(data["message_bytes"])
        schedule = Schedule(
            topology=topology,
            message_bytes=message_bytes,
            planner=str(data["planner"]),
            chunks=chunks,
            ops=ops,
            sequences=sequences,
            makespan_s=float(data["makespan_s"]),
            collective=collective,
            info=dict(data.get("info", {})),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ScheduleError):
            raise
        raise ScheduleError(f"malformed schedule: {type(exc).__name__}: {exc}") from None
    validate_layout(schedule)
    return schedule


def validate_layout(schedule: Schedule) -> None:
    """Cheap shape checks that every consumer relies on (indices in range, chunk-major ops)."""
    topo = schedule.topology
    if schedule.message_bytes <= 0:
        raise ScheduleError(f"message size must be positive, got {schedule.message_bytes}")
    if len(schedule.sequences) != topo.num_dims:
        raise ScheduleError(
            f"schedule has {len(schedule.sequences)} dimension sequences for a {topo.num_dims}-dimension topology"
        )
    expected = sum(schedule.chain_length(j) for j in range(len(schedule.chunks)))
    if len(schedule.ops) != expected:
        raise ScheduleError(f"schedule has {len(schedule.ops)} ops, its chunks' chains need {expected}")
    offsets = _chain_offsets(schedule.chunks, schedule.collective)
    for op in schedule.ops:
        if not 0 <= op.chunk < len(schedule.chunks):
            raise ScheduleError(f"op {op.index} names chunk {op.chunk}, which does not exist")
        if offsets[op.chunk] + op.step != op.index:
            raise ScheduleError(
                f"op {op.index} is out of place: ops must be numbered chunk-major in chain order"
            )
        if any(not 0 <= k < topo.num_dims for k in op.dims):
            raise ScheduleError(f"op {op.index} names a dimension outside 0..{topo.num_dims - 1}")
    for k, seq in enumerate(schedule.sequences):
        for i in seq:
            if not 0 <= i < len(schedule.ops):
                raise ScheduleError(f"dimension {k}'s sequence names op {i}, which does not exist")
