"""The baselines of HIPIPE.md section 6, evaluated under the same cost model.

Each one only decides chunks (sizes and dimension orders) and a queue policy; the
simulator (:mod:`hipipe.simulator`) times the ops, so no baseline computes its own time.
"""

from hipipe.cost import volume_per_byte
from hipipe.schedule import Chunk, Collective, Schedule
from hipipe.simulator import Policy, simulate_chunks
from hipipe.topology import Topology

DEFAULT_NUM_CHUNKS = 64
"""ASTRA-sim's usual split count for the pipelined and Themis baselines."""

THEMIS_THRESHOLD_FRACTION = 1 / 16
"""Themis keeps the ascending order while the load gap is below chunk_size/16 bytes."""


def ascending(topology: Topology) -> tuple[tuple[int, ...], ...]:
    return tuple((k,) for k in range(topology.num_dims))


def equal_chunks(
    message_bytes: int, num_chunks: int, orders: list[tuple[tuple[int, ...], ...]]
) -> list[Chunk]:
    size = message_bytes / num_chunks
    return [Chunk(index=j, size_bytes=size, order=orders[j]) for j in range(num_chunks)]


def plan_ring(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """Flat ring AllReduce over all N NPUs: one RS and one AG spanning every dimension."""
    del num_chunks  # a flat ring is one collective; chunking it changes nothing in this model
    chunk = Chunk(index=0, size_bytes=float(message_bytes), order=(tuple(range(topology.num_dims)),))
    return simulate_chunks(
        topology, message_bytes, [chunk], policy=Policy.FIFO, planner="ring", collective=collective
    )


def plan_hierarchical(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """One chunk, RS over dimensions 0..D-1, AG back: one dimension busy at a time."""
    del num_chunks
    chunk = Chunk(index=0, size_bytes=float(message_bytes), order=ascending(topology))
    return simulate_chunks(
        topology, message_bytes, [chunk], policy=Policy.FIFO, planner="hierarchical", collective=collective
    )


def plan_pipelined(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """K equal chunks, all in ascending order, FIFO on every dimension."""
    k = num_chunks or DEFAULT_NUM_CHUNKS
    chunks = equal_chunks(message_bytes, k, [ascending(topology)] * k)
    return simulate_chunks(
        topology,
        message_bytes,
        chunks,
        policy=Policy.FIFO,
        planner="pipelined",
        info={"num_chunks": k},
        collective=collective,
    )


def themis_orders(
    topology: Topology, message_bytes: int, num_chunks: int
) -> list[tuple[tuple[int, ...], ...]]:
    """Themis' OfflineGreedy: each chunk visits the least-loaded dimensions first.

    Load is the accumulated busy time of a dimension: a chunk of c bytes adds
    ``(n_d-1)/n_d * c / B_d`` to dimension d and shrinks to ``c / n_d``. While the gap
    between the most and least loaded dimension, converted to bytes at the least-loaded
    dimension's bandwidth, is below chunk_size/16, the ascending order is kept.
    """
    chunk_bytes = message_bytes / num_chunks
    loads_s = [0.0] * topology.num_dims
    orders: list[tuple[tuple[int, ...], ...]] = []
    for _ in range(num_chunks):
        by_load = sorted(range(topology.num_dims), key=lambda d: (loads_s[d], d))
        least = by_load[0]
        gap_bytes = (max(loads_s) - loads_s[least]) * topology.dims[least].bandwidth_bytes_per_s
        order = (
            tuple(range(topology.num_dims))
            if gap_bytes < chunk_bytes * THEMIS_THRESHOLD_FRACTION
            else tuple(by_load)
        )
        volumes = volume_per_byte(topology, order)
        for d in range(topology.num_dims):
            # RS half of V_d (the AG half doubles every load equally and cannot reorder them).
            loads_s[d] += volumes[d] / 2 * chunk_bytes / topology.dims[d].bandwidth_bytes_per_s
        orders.append(tuple((k,) for k in order))
    return orders


def plan_themis(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """Themis (ISCA 2022) as in ASTRA-sim: OfflineGreedy orders, smallest-chunk-first queues."""
    k = num_chunks or DEFAULT_NUM_CHUNKS
    chunks = equal_chunks(message_bytes, k, themis_orders(topology, message_bytes, k))
    return simulate_chunks(
        topology,
        message_bytes,
        chunks,
        policy=Policy.SCF,
        planner="themis",
        info={"num_chunks": k},
        collective=collective,
    )
