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


def themis_ideal_orders(
    topology: Topology, message_bytes: int, num_chunks: int
) -> list[tuple[tuple[int, ...], ...]]:
    """The idealized greedy orders ``themis-ideal`` uses: least-loaded dimensions first.

    Load is the accumulated ReduceScatter bandwidth time of a dimension: a chunk of c
    bytes adds ``(n_d-1)/n_d * c / B_d`` to dimension d and shrinks to ``c / n_d``. Dims are
    sorted afresh for every chunk (ties by index). While the gap between the most and
    least loaded dimension, converted to bytes at the least-loaded dimension's bandwidth
    (without ASTRA-sim's ``(n-1)/n``), is below chunk_size/16, the ascending order is kept.
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


def themis_chunk_sizes_bytes(message_bytes: int, num_chunks: int) -> list[int]:
    """ASTRA-sim's split: ``floor(M/K)`` bytes per chunk, the remainder added to the last."""
    base = message_bytes // num_chunks
    return [base] * (num_chunks - 1) + [message_bytes - base * (num_chunks - 1)]


def themis_orders(
    topology: Topology, message_bytes: int, num_chunks: int
) -> list[tuple[tuple[int, ...], ...]]:
    """Themis' OfflineGreedy orders, with the rules of ASTRA-sim's implementation.

    A persistent list of the dims is kept sorted by *load*: the seconds of ReduceScatter
    bandwidth time each dim has been given (latency not counted). For each chunk the list
    is re-sorted with a stable sort, so dims with equal loads keep the list's previous
    order. With d the least-loaded dim and ``gap_s`` the largest load minus d's, the gap in
    bytes is ``gap_s * B_d / ((n_d - 1) / n_d)`` (the RS input that d would need to catch
    up); below ``floor(M/K) / 16`` the chunk takes the ascending order 0..D-1 and the list
    goes back to index order, otherwise it takes the list's order. The chunk's loads then
    grow along its order, the chunk shrinking by each dim's size.

    ReduceScatter, AllGather and AllReduce share these orders: with ``order`` read in RS
    order an AllGather gives every dim the same bytes as the RS half, and ASTRA-sim's
    AllGather rule (sort, reverse, convert the gap at the last-visited dim) is this one
    mirrored.
    """
    dims = topology.dims
    loads_s = [0.0] * topology.num_dims
    by_load = list(range(topology.num_dims))
    orders: list[tuple[tuple[int, ...], ...]] = []
    for size_bytes in themis_chunk_sizes_bytes(message_bytes, num_chunks):
        by_load.sort(key=lambda d: loads_s[d])  # list.sort is stable: ties keep the last order
        least = by_load[0]
        n_least = dims[least].size
        gap_bytes = (
            (loads_s[by_load[-1]] - loads_s[least])
            * dims[least].bandwidth_bytes_per_s
            * n_least
            / (n_least - 1)
        )
        if gap_bytes < (message_bytes // num_chunks) * THEMIS_THRESHOLD_FRACTION:
            order = tuple(range(topology.num_dims))
            by_load = list(order)
        else:
            order = tuple(by_load)
        piece_bytes = float(size_bytes)
        for d in order:
            loads_s[d] += (dims[d].size - 1) / dims[d].size * piece_bytes / dims[d].bandwidth_bytes_per_s
            piece_bytes /= dims[d].size
        orders.append(tuple((k,) for k in order))
    return orders


def plan_themis(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """Themis (ISCA 2022) as ASTRA-sim runs it, one op per dim at a time.

    OfflineGreedy orders (:func:`themis_orders`), ``floor(M/K)``-byte chunks with the
    remainder in the last, and ASTRA-sim's smallest-first ready list on every dim
    (:attr:`Policy.ASTRA_SCF`).
    """
    k = num_chunks or DEFAULT_NUM_CHUNKS
    orders = themis_orders(topology, message_bytes, k)
    chunks = [
        Chunk(index=j, size_bytes=float(size), order=orders[j])
        for j, size in enumerate(themis_chunk_sizes_bytes(message_bytes, k))
    ]
    return simulate_chunks(
        topology,
        message_bytes,
        chunks,
        policy=Policy.ASTRA_SCF,
        planner="themis",
        info={"num_chunks": k},
        collective=collective,
    )


def plan_themis_ideal(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """An idealized Themis, stronger than ASTRA-sim's: equal chunks, orders re-sorted
    afresh for each chunk (:func:`themis_ideal_orders`), smallest-first queues that are
    FIFO among equal sizes (:attr:`Policy.SCF`)."""
    k = num_chunks or DEFAULT_NUM_CHUNKS
    chunks = equal_chunks(message_bytes, k, themis_ideal_orders(topology, message_bytes, k))
    return simulate_chunks(
        topology,
        message_bytes,
        chunks,
        policy=Policy.SCF,
        planner="themis-ideal",
        info={"num_chunks": k},
        collective=collective,
    )
