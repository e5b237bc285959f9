"""Ring ReduceScatter and AllGather over one :class:`~hipipe.torch.groups.Ring`, on isend/irecv.

Why not the backend's own collectives: Gloo's ``reduce_scatter`` moves twice the ideal
bytes (HIPIPE.md section 8), and neither Gloo nor NCCL takes uneven parts natively. A
ring on point-to-point ops moves exactly ``(n-1)/n`` of the piece per rank, works on any
element range of a flat tensor, and can be used on its own to calibrate one dimension.

Both functions work in place on ``tensor[start:stop]`` (a 1-D contiguous tensor),
split into ``n`` near-equal parts by :func:`split` (the same rule on every rank). After
the ReduceScatter, ring position ``p`` holds the reduced part ``p``; the AllGather
starts from that and leaves the whole range on everyone.

:func:`native_reduce_scatter` / :func:`native_all_gather` keep the same contract with
the backend's own collectives, for NCCL (where those are the fast path).

Every message of step ``s`` carries tag ``tag_base + s``; callers running several
rings at once on one group give them disjoint tag ranges (``n - 1`` apart), as Gloo
aborts on concurrent point-to-point ops with the same tag. The receive is posted
before the send. Zero-length parts are skipped on both sides (both know the lengths).
"""

import time
from collections.abc import Callable
from datetime import timedelta
from enum import StrEnum

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.torch.groups import Ring


class ReduceOp(StrEnum):
    """Reductions the executor supports; ``avg`` is a sum divided at the end."""

    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"


def parse_reduce_op(op: object) -> ReduceOp:
    """``"sum"``, :class:`ReduceOp`, or torch's ``dist.ReduceOp.SUM`` (and AVG, MIN, MAX)."""
    name = getattr(op, "name", op)  # torch's RedOpType members carry their name
    try:
        return ReduceOp(str(name).lower())
    except ValueError:
        raise HipipeError(f"unknown reduce op {op!r} (use {', '.join(o.value for o in ReduceOp)})") from None


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into ``parts`` near-equal element ranges (lengths differ by <= 1)."""
    length = stop - start
    bounds = [start + (i * length) // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def _add(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    acc.add_(incoming)


def _min(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    torch.minimum(acc, incoming, out=acc)


def _max(acc: torch.Tensor, incoming: torch.Tensor) -> None:
    torch.maximum(acc, incoming, out=acc)


def reducer(op: ReduceOp | str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """In-place ``acc <- acc (op) incoming``."""
    op = ReduceOp(op)
    if op is ReduceOp.MIN:
        return _min
    if op is ReduceOp.MAX:
        return _max
    return _add


def _wait(works: list[object], deadline_s: float, what: str) -> None:
    for work in works:
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError(f"{what}: timed out")
        if work is None:
            continue
        work.wait(timeout=timedelta(seconds=remaining_s))  # type: ignore[attr-defined]


def _exchange(
    ring: Ring,
    send: torch.Tensor | None,
    recv: torch.Tensor | None,
    tag: int,
    deadline_s: float,
    what: str,
) -> None:
    """Post the receive from the left, then the send to the right; wait for both."""
    works: list[object] = []
    if recv is not None and recv.numel():
        works.append(dist.irecv(recv, src=ring.left(), group=ring.group, tag=tag))
    if send is not None and send.numel():
        works.append(dist.isend(send, dst=ring.right(), group=ring.group, tag=tag))
    _wait(works, deadline_s, what)


def ring_reduce_scatter(
    tensor: torch.Tensor,
    ring: Ring,
    *,
    start: int = 0,
    stop: int | None = None,
    op: ReduceOp | str = ReduceOp.SUM,
    tag_base: int = 0,
    timeout_s: float = 60.0,
    scratch: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Reduce ``tensor[start:stop]`` across the ring; return the range this rank now owns.

    Step s: send part ``p-s-1`` to the right, receive part ``p-s-2`` from the left and
    reduce it into place, so after n-1 steps part ``p`` holds the reduction of all ranks.
    """
    stop = tensor.numel() if stop is None else stop
    n, p = ring.size, ring.position
    parts = split(start, stop, n)
    if n == 1:
        return parts[0]
    combine = reducer(op)
    biggest = max(b - a for a, b in parts)
    if scratch is None or scratch.numel() < biggest:
        scratch = torch.empty(biggest, dtype=tensor.dtype, device=tensor.device)
    deadline_s = time.monotonic() + timeout_s
    for s in range(n - 1):
        send_a, send_b = parts[(p - s - 1) % n]
        recv_a, recv_b = parts[(p - s - 2) % n]
        incoming = scratch[: recv_b - recv_a]
        _exchange(
            ring,
            tensor[send_a:send_b],
            incoming,
            tag_base + s,
            deadline_s,
            f"ReduceScatter step {s} on dims {ring.dims}",
        )
        if recv_b > recv_a:
            combine(tensor[recv_a:recv_b], incoming)
    return parts[p]


def ring_all_gather(
    tensor: torch.Tensor,
    ring: Ring,
    *,
    start: int = 0,
    stop: int | None = None,
    tag_base: int = 0,
    timeout_s: float = 60.0,
) -> None:
    """Fill ``tensor[start:stop]`` on every rank from part ``p`` held by ring position ``p``.

    Step s: send part ``p-s`` to the right, receive part ``p-s-1`` from the left in place.
    """
    stop = tensor.numel() if stop is None else stop
    n, p = ring.size, ring.position
    if n == 1:
        return
    parts = split(start, stop, n)
    deadline_s = time.monotonic() + timeout_s
    for s in range(n - 1):
        send_a, send_b = parts[(p - s) % n]
        recv_a, recv_b = parts[(p - s - 1) % n]
        _exchange(
            ring,
            tensor[send_a:send_b],
            tensor[recv_a:recv_b],
            tag_base + s,
            deadline_s,
            f"AllGather step {s} on dims {ring.dims}",
        )


def check_dtype(dtype: torch.dtype, op: ReduceOp | str, *, action: str = "all-reduce") -> None:
    """Refuse dtypes the ring cannot reduce exactly as torch's collective would, before any traffic."""
    supported = {
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    }
    if dtype not in supported:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in supported))
        raise HipipeError(f"cannot {action} dtype {str(dtype).removeprefix('torch.')} (supported: {names})")
    if ReduceOp(op) is ReduceOp.AVG and not dtype.is_floating_point:
        raise HipipeError(f"op avg needs a floating-point dtype, got {str(dtype).removeprefix('torch.')}")


_TORCH_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.AVG: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
}


def _group_order(ring: Ring) -> list[int]:
    """For each group rank, its position in the ring (they differ when a mesh places ranks freely)."""
    return [ring.ranks.index(dist.get_global_rank(ring.group, g)) for g in range(ring.size)]


def native_reduce_scatter(
    tensor: torch.Tensor,
    ring: Ring,
    *,
    start: int = 0,
    stop: int | None = None,
    op: ReduceOp | str = ReduceOp.SUM,
    timeout_s: float = 60.0,
) -> tuple[int, int]:
    """Same contract as :func:`ring_reduce_scatter`, with the backend's own collective.

    For NCCL, whose ReduceScatter is the fast path. Parts are padded to one width (they
    differ by at most one element) because the equal-size collective is the one every
    backend implements; the padding is never read back.
    """
    stop = tensor.numel() if stop is None else stop
    parts = split(start, stop, ring.size)
    if ring.size == 1:
        return parts[0]
    width = max(b - a for a, b in parts)
    inputs = []
    for position in _group_order(ring):
        a, b = parts[position]
        padded = tensor.new_zeros(width)
        padded[: b - a] = tensor[a:b]
        inputs.append(padded)
    output = tensor.new_empty(width)
    work = dist.reduce_scatter(output, inputs, op=_TORCH_OPS[ReduceOp(op)], group=ring.group, async_op=True)
    _wait([work], time.monotonic() + timeout_s, f"ReduceScatter on dims {ring.dims}")
    a, b = parts[ring.position]
    tensor[a:b].copy_(output[: b - a])
    return parts[ring.position]


def native_all_gather(
    tensor: torch.Tensor,
    ring: Ring,
    *,
    start: int = 0,
    stop: int | None = None,
    timeout_s: float = 60.0,
) -> None:
    """Same contract as :func:`ring_all_gather`, with the backend's own (padded) collective."""
    stop = tensor.numel() if stop is None else stop
    if ring.size == 1:
        return
    parts = split(start, stop, ring.size)
    width = max(b - a for a, b in parts)
    a, b = parts[ring.position]
    mine = tensor.new_zeros(width)
    mine[: b - a] = tensor[a:b]
    outputs = [tensor.new_empty(width) for _ in range(ring.size)]
    work = dist.all_gather(outputs, mine, group=ring.group, async_op=True)
    _wait([work], time.monotonic() + timeout_s, f"AllGather on dims {ring.dims}")
    for output, position in zip(outputs, _group_order(ring), strict=True):
        a, b = parts[position]
        tensor[a:b].copy_(output[: b - a])
