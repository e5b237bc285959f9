"""Chunk orders to try for a given K: the *order families* of the search.

The fluid LP says which orders and how many bytes each (:mod:`hipipe.bounds`), but not
how to lay them out over K chunks, nor what is best when latency dominates; each family
is one answer, and the LP on each tells which works for this network and message.
"""

from hipipe.bounds import OrderMix
from hipipe.planners.baselines import themis_ideal_orders
from hipipe.planners.hipipe.structure import Order, assign_orders, bookend_orders, one_end_orders
from hipipe.schedule import Collective
from hipipe.topology import Topology

FASTEST_FIRST_MAX_CHUNKS = 8
"""Fastest-first orders are tried up to this K; beyond, only the mix can keep dims busy."""

ROTATIONS_MAX_CHUNKS = 4
"""Rotated orders are tried up to this K: what they fix (dims idle while the first chunks
fill the pipeline) weighs most when there are few chunks."""

FEW_CHUNK_FAMILIES: frozenset[str] = frozenset({"rotations"})
"""Families tried at few chunks only (the search does not measure the others against them)."""


def fastest_first(topology: Topology) -> Order:
    """The order that makes one chunk's chain shortest: dims by descending bandwidth.

    Swapping adjacent dims i, j changes the chain's bandwidth time by a factor of
    ``1/B_i - 1/B_j`` (the ``(n-1)/n`` terms cancel), so faster dims go first. Every
    order pays the same latencies, so this is the best single order for K = 1 and the
    natural one for latency-bound messages (few chunks, little to overlap).
    """
    return tuple(sorted(range(topology.num_dims), key=lambda k: (-topology.dims[k].bandwidth_bytes_per_s, k)))


def families(
    topology: Topology,
    message_bytes: float,
    mix: OrderMix,
    num_chunks: int,
    *,
    ascending_only: bool,
    collective: Collective = Collective.ALL_REDUCE,
) -> list[tuple[str, tuple[Order, ...]]]:
    """Chunk orders to try for this K: the fluid mix (AllReduce: with bookends when a
    light order would be left out; RS and AG: with the minor orders at one end), Themis'
    greedy orders, and fastest-first for small K."""
    if ascending_only:
        return [("ascending", (tuple(range(topology.num_dims)),) * num_chunks)]
    families = [("mix", assign_orders(mix.orders, mix.weights, num_chunks))]
    if num_chunks > 1:
        # Themis' greedy orders (least-loaded dims first, chunk by chunk): many distinct
        # orders where the mix has a few, which often fills and drains the pipeline better.
        greedy = tuple(
            tuple(k for group in order for k in group)
            for order in themis_ideal_orders(topology, int(message_bytes), num_chunks)
        )
        if greedy != families[0][1]:
            families.append(("greedy", greedy))
    if collective is Collective.ALL_REDUCE:
        bookends = bookend_orders(mix.orders, mix.weights, num_chunks)
        if bookends is not None and not set(mix.orders) <= set(families[0][1]):
            # Some order of the mix is too light to get a chunk of its own at this K: give
            # it a chunk at each end, where it keeps the dims it starts on busy.
            families.append(("mix-bookends", bookends))
    else:
        # A half chain (RS or AG alone) ends on another dim than it starts on, so the
        # minor orders go to one end at a time (:func:`.structure.one_end_orders`).
        for source, at_start in (("mix-front", True), ("mix-back", False)):
            one_end = one_end_orders(mix.orders, mix.weights, num_chunks, at_start=at_start)
            if one_end is not None and all(one_end != orders for _, orders in families):
                families.append((source, one_end))
    single = (fastest_first(topology),) * num_chunks
    if num_chunks <= FASTEST_FIRST_MAX_CHUNKS and single != families[0][1]:
        families.append(("fastest-first", single))
    if 2 <= num_chunks <= ROTATIONS_MAX_CHUNKS:
        rotated = rotations(single[0], num_chunks)
        if all(rotated != orders for _, orders in families):
            families.append(("rotations", rotated))
    return families


def rotations(order: Order, num_chunks: int) -> tuple[Order, ...]:
    """Chunk j in ``order`` rotated left by ``j mod D``: a Latin square of orders.

    Every dim is the first dim of some chunk (with K >= D), so each has work from the
    start and the pipeline fills on all dims at once; with K = D each dim sits at every
    level of exactly one chunk, so equal chunks load the dims alike. The mix and the
    greedy orders start most chunks on the same few dims; on libra-3d at 256 MiB the
    proven K = 3 optimum is this family ((0, 1, 2), (1, 2, 0), (2, 0, 1)).
    """
    num_dims = len(order)
    return tuple(order[j % num_dims :] + order[: j % num_dims] for j in range(num_chunks))
