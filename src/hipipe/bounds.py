"""Bounds on any schedule: the order-mix bound ``T_mix`` (derived in docs/MODEL.md).

The *fluid LP* of section 5, step 1: choose what fraction ``x_pi`` of the message
travels the dimensions in each order ``pi`` so that the busiest dimension is as idle as
possible, ignoring latency and pipeline fill/drain::

    min T  s.t.  sum_pi x_pi V_k(pi) M / B_k <= T  (every dim k),  sum_pi x_pi = 1,  x >= 0

Its optimum ``T_mix`` is the best any mix of hierarchical orders can do with perfect
pipelining; ``T_mix >= T*`` (:func:`hipipe.cost.lower_bound_s`). It is linear in ``M``,
so the LP is solved once per topology, per byte. The physical limit ``T*`` lives in
:mod:`hipipe.cost`, next to the formulas it comes from.

ReduceScatter and AllGather move each byte through one half of the AllReduce chain, so
every ``V_k(pi)`` is halved: the same mix is optimal and ``T_mix`` halves. The functions
below take the collective and scale the AllReduce loads by ``moves_per_byte / 2``.
"""

import itertools
import math
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from hipipe.errors import SolverError
from hipipe.schedule import Collective
from hipipe.topology import Topology

SUPPORT_EPSILON = 1e-9
"""Weights below this are solver noise, not part of the mix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderMix:
    """The optimal order mix of the fluid LP: which orders, what fraction of bytes each."""

    orders: tuple[tuple[int, ...], ...]
    """Orders of the support (flat tuples of dims), heaviest first."""
    weights: tuple[float, ...]
    """Fraction of the message per order; sums to 1."""
    time_per_byte_s: float
    """``T_mix / M``: the busiest dimension's time per byte of message."""
    load_per_byte_s: tuple[float, ...]
    """Each dimension's busy time per byte of message under the mix."""


def _per_byte_loads(topology: Topology) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """All orders, and ``load[k, p]``: seconds dim k spends per byte of message in order p."""
    num_dims = topology.num_dims
    orders = list(itertools.permutations(range(num_dims)))
    # volume_per_byte for every order at once (D! of them: 40,320 for D = 8).
    perms = np.array(orders, dtype=np.int64).reshape(len(orders), num_dims)
    sizes = np.array(topology.sizes, dtype=float)[perms]
    before = np.cumprod(np.hstack([np.ones((len(orders), 1)), sizes[:, :-1]]), axis=1)
    volumes = np.zeros((num_dims, len(orders)))
    columns = np.repeat(np.arange(len(orders)), num_dims)
    volumes[perms.ravel(), columns] = (2 * (sizes - 1) / sizes / before).ravel()
    inverse_bandwidth = np.array([1.0 / d.bandwidth_bytes_per_s for d in topology.dims])
    return orders, volumes * inverse_bandwidth[:, None]


def order_loads(topology: Topology) -> np.ndarray:
    """``load[k, p]``: seconds dim k spends per byte of message in the p-th order of
    ``itertools.permutations(range(D))`` (D! columns: worth computing once per plan)."""
    return _per_byte_loads(topology)[1]


def _fluid_lp(coefficients: np.ndarray, constants: np.ndarray) -> tuple[np.ndarray, float]:
    """``min T`` s.t. ``constants_k + sum_p coefficients[k, p] x_p <= T``, ``sum x = 1``, ``x >= 0``.

    Returns ``(x, T)``. The caller scales the data so its largest entry is about 1.
    """
    num_dims, num_orders = coefficients.shape
    # Columns: x_0 .. x_{P-1}, T. Rows: D load rows, then sum x = 1.
    rows = np.vstack(
        [np.hstack([coefficients, -np.ones((num_dims, 1))]), np.append(np.ones(num_orders), 0.0)]
    )
    lp = highspy.HighsLp()
    lp.num_col_ = num_orders + 1
    lp.num_row_ = num_dims + 1
    lp.col_cost_ = np.append(np.zeros(num_orders), 1.0)
    lp.col_lower_ = np.zeros(num_orders + 1)
    lp.col_upper_ = np.append(np.ones(num_orders), np.inf)
    lp.row_lower_ = np.append(np.full(num_dims, -np.inf), 1.0)
    lp.row_upper_ = np.append(-constants, 1.0)
    nonzero_cols, nonzero_rows = np.nonzero(rows.T)  # column-major order, as CSC wants
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(nonzero_cols, np.arange(num_orders + 2)).astype(np.int32)
    lp.a_matrix_.index_ = nonzero_rows.astype(np.int32)
    lp.a_matrix_.value_ = rows[nonzero_rows, nonzero_cols]
    solver = new_highs()
    solver.passModel(lp)
    run_and_check(solver, "the order-mix LP")
    values = np.asarray(solver.getSolution().col_value)
    x = np.clip(values[:num_orders], 0.0, None)
    if not x.sum() > 0:
        raise SolverError("the order-mix LP returned an empty mix")
    return x / x.sum(), float(values[-1])


def order_mix(topology: Topology) -> OrderMix:
    """Solve the fluid LP over all ``D!`` orders with HiGHS; return the mix's support.

    Per-byte times are rescaled so the largest coefficient is 1 (the LP is then well
    conditioned whatever the bandwidths), and scaled back afterwards.
    """
    orders, load = _per_byte_loads(topology)
    x, _ = _fluid_lp(load / float(load.max()), np.zeros(topology.num_dims))
    support = [p for p in np.argsort(-x, kind="stable") if x[p] > SUPPORT_EPSILON]
    weights = x[support] / x[support].sum()
    loads = load[:, support] @ weights
    return OrderMix(
        orders=tuple(orders[p] for p in support),
        weights=tuple(float(w) for w in weights),
        time_per_byte_s=float(loads.max()),
        load_per_byte_s=tuple(float(v) for v in loads),
    )


def half_chain_scale(collective: Collective) -> float:
    """Loads of ``collective`` relative to AllReduce's: 1 for AllReduce, 1/2 for RS or AG."""
    return collective.moves_per_byte / 2


def order_mix_bound_s(
    topology: Topology, message_bytes: float, collective: Collective = Collective.ALL_REDUCE
) -> float:
    """``T_mix``: optimum of the fluid LP for a message of ``message_bytes``."""
    return order_mix(topology).time_per_byte_s * message_bytes * half_chain_scale(collective)


def chunked_bound_s(
    topology: Topology,
    message_bytes: float,
    num_chunks: int,
    *,
    loads: np.ndarray | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> float:
    """A floor for every hierarchical schedule with ``num_chunks`` chunks.

    Each chunk runs ``h`` ops on every dim (``h`` = 2 for AllReduce, an RS and an AG; 1
    for RS or AG alone), each paying the dim's latency ``a_k steps_k``, on top of the
    dim's share of the fluid load: ``T >= min_x max_k (h K a_k steps_k + M load_k(x))``.
    Grows with K, so once it passes the best makespan found, no larger K can help (the
    planner stops its search there). ``loads`` is :func:`order_loads` of the topology
    (AllReduce loads, scaled here), when the caller has it already.
    """
    moves = collective.moves_per_byte
    constants = np.array([d.latency_s * d.latency_steps for d in topology.dims]) * moves * num_chunks
    load = (order_loads(topology) if loads is None else loads) * half_chain_scale(collective)
    scale = float(load.max()) * message_bytes + float(constants.max())
    _, time = _fluid_lp(load * message_bytes / scale, constants / scale)
    return time * scale


def latency_aware_bound_s(
    topology: Topology, message_bytes: float, collective: Collective = Collective.ALL_REDUCE
) -> float:
    """A floor for every hierarchical schedule once per-op latency is counted.

    One chunk overlaps nothing: its time is its whole chain, ``h sum_k a_k steps_k`` plus
    its order's bandwidth terms, at best in the order whose terms sum smallest (all D!
    orders are compared). Two chunks or more: :func:`chunked_bound_s` with K = 2. The
    floor is the smaller of the two; it shows when a utilization goal is out of reach of
    the cost model itself.
    """
    loads = order_loads(topology)
    moves = collective.moves_per_byte
    latency_s = sum(moves * d.latency_s * d.latency_steps for d in topology.dims)
    chain_s = latency_s + float(loads.sum(axis=0).min()) * half_chain_scale(collective) * message_bytes
    two_chunks_s = chunked_bound_s(topology, message_bytes, 2, loads=loads, collective=collective)
    return float(min(chain_s, two_chunks_s))


HIGHS_THREADS = 2
"""Threads of every HiGHS instance hipipe makes, on every machine.

HiGHS's default is the machine's hardware concurrency, and its MIP search takes another
path on one thread than on more: on one thread, two tests of ``test_sequence_mip`` (held-out
4-dim plans whose steps the tests measure) planned differently from two threads. Pinned,
a 1-core runner plans as a workstation does; on the 2-core development host
two threads is HiGHS's default (two generated 3- and 4-dim plans of 16-21 s came out bit for
bit the same as before the pin), and four threads gave the same plans and the same results
in ``test_sequence_mip`` as two."""


def new_highs() -> Any:
    """A silent HiGHS instance with :data:`HIGHS_THREADS` threads.

    ``highspy.Highs()`` prints a banner on stdout from its constructor (before any option
    can be set), which would end up in the middle of ``hipipe plan``'s output; the core
    class it wraps does not, and has every method the planner uses.
    """
    core = getattr(highspy, "_core", None)
    solver = core._Highs() if core is not None and hasattr(core, "_Highs") else highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("threads", HIGHS_THREADS)
    return solver


def run_and_check(solver: Any, what: str) -> None:
    """Solve; raise :class:`SolverError` naming the LP and HiGHS' status unless optimal."""
    solver.run()
    status = solver.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(f"HiGHS did not solve {what}: model status {solver.modelStatusToString(status)}")


FILL_DRAIN_MAX_DIMS = 6
"""Up to this many dims :func:`pipeline_bound_s` enumerates every set of first dims
(``2^D - 1`` small LPs over at most ``D!`` orders); beyond it, it keeps the K >= 2 latency
term alone, which is still a valid floor."""


def pipeline_bound_s(
    topology: Topology,
    message_bytes: float,
    collective: Collective | str = Collective.ALL_REDUCE,
    *,
    min_chunks: int = 1,
) -> float:
    """``T_pipe``: a floor for every hierarchical schedule, whatever its number of chunks.

    Combines, per dim, the latency every chunk pays there, the bytes the dim carries
    under the best order mix, and the pipeline's fill and drain: a dim that no chunk
    visits first waits for another dim's op before its first op (RS) and after its last
    one (AG). The derivation is in ``docs/MODEL.md`` ("A pipeline lower bound").

    - K = 1: the chunk's whole chain, latency and bytes, in its best order;
    - K >= 2: for every non-empty set F of dims that chunks start on (K >= |F|):
      ``min_x max_k (m max(|F|, 2) c_k + M load_k(x) + [k not in F] m min_{f in F} c_f)``
      over mixes x of orders that start in F (``c_k = a_k steps_k``, ``m`` = 2 for
      AllReduce, 1 for ReduceScatter or AllGather); the floor is the smallest over F.

    The smaller of the two cases is the bound. Never below :func:`chunked_bound_s` at
    K = 2 (for AllReduce), so never below :func:`latency_aware_bound_s` either.

    ``min_chunks`` restricts the floor to schedules with at least that many chunks (the
    latency count becomes ``max(|F|, min_chunks)``): with a proven floor for fewer chunks
    (the exact planner's dual bound), the two together bound every K.
    """
    if min_chunks < 1:
        raise ValueError(f"min_chunks must be >= 1, got {min_chunks}")
    moves = Collective.parse(collective).moves_per_byte
    orders, per_byte = _per_byte_loads(topology)
    load = per_byte * (moves / 2) * message_bytes  # seconds on dim k for the whole message, per order
    latency = np.array([d.latency_s * d.latency_steps for d in topology.dims])
    one_chunk_s = (
        moves * float(latency.sum()) + float(load.sum(axis=0).min()) if min_chunks == 1 else math.inf
    )
    num_dims = topology.num_dims
    first = np.array([order[0] for order in orders])
    if num_dims <= FILL_DRAIN_MAX_DIMS:
        first_sets = [
            list(subset)
            for size in range(1, num_dims + 1)
            for subset in itertools.combinations(range(num_dims), size)
        ]
    else:
        first_sets = [list(range(num_dims))]
    many_chunks_s = float("inf")
    for first_set in first_sets:
        columns = np.isin(first, first_set)
        outside = ~np.isin(np.arange(num_dims), first_set)
        if num_dims <= FILL_DRAIN_MAX_DIMS:
            count = max(len(first_set), 2, min_chunks)
            fill_drain = np.where(outside, moves * float(latency[first_set].min()), 0.0)
        else:
            count, fill_drain = max(2, min_chunks), np.zeros(num_dims)
        constants = moves * count * latency + fill_drain
        scale = max(float(load.max()) + float(constants.max()), 1e-300)
        _, time = _fluid_lp(load[:, columns] / scale, constants / scale)
        # A chunk's chain alone pays every latency once per phase, whatever its size.
        many_chunks_s = min(many_chunks_s, max(time * scale, moves * float(latency.sum())))
    return min(one_chunk_s, many_chunks_s)


def best_bound_s(
    topology: Topology, message_bytes: float, collective: Collective | str = Collective.ALL_REDUCE
) -> float:
    """``max(T_mix, T_pipe)``: the tightest floor hipipe knows (T_mix scaled to the collective)."""
    moves = Collective.parse(collective).moves_per_byte
    t_mix = order_mix_bound_s(topology, message_bytes) * moves / 2
    return max(t_mix, pipeline_bound_s(topology, message_bytes, collective))
