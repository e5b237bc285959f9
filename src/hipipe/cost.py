"""The alpha-beta cost model, written out once (HIPIPE.md sections 3, 4 and 7).

An op is a ReduceScatter (RS) or AllGather (AG) over a *group* of dimensions: one
dimension for the hierarchical algorithms, all of them for the flat ring. ``full_bytes``
is the per-NPU buffer on the wide side of the op: the RS input, the AG output.

- one dimension k:   ``t = latency_steps_k * a_k + (n_k - 1)/n_k * S / B_k``
- a group G (flat ring over n = prod n_k NPUs): n-1 steps, each bottlenecked by the
  slowest dimension it crosses: ``t = (n-1) * max_k (hops_k * a_k + S/n / B_k)``.
  For a single ring-algorithm dimension both formulas agree.
"""

import math
from collections.abc import Sequence

from hipipe.topology import HOPS_PER_STEP, Topology


def group_size(topology: Topology, dims: Sequence[int]) -> int:
    """NPUs in a group spanning ``dims``."""
    return math.prod(topology.dims[k].size for k in dims)


def op_time_s(topology: Topology, dims: Sequence[int], full_bytes: float) -> float:
    """Duration of one RS or AG over ``dims`` whose wide side is ``full_bytes`` per NPU."""
    constant_s, per_byte_s = op_time_coefficients(topology, dims)
    if len(dims) == 1:
        return constant_s + per_byte_s * full_bytes
    n = group_size(topology, dims)
    return (n - 1) * max(
        HOPS_PER_STEP[topology.dims[k].kind] * topology.dims[k].latency_s
        + full_bytes / n / topology.dims[k].bandwidth_bytes_per_s
        for k in dims
    )


def op_time_coefficients(topology: Topology, dims: Sequence[int]) -> tuple[float, float]:
    """``(constant_s, per_byte_s)`` with ``time = constant_s + per_byte_s * full_bytes``.

    Exact for single-dimension ops, which is what makes chunk sizing a linear program.
    For a multi-dimension group it is exact only when one dimension is the bottleneck
    of both terms; :func:`op_time_s` is the reference.
    """
    if len(dims) == 1:
        dim = topology.dims[dims[0]]
        return dim.latency_s * dim.latency_steps, (dim.size - 1) / dim.size / (dim.bandwidth_bytes_per_s)
    n = group_size(topology, dims)
    slowest_latency = max(HOPS_PER_STEP[topology.dims[k].kind] * topology.dims[k].latency_s for k in dims)
    slowest_bandwidth = min(topology.dims[k].bandwidth_bytes_per_s for k in dims)
    return (n - 1) * slowest_latency, (n - 1) / n / slowest_bandwidth


def lower_bound_s(topology: Topology, message_bytes: float) -> float:
    """``T* = 2 (N-1)/N * M / sum_k B_k``: every link of every NPU busy all the time."""
    n = topology.num_npus
    return 2 * (n - 1) / n * message_bytes / sum(d.bandwidth_bytes_per_s for d in topology.dims)


def volume_per_byte(topology: Topology, order: Sequence[int]) -> list[float]:
    """``V_k(pi) = 2 (n_k-1)/n_k / prod_{j before k in pi} n_j`` for every dimension k.

    Bytes dimension k carries (RS + AG) per byte of message for a chunk in ``order``.
    Sums to ``2 (N-1)/N`` whatever the order.
    """
    volumes = [0.0] * topology.num_dims
    shrink = 1.0
    for k in order:
        n_k = topology.dims[k].size
        volumes[k] = 2 * (n_k - 1) / n_k / shrink
        shrink *= n_k
    return volumes


def utilization(topology: Topology, message_bytes: float, time_s: float) -> float:
    """Bandwidth utilization ``U = T* / T``."""
    return lower_bound_s(topology, message_bytes) / time_s if time_s > 0 else 0.0


def algbw_bytes_per_s(message_bytes: float, time_s: float) -> float:
    """nccl-tests ``algbw = M / t``."""
    return message_bytes / time_s


def busbw_bytes_per_s(message_bytes: float, time_s: float, num_npus: int) -> float:
    """nccl-tests ``busbw = algbw * 2 (N-1)/N``."""
    return algbw_bytes_per_s(message_bytes, time_s) * 2 * (num_npus - 1) / num_npus
