"""Process groups for the dimensions of a topology, and the ring order inside each.

A group for a set of dims holds the ranks that share every coordinate *outside* that
set; for one dim k that is a line of the mesh along k. Ring algorithms need more than
the group: they need every member to agree on who is left and right of whom, and the
hierarchical algorithm needs the position along dim k to be the coordinate along k on
every line, so that after a ReduceScatter on k all members of a group on another dim
hold the same part. :class:`Ring` carries that order explicitly instead of trusting
that a group's rank numbering follows the coordinates.

Two layouts are supported:

- the topology's own (rank -> coordinates with dim 0 fastest, :meth:`Topology.coords`),
  via :func:`dimension_groups` / :func:`group_for_dims` / :func:`rings_for_layout`;
- a ``DeviceMesh`` whose mesh dim k is topology dim k (any rank placement), via
  :func:`rings_from_mesh`.
"""

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hipipe.errors import HipipeError

DEFAULT_TIMEOUT_S = 60.0
"""Process-group timeout when none is given: long enough for slow CPUs, short enough to never hang a job."""

DimGroup = tuple[int, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Ring:
    """A process group plus the ring order every member agrees on."""

    dims: DimGroup
    """The topology dims the group spans (sorted)."""
    group: Any
    """The ``ProcessGroup`` (typed loosely: torch's stubs differ between versions)."""
    ranks: tuple[int, ...]
    """Global ranks in ring order: by coordinate along ``dims``, the first dim fastest."""
    position: int
    """This rank's index in ``ranks``."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    def right(self) -> int:
        """Global rank this rank sends to."""
        return self.ranks[(self.position + 1) % self.size]

    def left(self) -> int:
        """Global rank this rank receives from."""
        return self.ranks[(self.position - 1) % self.size]


def _check_world(sizes: Sequence[int]) -> int:
    if not dist.is_initialized():
        raise HipipeError("torch.distributed is not initialized: call init_process_group first")
    world = dist.get_world_size()
    if math.prod(sizes) != world:
        shape = "x".join(str(s) for s in sizes)
        raise HipipeError(f"the topology {shape} has {math.prod(sizes)} ranks but the world has {world}")
    return world


def lines(
    sizes: Sequence[int], dims: Sequence[int], rank_at: Callable[[tuple[int, ...]], int]
) -> list[list[int]]:
    """Every group spanning ``dims``: ranks in ring order (coordinates along ``dims``, first dim fastest).

    Groups are listed in the same order on every rank, as ``new_group`` requires.
    """
    dims = sorted(dims)
    others = [k for k in range(len(sizes)) if k not in dims]
    out: list[list[int]] = []
    for fixed in itertools.product(*(range(sizes[k]) for k in reversed(others))):
        fixed_coords = dict(zip(reversed(others), fixed, strict=True))
        line: list[int] = []
        for varying in itertools.product(*(range(sizes[k]) for k in reversed(dims))):
            coords = dict(fixed_coords)
            coords.update(zip(reversed(dims), varying, strict=True))
            line.append(rank_at(tuple(coords[k] for k in range(len(sizes)))))
        out.append(line)
    return out


def layout_rank(sizes: Sequence[int]) -> Callable[[tuple[int, ...]], int]:
    """The topology's rank numbering: dim 0 varies fastest."""

    def rank_at(coords: tuple[int, ...]) -> int:
        rank = 0
        for size, c in zip(reversed(sizes), reversed(coords), strict=True):
            rank = rank * size + c
        return rank

    return rank_at


def mesh_rank(mesh: Any) -> Callable[[tuple[int, ...]], int]:
    """A DeviceMesh's rank numbering: the global rank at each mesh coordinate."""
    mesh_tensor = mesh.mesh

    def rank_at(coords: tuple[int, ...]) -> int:
        return int(mesh_tensor[coords].item())

    return rank_at


def _new_groups(all_lines: list[list[int]], *, backend: str | None, timeout_s: float) -> Any:
    """Create every line's group (collective over the world) and return the one holding this rank."""
    me = dist.get_rank()
    mine = None
    for line in all_lines:
        group = dist.new_group(ranks=sorted(line), timeout=timedelta(seconds=timeout_s), backend=backend)
        if me in line:
            mine = group
    assert mine is not None, "every rank lies on exactly one line per set of dims"
    return mine


def group_for_dims(
    sizes: Sequence[int],
    dims: Sequence[int],
    *,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """This rank's group spanning ``dims`` in the topology layout; every rank must call it.

    ``dims`` = all dims gives a copy of the world with its own Gloo threads, which is
    what the flat ``ring`` baseline runs on.
    """
    _check_world(sizes)
    _check_dims(sizes, dims)
    return _new_groups(lines(sizes, dims, layout_rank(sizes)), backend=backend, timeout_s=timeout_s)


def dimension_groups(
    sizes: Sequence[int], *, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Any]:
    """For each dim k, this rank's group of ranks that share all coordinates except k.

    Call on every rank after ``init_process_group``; ranks are numbered as the topology
    numbers them (dim 0 fastest).
    """
    return [group_for_dims(sizes, (k,), backend=backend, timeout_s=timeout_s) for k in range(len(sizes))]


def _check_dims(sizes: Sequence[int], dims: Sequence[int]) -> None:
    if not dims or any(not 0 <= k < len(sizes) for k in dims) or len(set(dims)) != len(dims):
        raise HipipeError(f"dims {tuple(dims)} are not distinct dims of a {len(sizes)}-dimension topology")


def _ring(dims: DimGroup, group: Any, order: list[int]) -> Ring:
    me = dist.get_rank()
    if me not in order:
        raise HipipeError(f"rank {me} is not in the group for dims {dims}")
    return Ring(dims=dims, group=group, ranks=tuple(order), position=order.index(me))


def rings_for_layout(
    sizes: Sequence[int], groups: Sequence[Any] | dict[DimGroup, Any]
) -> dict[DimGroup, Ring]:
    """Wrap groups made in the topology layout (e.g. by :func:`dimension_groups`) as rings.

    ``groups`` is one group per dim, or a mapping from dim groups to groups. Each group's
    membership is checked against the layout, so a wrong group fails here, not in a hang.
    """
    _check_world(sizes)
    given = dict(groups) if isinstance(groups, dict) else {(k,): g for k, g in enumerate(groups)}
    if not isinstance(groups, dict) and len(groups) != len(sizes):
        raise HipipeError(f"got {len(groups)} process groups for a {len(sizes)}-dimension topology")
    rank_at = layout_rank(sizes)
    me = dist.get_rank()
    rings: dict[DimGroup, Ring] = {}
    for dims, group in given.items():
        dims = tuple(sorted(dims))
        _check_dims(sizes, dims)
        line = next(line for line in lines(sizes, dims, rank_at) if me in line)
        members = sorted(dist.get_process_group_ranks(group))
        if members != sorted(line):
            raise HipipeError(
                f"the process group for dims {dims} holds ranks {members}; the topology layout"
                f" (dim 0 fastest) needs {sorted(line)}"
            )
        rings[dims] = _ring(dims, group, line)
    return rings


def rings_from_mesh(mesh: Any, sizes: Sequence[int]) -> dict[DimGroup, Ring]:
    """One ring per mesh dim; mesh dim k must be topology dim k (same sizes, same order)."""
    shape = tuple(int(s) for s in mesh.shape)
    if shape != tuple(sizes):
        raise HipipeError(
            f"the DeviceMesh has shape {shape} but the topology has sizes {tuple(sizes)}:"
            " mesh dim k must be topology dim k"
        )
    _check_world(sizes)
    rank_at = mesh_rank(mesh)
    me = dist.get_rank()
    rings: dict[DimGroup, Ring] = {}
    for k in range(len(sizes)):
        line = next(line for line in lines(sizes, (k,), rank_at) if me in line)
        rings[(k,)] = _ring((k,), mesh.get_group(k), line)
    return rings


def add_missing_rings(
    rings: dict[DimGroup, Ring],
    needed: Sequence[DimGroup],
    sizes: Sequence[int],
    rank_at: Callable[[tuple[int, ...]], int],
    *,
    backend: str | None,
    timeout_s: float,
) -> dict[DimGroup, Ring]:
    """Create groups for multi-dim groups a schedule uses but the caller did not give.

    Collective over the world: every rank must pass the same ``needed`` in the same order.
    """
    out = dict(rings)
    me = dist.get_rank()
    for dims in needed:
        if dims in out:
            continue
        _check_dims(sizes, dims)
        all_lines = lines(sizes, dims, rank_at)
        group = _new_groups(all_lines, backend=backend, timeout_s=timeout_s)
        out[dims] = _ring(dims, group, next(line for line in all_lines if me in line))
    return out
