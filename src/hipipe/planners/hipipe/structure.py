"""The discrete part of a HiPIPE plan: chunk orders and per-dimension op sequences.

A :class:`Structure` fixes everything but the chunk sizes; :mod:`.sizing` then finds
the best sizes for it by LP. Every chunk visits every dimension once, one dimension
per op. Its chain has ``L = h D`` ops (``h`` = 2 for AllReduce: D RS then D AG; 1 for
ReduceScatter or AllGather alone), so chunk ``j`` owns ops ``j*L .. j*L + L-1`` (the
simulator's chunk-major numbering) and op ``j*L + step`` runs on ``order[level(step)]``,
where the levels run ``0 .. D-1`` for the RS half and ``D-1 .. 0`` for the AG half.
"""

import math
from dataclasses import dataclass

import numpy as np

from hipipe.cost import op_time_coefficients
from hipipe.schedule import Chunk, Collective, Phase, chain_length
from hipipe.topology import Topology

Order = tuple[int, ...]
"""A permutation of the dims, in RS order (flat: one dim per op)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Structure:
    """Chunk orders + per-dimension sequences: a schedule without sizes."""

    orders: tuple[Order, ...]
    sequences: tuple[tuple[int, ...], ...]
    """Per dimension, op indices in execution order."""
    source: str
    """Where it came from: ``mix`` (the fluid LP) or a baseline's name (a seed)."""
    collective: Collective
    """What the chains compute: it fixes their length and phases."""

    @property
    def num_chunks(self) -> int:
        return len(self.orders)

    @property
    def chain_length(self) -> int:
        """Ops per chunk (every chunk visits each of the ``len(sequences)`` dims once)."""
        return chain_length(self.collective, len(self.sequences))


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTable:
    """Per-op arrays of a set of chunk orders: ``duration = constant + per_byte * chunk size``."""

    num_dims: int
    chain_length: int
    """Ops per chunk: ``2 D`` for AllReduce, ``D`` for ReduceScatter or AllGather."""
    dim: np.ndarray
    """Dim each op runs on."""
    gathers: np.ndarray
    """True where the op is an AllGather (the second half of an AllReduce chain)."""
    chunk: np.ndarray
    constant_s: np.ndarray
    per_chunk_byte_s: np.ndarray
    """Seconds per byte of the op's *chunk* (the op's own wide side is chunk size / prod n before)."""

    @property
    def num_ops(self) -> int:
        return len(self.dim)

    def durations_s(self, sizes_bytes: np.ndarray) -> np.ndarray:
        return self.constant_s + self.per_chunk_byte_s * sizes_bytes[self.chunk]


def chain_levels(collective: Collective, num_dims: int) -> list[tuple[int, bool]]:
    """``(level, is_gather)`` of each step of a chain: the RS half down, the AG half back up."""
    steps: list[tuple[int, bool]] = []
    if collective is not Collective.ALL_GATHER:
        steps.extend((level, False) for level in range(num_dims))
    if collective is not Collective.REDUCE_SCATTER:
        steps.extend((level, True) for level in reversed(range(num_dims)))
    return steps


def op_table(topology: Topology, orders: tuple[Order, ...], collective: Collective) -> OpTable:
    """Coefficients of every op, from :func:`hipipe.cost.op_time_coefficients` (the one formula)."""
    num_dims = topology.num_dims
    # (constant, per byte) per (dim, is_gather): a ReduceScatter may also pay its reduction.
    coefficients = {
        (k, gather): op_time_coefficients(topology, (k,), Phase.AG if gather else Phase.RS)
        for k in range(num_dims)
        for gather in (False, True)
    }
    steps = chain_levels(collective, num_dims)
    dims: list[int] = []
    constants: list[float] = []
    per_bytes: list[float] = []
    for order in orders:
        # The wide side of the op at a level is the chunk divided by the dims before it.
        divisors = [math.prod(topology.dims[k].size for k in order[:level]) for level in range(num_dims)]
        for level, gather in steps:
            constant_s, per_byte_s = coefficients[order[level], gather]
            dims.append(order[level])
            constants.append(constant_s)
            per_bytes.append(per_byte_s / divisors[level])
    dim = np.array(dims, dtype=np.int64)
    constant = np.array(constants) if dims else np.zeros(0)
    per_byte = np.array(per_bytes) if dims else np.zeros(0)
    return OpTable(
        num_dims=num_dims,
        chain_length=len(steps),
        dim=dim,
        gathers=np.tile(np.array([gather for _, gather in steps], dtype=bool), len(orders)),
        chunk=np.repeat(np.arange(len(orders)), len(steps)),
        constant_s=constant,
        per_chunk_byte_s=per_byte,
    )


def assign_orders(
    orders: tuple[Order, ...], weights: tuple[float, ...], num_chunks: int
) -> tuple[Order, ...]:
    """Spread ``num_chunks`` chunks over the mix's orders, interleaved, most-behind first.

    Chunk j takes the order whose share of chunks so far lags its weight the most, so
    every order appears early (each dimension gets work from the first op) and the
    orders stay interleaved to the end. With fewer chunks than orders the heaviest win.
    """
    counts = [0] * len(orders)
    out: list[Order] = []
    for j in range(num_chunks):
        lag = [weights[i] * (j + 1) - counts[i] for i in range(len(orders))]
        best = max(range(len(orders)), key=lambda i: (lag[i], weights[i], -i))
        counts[best] += 1
        out.append(orders[best])
    return tuple(out)


def bookend_orders(
    orders: tuple[Order, ...], weights: tuple[float, ...], num_chunks: int
) -> tuple[Order, ...] | None:
    """Mix orders with one chunk of every minor order first and one last.

    A chunk starts on its order's first dim and ends there (its last AG). When the heavy
    orders all start on the same dims, the others idle while the pipeline fills and
    drains; a chunk of each other order at both ends gives them work from the first and
    until the last microsecond. The LP sizes the bookends (or empties them: then they
    are dropped). None when there is no minor order or too few chunks.
    """
    minor = [order for order in orders[1:]]
    middle = num_chunks - 2 * len(minor)
    if not minor or middle < 1:
        return None
    return (*minor, *assign_orders(orders, weights, middle), *reversed(minor))


def one_end_orders(
    orders: tuple[Order, ...], weights: tuple[float, ...], num_chunks: int, *, at_start: bool
) -> tuple[Order, ...] | None:
    """Mix orders with one chunk of every minor order at one end only.

    The chain of a ReduceScatter or AllGather alone does not come back to the dim it
    started on: a chunk in order pi keeps ``pi[0]`` busy at its start and ``pi[-1]`` at
    its end (RS; the reverse for AG). So the chunks that fill the pipeline and those that
    drain it want different orders: minor orders at the start only (or the end only)
    let the dims the heavy orders reach late start early, without a chunk at the other
    end that would leave them busy after the others are done. None when there is no
    minor order or too few chunks.
    """
    minor = list(orders[1:])
    rest = num_chunks - len(minor)
    if not minor or rest < 1:
        return None
    heavy = assign_orders(orders, weights, rest)
    return (*minor, *heavy) if at_start else (*heavy, *reversed(minor))


def to_chunks(orders: tuple[Order, ...], sizes_bytes: np.ndarray) -> list[Chunk]:
    return [
        Chunk(index=j, size_bytes=float(sizes_bytes[j]), order=tuple((k,) for k in order))
        for j, order in enumerate(orders)
    ]


def without_chunks(structure: Structure, drop: set[int]) -> Structure:
    """The structure with chunks ``drop`` removed, ops renumbered, sequences kept in order."""
    chain_length = structure.chain_length
    kept = [j for j in range(structure.num_chunks) if j not in drop]
    new_index = {j: i for i, j in enumerate(kept)}
    sequences = tuple(
        tuple(
            new_index[op // chain_length] * chain_length + op % chain_length
            for op in sequence
            if op // chain_length in new_index
        )
        for sequence in structure.sequences
    )
    return Structure(
        orders=tuple(structure.orders[j] for j in kept),
        sequences=sequences,
        source=structure.source,
        collective=structure.collective,
    )
