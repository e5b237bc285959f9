"""The alpha-beta cost model, written out once (derived in docs/MODEL.md).

An op is a ReduceScatter (RS) or AllGather (AG) over a *group* of dimensions: one
dimension for the hierarchical algorithms, all of them for the flat ring. ``full_bytes``
is the per-NPU buffer on the wide side of the op: the RS input, the AG output.

- one dimension k:   ``t = latency_steps_k * a_k + (n_k - 1)/n_k * S / B_k``
- a group G (flat ring over n = prod n_k NPUs): n-1 steps, each bottlenecked by the
  slowest dimension it crosses: ``t = (n-1) * max_k (hops_k * a_k + S/n / B_k)``.
  For a single ring-algorithm dimension both formulas agree.

A topology's calibrated :class:`~hipipe.overheads.Overheads` add, to every op, the fixed
``op_s`` and, to a ReduceScatter, the local reduction ``3 (n-1)/n S / memory_bytes_per_s``
(``n`` the group's NPUs). Both are linear, so the coefficients stay exact.
"""

import math
from collections.abc import Sequence

from hipipe.schedule import Collective, Phase
from hipipe.topology import HOPS_PER_STEP, Topology


def group_size(topology: Topology, dims: Sequence[int]) -> int:
    """NPUs in a group spanning ``dims``."""
    return math.prod(topology.dims[k].size for k in dims)


def op_time_s(
    topology: Topology, dims: Sequence[int], full_bytes: float, phase: Phase | None = None
) -> float:
    """Duration of one RS or AG over ``dims`` whose wide side is ``full_bytes`` per NPU.

    ``phase`` matters only with a calibrated memory bandwidth: a ReduceScatter also pays
    its local reduction. ``None`` means an AllGather-like op (no reduction).
    """
    overheads = topology.overheads
    extra_s = overheads.op_s
    if phase is Phase.RS:
        extra_s += overheads.reduction_s(group_size(topology, dims), full_bytes)
    if len(dims) == 1:
        constant_s, per_byte_s = _alpha_beta(topology, dims)
        return constant_s + per_byte_s * full_bytes + extra_s
    n = group_size(topology, dims)
    return extra_s + (n - 1) * max(
        HOPS_PER_STEP[topology.dims[k].kind] * topology.dims[k].latency_s
        + full_bytes / n / topology.dims[k].bandwidth_bytes_per_s
        for k in dims
    )


def op_time_coefficients(
    topology: Topology, dims: Sequence[int], phase: Phase | None = None
) -> tuple[float, float]:
    """``(constant_s, per_byte_s)`` with ``time = constant_s + per_byte_s * full_bytes``.

    Exact for single-dimension ops, which is what makes chunk sizing a linear program.
    For a multi-dimension group it is exact only when one dimension is the bottleneck
    of both terms; :func:`op_time_s` is the reference. Includes the calibrated per-op
    cost and, for a ReduceScatter (``phase``), the local reduction.
    """
    constant_s, per_byte_s = _alpha_beta(topology, dims)
    overheads = topology.overheads
    constant_s += overheads.op_s
    if phase is Phase.RS:
        per_byte_s += overheads.reduction_s_per_byte(group_size(topology, dims))
    return constant_s, per_byte_s


def _alpha_beta(topology: Topology, dims: Sequence[int]) -> tuple[float, float]:
    """The network's own ``(constant_s, per_byte_s)``: latency and bandwidth only."""
    if len(dims) == 1:
        dim = topology.dims[dims[0]]
        return dim.latency_s * dim.latency_steps, (dim.size - 1) / dim.size / (dim.bandwidth_bytes_per_s)
    n = group_size(topology, dims)
    slowest_latency = max(HOPS_PER_STEP[topology.dims[k].kind] * topology.dims[k].latency_s for k in dims)
    slowest_bandwidth = min(topology.dims[k].bandwidth_bytes_per_s for k in dims)
    return (n - 1) * slowest_latency, (n - 1) / n / slowest_bandwidth


def lower_bound_s(
    topology: Topology, message_bytes: float, collective: Collective = Collective.ALL_REDUCE
) -> float:
    """``T* = h (N-1)/N * M / sum_k B_k``: every link of every NPU busy all the time.

    ``h`` is :attr:`Collective.moves_per_byte`: 2 for AllReduce (an RS then an AG), 1 for
    ReduceScatter or AllGather alone. ``M`` is always the full per-rank buffer.
    """
    n = topology.num_npus
    moves = collective.moves_per_byte
    return moves * (n - 1) / n * message_bytes / sum(d.bandwidth_bytes_per_s for d in topology.dims)


def volume_per_byte(
    topology: Topology, order: Sequence[int], collective: Collective = Collective.ALL_REDUCE
) -> list[float]:
    """``V_k(pi) = h (n_k-1)/n_k / prod_{j before k in pi} n_j`` for every dimension k.

    Bytes dimension k carries per byte of message for a chunk in ``order`` (``h`` as in
    :func:`lower_bound_s`). Sums to ``h (N-1)/N`` whatever the order.
    """
    moves = collective.moves_per_byte
    volumes = [0.0] * topology.num_dims
    shrink = 1.0
    for k in order:
        n_k = topology.dims[k].size
        volumes[k] = moves * (n_k - 1) / n_k / shrink
        shrink *= n_k
    return volumes


def utilization(
    topology: Topology, message_bytes: float, time_s: float, collective: Collective = Collective.ALL_REDUCE
) -> float:
    """Bandwidth utilization ``U = T* / T`` (``T*`` of the same collective)."""
    return lower_bound_s(topology, message_bytes, collective) / time_s if time_s > 0 else 0.0


def algbw_bytes_per_s(message_bytes: float, time_s: float) -> float:
    """nccl-tests ``algbw = M / t`` (``M`` the full per-rank buffer for every collective)."""
    return message_bytes / time_s


def bus_factor(num_npus: int, collective: Collective = Collective.ALL_REDUCE) -> float:
    """nccl-tests' busbw factor: ``2 (N-1)/N`` for AllReduce, ``(N-1)/N`` for RS and AG."""
    return collective.moves_per_byte * (num_npus - 1) / num_npus


def busbw_bytes_per_s(
    message_bytes: float, time_s: float, num_npus: int, collective: Collective = Collective.ALL_REDUCE
) -> float:
    """nccl-tests ``busbw = algbw * bus_factor``: comparable with the links' speed for every kind."""
    return algbw_bytes_per_s(message_bytes, time_s) * bus_factor(num_npus, collective)
