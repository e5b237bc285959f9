"""The checker: proves that a schedule is the collective it claims, knowing nothing about planners.

A schedule is only trusted once this module accepts it. It never imports a planner: it
reads the :class:`~hipipe.schedule.Schedule` alone.

Two layers:

- **Structural checks**, always. The layout; chunk sizes summing to the message (and,
  for ReduceScatter and AllGather, a message that splits into N equal shards); each
  chunk's order visiting every dim exactly once; each op's phase, dims and bytes
  matching its chunk's chain (AllReduce: RS over ``order[0]``, ``order[1]``, ..., AG in
  reverse; ReduceScatter: the RS half; AllGather: the AG half); per-dim sequences
  listing exactly the ops on that dim, in start-time order; no dim running two ops at
  once; chain precedence; sane times; the makespan; and durations no shorter than the
  cost model. For hierarchical chains these prove the collective: an RS over every dim,
  each exactly once, leaves every rank with the full sum of one 1/N of the chunk, and
  AGs over every dim spread such 1/N pieces to everyone.
- **Symbolic execution**, for N <= ``symbolic_max_npus``. It does not trust that
  argument: it moves symbolic bytes, per rank, per chunk, op by op in time order on
  every group at once. A byte reduced twice, a piece read before it exists, a group
  whose members work on different pieces or pieces that do not tile: each is reported
  in words. What must hold at the end depends on the collective:

  - AllReduce: every rank starts with each chunk whole, holding only its own
    contribution, and must end with every chunk whole, each rank's contribution in it
    exactly once.
  - ReduceScatter: the same start; rank r must end with exactly the slice of *shard r*
    (its own shard, as ``torch.distributed.reduce_scatter_tensor`` leaves it) summed
    over all ranks, and nothing else. A schedule that leaves rank r with another rank's
    shard is rejected, naming which rank holds which shard.
  - AllGather: rank r starts with only its own shard's slice (its own data) and every
    rank must end with every shard, shard s holding rank s's data, in rank order (as
    ``all_gather_into_tensor`` lays them out).

Shards in a chunk (ReduceScatter and AllGather). Chunk j holds the same slice of each of
the N shards (:mod:`hipipe.schedule`). An executor stages those N slices in one buffer
per chunk so that every RS and AG of the chain works on a contiguous piece of it: slot
``u`` holds the slice of the rank whose *position* is ``u``, the position being the
rank's coordinates read as a mixed-radix number with the group of ``order[0]`` as the
most significant digit (inside a group, the group's first dim fastest, as member
indices are numbered below). Under that staging an RS over ``order[0]`` hands member i
the ranks whose digit of ``order[0]`` is i, and so on down the order, so rank r ends on
its own slot; the checker moves bytes by slot and reads slots back as shards, so ops
that run in another order than the chunk's leave shards permuted or do not tile.

Symbolic representation: a chunk is cut into ``L`` units, ``L`` the product of the
group sizes of all its ops, so every split an RS makes is exact in integers. A rank
holds a *piece* (the interval it works on) and *segments* ``(lo, hi, contributions)``,
``contributions`` a bitmask of ranks whose data is summed into those units.
"""

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from hipipe.cost import op_time_s
from hipipe.errors import ScheduleError
from hipipe.schedule import Chunk, Collective, DimGroup, Op, Phase, Schedule, validate_layout
from hipipe.topology import Topology
from hipipe.units import format_time

SYMBOLIC_MAX_NPUS = 64
"""Above this many NPUs the symbolic run is skipped; the structural checks remain."""

REL_TOL = 1e-9
"""Relative tolerance for bytes and times (times: relative to the makespan)."""

MAX_PROBLEMS = 50
"""Problems kept in a report; a broken schedule rarely needs more to be understood."""

Segment = tuple[int, int, int]
"""``(lo, hi, contributions)``: units ``[lo, hi)`` of a chunk, summed over a set of ranks."""

Piece = tuple[int, int]
"""Units ``[lo, hi)`` of a chunk."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckReport:
    """What the checker found; ``ok`` only if ``problems`` is empty."""

    ok: bool
    method: str
    """``symbolic`` (bytes moved on every rank) or ``structural`` (chain argument only)."""
    problems: tuple[str, ...]
    planner: str
    topology_label: str
    num_npus: int
    num_chunks: int
    num_ops: int
    collective: Collective = Collective.ALL_REDUCE

    def summary(self) -> str:
        """One line for humans: the verdict, or the first problem and how many follow."""
        what = (
            f"{self.planner} schedule, {self.num_chunks} chunks, {self.num_ops} ops on {self.topology_label}"
        )
        name = COLLECTIVE_NAMES[self.collective]
        if self.ok:
            return f"OK: {what}: {name} proven ({self.method})"
        more = len(self.problems) - 1
        tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        return f"{what} is not a valid {name}: {self.problems[0]}{tail}"


COLLECTIVE_NAMES: dict[Collective, str] = {
    Collective.ALL_REDUCE: "AllReduce",
    Collective.REDUCE_SCATTER: "ReduceScatter",
    Collective.ALL_GATHER: "AllGather",
}


class _Problems:
    """Collects messages up to :data:`MAX_PROBLEMS` and counts the rest."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.dropped = 0

    def add(self, message: str) -> None:
        if len(self.messages) < MAX_PROBLEMS:
            self.messages.append(message)
        else:
            self.dropped += 1

    def result(self) -> tuple[str, ...]:
        extra = [f"... and {self.dropped} more problems"] if self.dropped else []
        return (*self.messages, *extra)


def check(
    schedule: Schedule,
    *,
    symbolic_max_npus: int = SYMBOLIC_MAX_NPUS,
    rel_tol: float = REL_TOL,
    check_durations: bool = True,
) -> CheckReport:
    """Prove that ``schedule`` is the collective it says it is, or say in words why it is not."""
    problems = _Problems()
    topology = schedule.topology
    symbolic = topology.num_npus <= symbolic_max_npus
    try:
        validate_layout(schedule)
        _check_indices(schedule)
    except ScheduleError as exc:
        problems.add(str(exc))
    else:
        tol_s = _time_tolerance_s(schedule, rel_tol)
        _check_structure(schedule, problems, rel_tol=rel_tol, tol_s=tol_s, check_durations=check_durations)
        if symbolic and _all_times_finite(schedule):
            _execute_symbolically(schedule, problems, tol_s=tol_s)
    found = problems.result()
    return CheckReport(
        ok=not found,
        method="symbolic" if symbolic else "structural",
        problems=found,
        planner=schedule.planner,
        topology_label=topology.label(),
        num_npus=topology.num_npus,
        num_chunks=len(schedule.chunks),
        num_ops=len(schedule.ops),
        collective=schedule.collective,
    )


def check_or_raise(
    schedule: Schedule,
    *,
    symbolic_max_npus: int = SYMBOLIC_MAX_NPUS,
    rel_tol: float = REL_TOL,
    check_durations: bool = True,
) -> CheckReport:
    """:func:`check`, raising :class:`ScheduleError` (one line) if the schedule is wrong."""
    report = check(
        schedule, symbolic_max_npus=symbolic_max_npus, rel_tol=rel_tol, check_durations=check_durations
    )
    if not report.ok:
        raise ScheduleError(report.summary())
    return report


# ---------------------------------------------------------------- structural checks


def _check_indices(schedule: Schedule) -> None:
    """Ops and chunks sit at their own index, and each op at its place in its chunk's chain.

    :func:`validate_layout` checks ``op.index``; this checks the tuple positions too,
    which every index-based lookup relies on.
    """
    for j, chunk in enumerate(schedule.chunks):
        if chunk.index != j:
            raise ScheduleError(f"chunk at position {j} says it is chunk {chunk.index}")
    position = 0
    for j in range(len(schedule.chunks)):
        for step in range(schedule.chain_length(j)):
            op = schedule.ops[position]
            if (op.index, op.chunk, op.step) != (position, j, step):
                raise ScheduleError(
                    f"op at position {position} should be chunk {j}, step {step}, but is"
                    f" op {op.index} (chunk {op.chunk}, step {op.step})"
                )
            position += 1


def _time_tolerance_s(schedule: Schedule, rel_tol: float) -> float:
    times = [abs(t) for op in schedule.ops for t in (op.start_s, op.end_s) if math.isfinite(t)]
    if math.isfinite(schedule.makespan_s):
        times.append(abs(schedule.makespan_s))
    return rel_tol * max(times, default=0.0) + 1e-18


def _all_times_finite(schedule: Schedule) -> bool:
    return all(math.isfinite(op.start_s) and math.isfinite(op.end_s) for op in schedule.ops)


def _check_structure(
    schedule: Schedule, problems: _Problems, *, rel_tol: float, tol_s: float, check_durations: bool
) -> None:
    _check_sizes(schedule, problems, rel_tol)
    _check_orders(schedule, problems)
    _check_chains(schedule, problems, rel_tol)
    _check_times(schedule, problems, tol_s, rel_tol)
    _check_sequences(schedule, problems, tol_s)
    _check_dims_busy_once(schedule, problems, tol_s)
    _check_precedence(schedule, problems, tol_s)
    if check_durations:
        _check_durations(schedule, problems, tol_s, rel_tol)


def _check_sizes(schedule: Schedule, problems: _Problems, rel_tol: float) -> None:
    for chunk in schedule.chunks:
        if not (math.isfinite(chunk.size_bytes) and chunk.size_bytes >= 0):
            problems.add(f"chunk {chunk.index} has size {chunk.size_bytes!r} bytes; sizes must be >= 0")
    total = math.fsum(c.size_bytes for c in schedule.chunks)
    if not math.isclose(total, schedule.message_bytes, rel_tol=rel_tol, abs_tol=rel_tol):
        problems.add(
            f"chunk sizes sum to {total!r} bytes but the message is {schedule.message_bytes} bytes"
            f" ({len(schedule.chunks)} chunks): every byte must be in exactly one chunk"
        )
    n = schedule.topology.num_npus
    if schedule.collective is not Collective.ALL_REDUCE and schedule.message_bytes % n:
        problems.add(
            f"a {schedule.collective.value} of {schedule.message_bytes} bytes cannot be cut into {n}"
            f" equal shards, one per rank: the message must be a multiple of {n} bytes"
        )


def _check_orders(schedule: Schedule, problems: _Problems) -> None:
    num_dims = schedule.topology.num_dims
    for chunk in schedule.chunks:
        visits = [0] * num_dims
        for group in chunk.order:
            if not group:
                problems.add(f"chunk {chunk.index}'s order has an empty dim group")
            for k in group:
                if 0 <= k < num_dims:
                    visits[k] += 1
                else:
                    problems.add(f"chunk {chunk.index}'s order names dim {k}, outside 0..{num_dims - 1}")
        order = _order_text(chunk.order)
        for k, count in enumerate(visits):
            if count == 0:
                problems.add(f"chunk {chunk.index}'s order ({order}) never visits dim {k}")
            elif count > 1:
                problems.add(f"chunk {chunk.index}'s order ({order}) visits dim {k} {count} times")


def _check_chains(schedule: Schedule, problems: _Problems, rel_tol: float) -> None:
    """Each op is the step of its chunk's chain that its position says it is."""
    topology = schedule.topology
    for chunk in schedule.chunks:
        if any(not 0 <= k < topology.num_dims for g in chunk.order for k in g):
            continue  # already reported; the chain cannot be derived
        expected_chain = _expected_chain(topology, chunk, schedule.collective)
        for op, (phase, dims, input_bytes, output_bytes) in zip(
            schedule.chunk_ops(chunk.index), expected_chain, strict=True
        ):
            if op.phase != phase or op.dims != dims:
                problems.add(
                    f"{_describe(op)} should be {phase.value} on {_dims_text(dims)}: chunk"
                    f" {chunk.index}'s order is {_order_text(chunk.order)}, so its chain is"
                    f" {_chain_text(expected_chain)}"
                )
                continue
            for what, actual, expected in (
                ("input", op.input_bytes, input_bytes),
                ("output", op.output_bytes, output_bytes),
            ):
                if not math.isclose(actual, expected, rel_tol=rel_tol, abs_tol=rel_tol):
                    problems.add(
                        f"{_describe(op)} claims {actual!r} {what} bytes per NPU; its place in"
                        f" chunk {chunk.index}'s chain ({chunk.size_bytes!r} bytes) gives {expected!r}"
                    )


ChainStep = tuple[Phase, DimGroup, float, float]
"""``(phase, dims, input_bytes, output_bytes)`` of one op of a chain."""


def _expected_chain(topology: Topology, chunk: Chunk, collective: Collective) -> list[ChainStep]:
    """The chain derived here (docs/MODEL.md), not borrowed from the planners' helpers.

    RS over ``order[0]``, ``order[1]``, ... each dividing the piece by its group's size,
    then AG over the same groups in reverse, each multiplying it back. ReduceScatter is
    the first half alone, AllGather the second half alone: both read ``order`` in RS
    order, so an AllGather starts on ``order[-1]`` with a 1/N piece.
    """
    piece_bytes = [chunk.size_bytes]
    for group in chunk.order:
        piece_bytes.append(piece_bytes[-1] / _group_size(topology, group))
    levels = range(len(chunk.order))
    reduce = [(Phase.RS, chunk.order[i], piece_bytes[i], piece_bytes[i + 1]) for i in levels]
    gather = [(Phase.AG, chunk.order[i], piece_bytes[i + 1], piece_bytes[i]) for i in reversed(levels)]
    if collective is Collective.REDUCE_SCATTER:
        return reduce
    if collective is Collective.ALL_GATHER:
        return gather
    return reduce + gather


def _check_times(schedule: Schedule, problems: _Problems, tol_s: float, rel_tol: float) -> None:
    for op in schedule.ops:
        if not (math.isfinite(op.start_s) and math.isfinite(op.end_s)):
            problems.add(f"{_describe(op)} has a non-finite time (start {op.start_s!r}, end {op.end_s!r})")
        elif op.start_s < -tol_s:
            problems.add(f"{_describe(op)} starts at a negative time ({op.start_s!r} s)")
        elif op.end_s < op.start_s - tol_s:
            problems.add(f"{_describe(op)} ends at {_t(op.end_s)}, before it starts at {_t(op.start_s)}")
    last_end_s = max((op.end_s for op in schedule.ops), default=0.0)
    if not math.isclose(schedule.makespan_s, last_end_s, rel_tol=rel_tol, abs_tol=tol_s):
        problems.add(
            f"the makespan is {_t(schedule.makespan_s)} ({schedule.makespan_s!r} s) but the last op"
            f" ends at {_t(last_end_s)} ({last_end_s!r} s)"
        )


def _check_sequences(schedule: Schedule, problems: _Problems, tol_s: float) -> None:
    """Dim k's sequence lists exactly the ops that touch dim k, in start-time order."""
    for k, sequence in enumerate(schedule.sequences):
        on_dim = {op.index for op in schedule.ops if k in op.dims}
        seen: set[int] = set()
        for index in sequence:
            if index in seen:
                problems.add(f"dim {k}'s sequence lists {_describe(schedule.ops[index])} twice")
            elif index not in on_dim:
                problems.add(
                    f"dim {k}'s sequence lists {_describe(schedule.ops[index])}, which is not on dim {k}"
                )
            seen.add(index)
        for index in sorted(on_dim - seen):
            problems.add(f"dim {k}'s sequence lacks {_describe(schedule.ops[index])}")
        for before, after in itertools.pairwise(sequence):
            a, b = schedule.ops[before], schedule.ops[after]
            if b.start_s < a.start_s - tol_s:
                problems.add(
                    f"dim {k}'s sequence runs {_describe(b)} (start {_t(b.start_s)}) after"
                    f" {_describe(a)} (start {_t(a.start_s)}), but it starts earlier"
                )


def _check_dims_busy_once(schedule: Schedule, problems: _Problems, tol_s: float) -> None:
    """Each dim runs one op at a time: RS and AG on a dim share the same links."""
    for k in range(schedule.topology.num_dims):
        on_dim = sorted(
            (op for op in schedule.ops if k in op.dims), key=lambda op: (op.start_s, op.end_s, op.index)
        )
        busiest: Op | None = None
        for op in on_dim:
            if busiest is not None and op.start_s < busiest.end_s - tol_s:
                problems.add(
                    f"dim {k} runs two ops at once: {_describe(busiest)} from {_t(busiest.start_s)} to"
                    f" {_t(busiest.end_s)} and {_describe(op)} from {_t(op.start_s)} to {_t(op.end_s)}"
                    f" (overlap {_t(min(busiest.end_s, op.end_s) - op.start_s)})"
                )
            if busiest is None or op.end_s > busiest.end_s:
                busiest = op


def _check_precedence(schedule: Schedule, problems: _Problems, tol_s: float) -> None:
    for chunk in schedule.chunks:
        ops = schedule.chunk_ops(chunk.index)
        handoff_s = schedule.topology.overheads.handoff_s
        for before, op in itertools.pairwise(ops):
            delay_s = handoff_s if op.dims != before.dims else 0.0
            if op.start_s < before.end_s + delay_s - tol_s:
                problems.add(
                    f"{_describe(op)} starts at {_t(op.start_s)} before its input exists"
                    f" (op {before.index} ends at {_t(before.end_s)}"
                    + (f", plus a {_t(delay_s)} hand-off)" if delay_s else ")")
                )


def _check_durations(schedule: Schedule, problems: _Problems, tol_s: float, rel_tol: float) -> None:
    """A schedule that claims an op is faster than the cost model is wrong."""
    for op in schedule.ops:
        if not all(0 <= k < schedule.topology.num_dims for k in op.dims) or not op.dims:
            continue
        physics_s = op_time_s(schedule.topology, op.dims, op.full_bytes, op.phase)
        if op.duration_s < physics_s * (1 - rel_tol) - tol_s:
            problems.add(
                f"{_describe(op)} lasts {_t(op.duration_s)} but the cost model needs at least"
                f" {_t(physics_s)} for {op.full_bytes!r} bytes"
            )


# ---------------------------------------------------------------- symbolic execution


class _Violation(Exception):
    """An op cannot run on the symbolic state; the message says why."""


@dataclass(kw_only=True, slots=True)
class _ChunkRun:
    """Mutable symbolic state of one chunk on every rank."""

    chunk: int
    units: int
    pieces: list[Piece]
    held: list[list[Segment]]
    positions: list[int] | None = None
    """ReduceScatter/AllGather: rank -> slot of the staged chunk holding its shard's slice."""
    in_flight: tuple[Op, list[Piece], list[list[Segment]]] | None = None

    @property
    def slot_units(self) -> int:
        return self.units // len(self.pieces)


def _execute_symbolically(schedule: Schedule, problems: _Problems, *, tol_s: float) -> None:
    """Run every chunk's ops in time order on symbolic per-rank buffers.

    Chunks are disjoint bytes, so each chunk runs on its own; within a chunk an op reads
    its input when it starts and delivers its output when it ends; one op of a chunk
    runs at a time, so an op starting while another is running reads nothing.
    """
    topology = schedule.topology
    collective = schedule.collective
    groups_by_dims: dict[DimGroup, list[list[int]]] = {}
    for chunk in schedule.chunks:
        ops = schedule.chunk_ops(chunk.index)
        if collective is not Collective.ALL_REDUCE and not _visits_each_dim_once(topology, chunk):
            continue  # no staging of shards without a valid order (already reported)
        run = _new_chunk_run(topology, chunk, ops, collective)
        try:
            for op in _start_order(ops, tol_s):
                _deliver_if_done(run, op, tol_s)
                dims = tuple(sorted(set(op.dims)))
                if dims not in groups_by_dims:
                    groups_by_dims[dims] = _groups(topology, dims)
                _start(run, op, groups_by_dims[dims])
            _deliver_if_done(run, None, tol_s)
            if collective is Collective.REDUCE_SCATTER:
                _check_final_scatter(run)
            elif collective is Collective.ALL_GATHER:
                _check_final_gather(run)
            else:
                _check_final(run, topology.num_npus)
        except _Violation as exc:
            problems.add(f"symbolic run: {exc}")


def _visits_each_dim_once(topology: Topology, chunk: Chunk) -> bool:
    dims = [k for group in chunk.order for k in group]
    return sorted(dims) == list(range(topology.num_dims))


def _new_chunk_run(topology: Topology, chunk: Chunk, ops: Sequence[Op], collective: Collective) -> _ChunkRun:
    num_npus = topology.num_npus
    units = math.prod(_group_size(topology, op.dims) for op in ops)
    if collective is Collective.ALL_REDUCE:
        return _ChunkRun(
            chunk=chunk.index,
            units=units,
            pieces=[(0, units)] * num_npus,
            held=[[(0, units, 1 << rank)] for rank in range(num_npus)],
        )
    units *= num_npus  # N slots, each still cut exactly by every RS of the chain
    positions = _staging_positions(topology, chunk.order)
    width = units // num_npus
    if collective is Collective.REDUCE_SCATTER:
        pieces = [(0, units)] * num_npus
        held = [[(0, units, 1 << rank)] for rank in range(num_npus)]
    else:  # AllGather: each rank holds its own shard's slice, in its own slot
        pieces = [(positions[r] * width, (positions[r] + 1) * width) for r in range(num_npus)]
        held = [[(lo, hi, 1 << rank)] for rank, (lo, hi) in enumerate(pieces)]
    return _ChunkRun(chunk=chunk.index, units=units, pieces=pieces, held=held, positions=positions)


def _staging_positions(topology: Topology, order: Sequence[DimGroup]) -> list[int]:
    """Rank -> slot: coordinates as a mixed-radix number, ``order[0]``'s group most significant.

    Inside a group the digit is the member index of :func:`_groups` (the group's first
    dim fastest), the index an RS over the group uses to hand out sub-pieces.
    """
    positions = []
    for rank in range(topology.num_npus):
        coords = topology.coords(rank)
        position = 0
        for group in order:
            digit = 0
            for k in reversed(group):
                digit = digit * topology.dims[k].size + coords[k]
            position = position * _group_size(topology, group) + digit
        positions.append(position)
    return positions


def _group_size(topology: Topology, dims: Iterable[int]) -> int:
    return math.prod(topology.dims[k].size for k in set(dims))


def _start_order(ops: Sequence[Op], tol_s: float) -> list[Op]:
    """Ops by start time; starts within ``tol_s`` of each other count as simultaneous.

    Simultaneous starts run in chain order, so float noise on a zero-length op cannot
    make its successor look early.
    """
    by_start = sorted(ops, key=lambda op: (op.start_s, op.index))
    ordered: list[Op] = []
    cluster: list[Op] = []
    for op in by_start:
        if cluster and op.start_s > cluster[0].start_s + tol_s:
            ordered.extend(sorted(cluster, key=lambda o: o.index))
            cluster = []
        cluster.append(op)
    ordered.extend(sorted(cluster, key=lambda o: o.index))
    return ordered


def _groups(topology: Topology, dims: DimGroup) -> list[list[int]]:
    """The groups an op over ``dims`` runs on: ranks sharing every coordinate outside ``dims``.

    Members are listed by their index inside the group (first dim of ``dims`` fastest),
    which is the sub-piece an RS leaves them and the place an AG puts their piece.
    """
    members: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for rank in range(topology.num_npus):
        coords = topology.coords(rank)
        outside = tuple(c for k, c in enumerate(coords) if k not in dims)
        index = 0
        for k in reversed(dims):
            index = index * topology.dims[k].size + coords[k]
        members.setdefault(outside, []).append((index, rank))
    return [[rank for _, rank in sorted(group)] for group in members.values()]


def _start(run: _ChunkRun, op: Op, groups: list[list[int]]) -> None:
    assert run.in_flight is None, "the running op was not delivered"
    pieces = list(run.pieces)
    held = list(run.held)
    for members in groups:
        if op.phase == Phase.RS:
            _reduce_scatter(run, op, members, pieces, held)
        else:
            _all_gather(run, op, members, pieces, held)
    run.in_flight = (op, pieces, held)


def _deliver_if_done(run: _ChunkRun, next_op: Op | None, tol_s: float) -> None:
    """Deliver the running op's output if it ends before ``next_op`` starts (or at the end)."""
    if run.in_flight is None:
        return
    running = run.in_flight[0]
    if next_op is not None and running.end_s > next_op.start_s + tol_s:
        raise _Violation(
            f"{_describe(next_op)} starts at {_t(next_op.start_s)} before its input exists"
            f" ({_describe(running)} is still running until {_t(running.end_s)})"
        )
    _, run.pieces, run.held = run.in_flight
    run.in_flight = None


def _reduce_scatter(
    run: _ChunkRun, op: Op, members: list[int], pieces: list[Piece], held: list[list[Segment]]
) -> None:
    """Every member holds the same piece; member i leaves with the sum of sub-piece i."""
    piece = run.pieces[members[0]]
    for rank in members[1:]:
        if run.pieces[rank] != piece:
            raise _Violation(
                f"{_describe(op)}: ranks {members[0]} and {rank} of one group work on different"
                f" pieces ({_piece_text(run, piece)} and {_piece_text(run, run.pieces[rank])})"
            )
    lo, hi = piece
    n = len(members)
    if (hi - lo) % n:
        raise _Violation(f"{_describe(op)}: piece {_piece_text(run, piece)} cannot be cut in {n}")
    width = (hi - lo) // n
    inputs = [_covering(run, op, rank, piece) for rank in members]
    for i, rank in enumerate(members):
        sub = (lo + i * width, lo + (i + 1) * width)
        pieces[rank] = sub
        held[rank] = _sum(run, op, members, [_clip(segments, sub) for segments in inputs])


def _all_gather(
    run: _ChunkRun, op: Op, members: list[int], pieces: list[Piece], held: list[list[Segment]]
) -> None:
    """Member i's piece is the i-th of n adjacent equal pieces; all leave with their union."""
    first_lo, first_hi = run.pieces[members[0]]
    width = first_hi - first_lo
    for i, rank in enumerate(members):
        expected = (first_lo + i * width, first_lo + (i + 1) * width)
        if run.pieces[rank] != expected:
            shown = ", ".join(f"rank {r}: {_piece_text(run, run.pieces[r])}" for r in members[:4])
            raise _Violation(
                f"{_describe(op)}: the pieces of one group do not tile a larger piece"
                f" ({shown}{', ...' if len(members) > 4 else ''})"
            )
    whole = (first_lo, first_lo + len(members) * width)
    gathered: list[Segment] = []
    for rank in members:
        gathered.extend(_covering(run, op, rank, run.pieces[rank]))
    merged = _merge(gathered)
    for rank in members:
        pieces[rank] = whole
        held[rank] = merged


def _covering(run: _ChunkRun, op: Op, rank: int, piece: Piece) -> list[Segment]:
    """The segments of ``rank`` inside ``piece``, which it must hold completely."""
    segments = _clip(run.held[rank], piece)
    position = piece[0]
    for lo, hi, _ in segments:
        if lo != position:
            break
        position = hi
    if position != piece[1] or not segments:
        raise _Violation(
            f"{_describe(op)}: rank {rank} does not hold piece {_piece_text(run, piece)}"
            f" (it holds {_segments_text(run, run.held[rank])})"
        )
    return segments


def _clip(segments: list[Segment], piece: Piece) -> list[Segment]:
    lo, hi = piece
    return [(max(a, lo), min(b, hi), mask) for a, b, mask in segments if a < hi and b > lo]


def _sum(run: _ChunkRun, op: Op, members: list[int], inputs: list[list[Segment]]) -> list[Segment]:
    """Element-wise sum of the members' segments; a contribution met twice is an error."""
    if all(len(segments) == 1 for segments in inputs):
        cuts = [inputs[0][0][0], inputs[0][0][1]]
    else:
        cuts = sorted({edge for segments in inputs for a, b, _ in segments for edge in (a, b)})
    result: list[Segment] = []
    for lo, hi in itertools.pairwise(cuts):
        total = 0
        for rank, segments in zip(members, inputs, strict=True):
            mask = next(m for a, b, m in segments if a <= lo and hi <= b)
            if total & mask:
                raise _Violation(
                    f"{_describe(op)}: piece {_piece_text(run, (lo, hi))} would be reduced twice:"
                    f" rank {rank} brings the contribution of {_ranks_text(total & mask)} again"
                )
            total |= mask
        result.append((lo, hi, total))
    return _merge(result)


def _merge(segments: list[Segment]) -> list[Segment]:
    """Sorted segments with adjacent equal contributions joined (keeps the state small)."""
    merged: list[Segment] = []
    for segment in sorted(segments):
        if merged and merged[-1][1] == segment[0] and merged[-1][2] == segment[2]:
            merged[-1] = (merged[-1][0], segment[1], segment[2])
        else:
            merged.append(segment)
    return merged


def _check_final(run: _ChunkRun, num_npus: int) -> None:
    """Every rank holds the whole chunk, each byte the sum of all N contributions."""
    everyone = (1 << num_npus) - 1
    for rank, segments in enumerate(run.held):
        if segments != [(0, run.units, everyone)]:
            missing = [
                f"{_piece_text(run, (lo, hi))} lacks {_ranks_text(everyone & ~mask)}"
                for lo, hi, mask in segments
                if mask != everyone
            ]
            covered = sum(hi - lo for lo, hi, _ in segments)
            if covered != run.units:
                missing.insert(0, f"it holds only {_segments_text(run, segments)}")
            raise _Violation(
                f"chunk {run.chunk}: at the end rank {rank} does not hold the full sum: {'; '.join(missing)}"
            )


def _check_final_scatter(run: _ChunkRun) -> None:
    """Rank r holds exactly its own shard's slice, summed over all ranks, and nothing else."""
    assert run.positions is not None
    num_npus = len(run.pieces)
    everyone = (1 << num_npus) - 1
    width = run.slot_units
    owners = _owners(run)
    wrong: list[str] = []
    for rank, segments in enumerate(run.held):
        slot = run.positions[rank]
        if segments == [(slot * width, (slot + 1) * width, everyone)]:
            continue
        holds = []
        for lo, hi, mask in segments:
            for u in range(lo // width, (hi - 1) // width + 1):
                part = "" if lo <= u * width and (u + 1) * width <= hi else "part of "
                missing = "" if mask == everyone else f" lacking {_ranks_text(everyone & ~mask)}"
                holds.append(f"{part}shard {owners[u]}{missing}")
        wrong.append(f"rank {rank} holds {', '.join(holds[:3])}{', ...' if len(holds) > 3 else ''}")
    if wrong:
        shown = "; ".join(wrong[:4]) + ("; ..." if len(wrong) > 4 else "")
        raise _Violation(
            f"chunk {run.chunk}: shards are not left in rank order ({shown}); after a ReduceScatter"
            f" rank r must hold exactly shard r, summed over all {num_npus} ranks"
        )


def _check_final_gather(run: _ChunkRun) -> None:
    """Every rank holds every shard, shard s carrying rank s's data, in rank order."""
    owners = _owners(run)
    width = run.slot_units
    expected = [(u * width, (u + 1) * width, 1 << owners[u]) for u in range(len(owners))]
    for rank, segments in enumerate(run.held):
        if segments == expected:
            continue
        problems = []
        covered = {u for lo, hi, _ in segments for u in range(lo // width, (hi - 1) // width + 1)}
        lacking = [owners[u] for u in range(len(owners)) if u not in covered]
        if lacking:
            problems.append(f"lacks shard{'s' if len(lacking) > 1 else ''} {_list_text(sorted(lacking))}")
        for lo, hi, mask in segments:
            for u in range(lo // width, (hi - 1) // width + 1):
                if mask != 1 << owners[u]:
                    problems.append(f"holds {_ranks_text(mask)}'s data where shard {owners[u]} belongs")
        raise _Violation(
            f"chunk {run.chunk}: after the AllGather rank {rank} {'; '.join(problems[:3]) or 'is wrong'}"
        )


def _owners(run: _ChunkRun) -> list[int]:
    """Slot -> the rank whose shard it stages (the inverse of ``run.positions``)."""
    assert run.positions is not None
    owners = [0] * len(run.positions)
    for rank, slot in enumerate(run.positions):
        owners[slot] = rank
    return owners


def _list_text(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values[:6]) + (
        f", ... ({len(values)} in all)" if len(values) > 6 else ""
    )


# ---------------------------------------------------------------- words


def _t(time_s: float) -> str:
    if time_s != 0 and abs(time_s) < 1e-9:
        return f"{time_s:.3g} s"
    return format_time(time_s) if time_s >= 0 else f"-{format_time(-time_s)}"


def _dims_text(dims: Sequence[int]) -> str:
    if len(dims) == 1:
        return f"dim {dims[0]}"
    return "dims " + "+".join(str(k) for k in dims)


def _describe(op: Op) -> str:
    """``chunk 3, op 5 (AG on dim 1)``."""
    return f"chunk {op.chunk}, op {op.index} ({op.phase!s} on {_dims_text(op.dims)})"


def _order_text(order: Sequence[DimGroup]) -> str:
    return ", ".join("+".join(str(k) for k in group) for group in order) or "empty"


def _chain_text(steps: Sequence[ChainStep]) -> str:
    return " -> ".join(f"{phase.value} {'+'.join(str(k) for k in dims)}" for phase, dims, _, _ in steps)


def _piece_text(run: _ChunkRun, piece: Piece) -> str:
    """A piece as exact fractions of its chunk: ``[1/8, 1/4)``."""
    return f"[{Fraction(piece[0], run.units)}, {Fraction(piece[1], run.units)})"


def _segments_text(run: _ChunkRun, segments: list[Segment]) -> str:
    if not segments:
        return "nothing"
    return " ".join(_piece_text(run, (lo, hi)) for lo, hi, _ in segments[:4]) + (
        " ..." if len(segments) > 4 else ""
    )


def _ranks_text(mask: int) -> str:
    ranks = [r for r in range(mask.bit_length()) if mask >> r & 1]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:6])
    return f"ranks {shown}" + (f", ... ({len(ranks)} in all)" if len(ranks) > 6 else "")
