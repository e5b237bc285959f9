"""Bounds on any schedule: the order-mix bound ``T_mix`` (HIPIPE.md sections 5 and 7).

The *fluid LP* of section 5, step 1: choose what fraction ``x_pi`` of the message
travels the dimensions in each order ``pi`` so that the busiest dimension is as idle as
possible, ignoring latency and pipeline fill/drain::

    min T  s.t.  sum_pi x_pi V_k(pi) M / B_k <= T  (every dim k),  sum_pi x_pi = 1,  x >= 0

Its optimum ``T_mix`` is the best any mix of hierarchical orders can do with perfect
pipelining; ``T_mix >= T*`` (:func:`hipipe.cost.lower_bound_s`). It is linear in ``M``,
so the LP is solved once per topology, per byte. The physical limit ``T*`` lives in
:mod:`hipipe.cost`, next to the formulas it comes from.
"""

import itertools
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from hipipe.cost import volume_per_byte
from hipipe.errors import SolverError
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


def order_mix(topology: Topology) -> OrderMix:
    """Solve the fluid LP over all ``D!`` orders with HiGHS; return the mix's support.

    Per-byte times are rescaled so the largest coefficient is 1 (the LP is then well
    conditioned whatever the bandwidths), and scaled back afterwards.
    """
    num_dims = topology.num_dims
    orders = list(itertools.permutations(range(num_dims)))
    inverse_bandwidth = np.array([1.0 / d.bandwidth_bytes_per_s for d in topology.dims])
    # load[k, p]: seconds dimension k spends per byte of message in order p.
    load = np.array([volume_per_byte(topology, order) for order in orders]).T * inverse_bandwidth[:, None]
    scale = float(load.max())
    coefficients = load / scale
    num_orders = len(orders)
    # Columns: x_0 .. x_{P-1}, T. Rows: D load rows (sum_p c_kp x_p - T <= 0), then sum x = 1.
    rows = np.vstack(
        [np.hstack([coefficients, -np.ones((num_dims, 1))]), np.append(np.ones(num_orders), 0.0)]
    )
    row_lower = np.append(np.full(num_dims, -np.inf), 1.0)
    row_upper = np.append(np.zeros(num_dims), 1.0)
    cost = np.append(np.zeros(num_orders), 1.0)
    col_lower = np.zeros(num_orders + 1)
    col_upper = np.append(np.ones(num_orders), np.inf)
    lp = highspy.HighsLp()
    lp.num_col_ = num_orders + 1
    lp.num_row_ = num_dims + 1
    lp.col_cost_ = cost
    lp.col_lower_ = col_lower
    lp.col_upper_ = col_upper
    lp.row_lower_ = row_lower
    lp.row_upper_ = row_upper
    nonzero_cols, nonzero_rows = np.nonzero(rows.T)  # column-major order, as CSC wants
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(nonzero_cols, np.arange(num_orders + 2)).astype(np.int32)
    lp.a_matrix_.index_ = nonzero_rows.astype(np.int32)
    lp.a_matrix_.value_ = rows[nonzero_rows, nonzero_cols]
    solver = new_highs()
    solver.passModel(lp)
    run_and_check(solver, "the order-mix LP")
    x = np.clip(np.asarray(solver.getSolution().col_value[:num_orders]), 0.0, None)
    if not x.sum() > 0:
        raise SolverError("order-mix LP returned an empty mix")
    x /= x.sum()
    support = [p for p in np.argsort(-x, kind="stable") if x[p] > SUPPORT_EPSILON]
    weights = x[support] / x[support].sum()
    loads = load[:, support] @ weights
    return OrderMix(
        orders=tuple(orders[p] for p in support),
        weights=tuple(float(w) for w in weights),
        time_per_byte_s=float(loads.max()),
        load_per_byte_s=tuple(float(v) for v in loads),
    )


def order_mix_bound_s(topology: Topology, message_bytes: float) -> float:
    """``T_mix``: optimum of the fluid LP for a message of ``message_bytes``."""
    return order_mix(topology).time_per_byte_s * message_bytes


def latency_floor_s(topology: Topology, num_chunks: int) -> float:
    """Latency every dimension pays with ``num_chunks`` chunks: ``2 K a_k steps_k``, the largest.

    Each chunk runs one RS and one AG on every dimension, whatever its order.
    """
    return max(2 * num_chunks * d.latency_s * d.latency_steps for d in topology.dims)


def new_highs() -> Any:
    """A silent HiGHS instance.

    ``highspy.Highs()`` prints a banner on stdout from its constructor (before any option
    can be set), which would end up in the middle of ``hipipe plan``'s output; the core
    class it wraps does not, and has every method the planner uses.
    """
    core = getattr(highspy, "_core", None)
    solver = core._Highs() if core is not None and hasattr(core, "_Highs") else highspy.Highs()
    solver.setOptionValue("output_flag", False)
    return solver


def run_and_check(solver: Any, what: str) -> None:
    """Solve; raise :class:`SolverError` naming the LP and HiGHS' status unless optimal."""
    solver.run()
    status = solver.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise SolverError(f"HiGHS did not solve {what}: model status {solver.modelStatusToString(status)}")
