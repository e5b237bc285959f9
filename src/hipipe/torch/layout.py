"""Where each rank's shard sits in the executor's work buffer for ReduceScatter and AllGather.

torch lays a ReduceScatter input (an AllGather output) out as N shards, shard r for
rank r. A chunk j of the schedule is the same slice ``[b_j, b_{j+1})`` of every shard
(:func:`~hipipe.torch.executor.element_bounds` applied to the shard length). The
hierarchical ReduceScatter of a piece over a group leaves ring position p with part p,
so after the chain over ``order[0], order[1], ...`` a rank holds the block whose index
is its ring positions read as a mixed-radix number, ``order[0]`` most significant
(:func:`block_of_rank`). The work buffer therefore holds chunk j as N blocks of
``b_{j+1} - b_j`` elements, block ``block_of_rank[r]`` being rank r's slice: the chain
then ends with each rank's block holding its own shard's slice, and every ring op
splits its piece into exactly equal parts. AllGather runs the same layout backwards.

Chunks sit in the work buffer in index order, chunk j starting at ``N * b_j``.
"""

import itertools
import math
from collections.abc import Callable, Sequence

import torch

from hipipe.errors import ScheduleError
from hipipe.schedule import DimGroup


def coordinates_by_rank(
    sizes: Sequence[int], rank_at: Callable[[tuple[int, ...]], int]
) -> list[tuple[int, ...]]:
    """Every global rank's coordinates (one per dim) under the numbering ``rank_at``."""
    world = math.prod(sizes)
    coords: list[tuple[int, ...] | None] = [None] * world
    for point in itertools.product(*(range(n) for n in sizes)):
        coords[rank_at(point)] = point
    assert all(c is not None for c in coords), "rank_at maps coordinates onto every rank"
    return [c for c in coords if c is not None]


def ring_position(sizes: Sequence[int], group: DimGroup, coords: Sequence[int]) -> int:
    """Position in the ring of ``group`` of the rank at ``coords``: the group's dims in
    sorted order, the first one varying fastest (as :func:`~hipipe.torch.groups.lines` orders rings)."""
    position, stride = 0, 1
    for k in sorted(group):
        position += coords[k] * stride
        stride *= sizes[k]
    return position


def block_of_rank(
    sizes: Sequence[int], order: Sequence[DimGroup], coords: Sequence[tuple[int, ...]]
) -> list[int]:
    """For each rank, the block of a chunk's piece it holds after ReduceScatter over ``order``.

    Refuses an order that does not visit every dim exactly once: such a chain does not
    end with one block per rank, so it is no ReduceScatter.
    """
    visited = sorted(k for group in order for k in group)
    if visited != list(range(len(sizes))):
        raise ScheduleError(
            f"chunk order {[list(g) for g in order]} does not visit every dimension exactly once"
        )
    blocks = []
    for point in coords:
        block = 0
        for group in order:
            block = block * math.prod(sizes[k] for k in group) + ring_position(sizes, group, point)
        blocks.append(block)
    return blocks


def pack_shards(
    work: torch.Tensor, shards: torch.Tensor, bounds: Sequence[int], blocks: Sequence[Sequence[int]]
) -> None:
    """Copy every shard's chunk slices into ``work`` (see module docstring).

    ``shards`` is the ``(N, L)`` view of torch's layout; ``bounds`` the chunk starts in a
    shard plus ``L``; ``blocks[j]`` the block index of each rank for chunk j.
    """
    world = shards.shape[0]
    for j, (a, b) in enumerate(itertools.pairwise(bounds)):
        if b > a:
            index = torch.tensor(blocks[j], dtype=torch.int64, device=work.device)
            work[world * a : world * b].view(world, b - a).index_copy_(0, index, shards[:, a:b])


def unpack_shards(
    shards: torch.Tensor, work: torch.Tensor, bounds: Sequence[int], blocks: Sequence[Sequence[int]]
) -> None:
    """The inverse of :func:`pack_shards`: every rank's slices from ``work`` into ``shards``."""
    world = shards.shape[0]
    for j, (a, b) in enumerate(itertools.pairwise(bounds)):
        if b > a:
            index = torch.tensor(blocks[j], dtype=torch.int64, device=work.device)
            torch.index_select(work[world * a : world * b].view(world, b - a), 0, index, out=shards[:, a:b])


def own_block(bounds: Sequence[int], blocks: Sequence[Sequence[int]], rank: int, world: int) -> list[slice]:
    """For each chunk, where this rank's own slice sits in the work buffer."""
    out = []
    for j, (a, b) in enumerate(itertools.pairwise(bounds)):
        start = world * a + blocks[j][rank] * (b - a)
        out.append(slice(start, start + (b - a)))
    return out
