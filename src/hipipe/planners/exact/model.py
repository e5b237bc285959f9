"""The mixed-integer program behind the ``exact`` planner, built for HiGHS.

Decision variables, for K chunks on D dims (``P = D!`` orders):

- ``u_j`` (binary): chunk j is used; unused chunks have no ops that take time;
- ``y_jp`` (binary): chunk j travels in order p, ``sum_p y_jp = 1``;
- ``s_j`` (fraction of the message) and ``w_jp = y_jp s_j``, linearized exactly by
  ``sum_p w_jp = s_j``, ``0 <= w_jp <= y_jp`` (only the chosen order's ``w`` is nonzero);
- ``t_o``: start of op o. Ops are named (chunk, phase, dim): whatever the order, a chunk
  runs one op per phase on every dim, so each dim's set of ops is fixed and only the
  chain order and the per-dim sequence are decisions;
- ``x_uv`` (binary, one per pair of ops of different chunks on the same dim): u before v;
- ``T``: the makespan, minimized.

Op o of chunk j on dim k lasts ``c_k u_j + sum_p b_pk w_jp`` (``c_k`` the dim's latency
term, ``b_pk`` its per-byte term divided by the sizes of the dims before k in order p:
the op's wide side). Chain rows: for dims k before k' in chunk j's order (the sum of
``y_jp`` over such p), RS on k' starts after RS on k ends and AG on k after AG on k';
every AG starts after every RS of its chunk. Sequence rows: ``x_uv`` picks which of two
ops on a dim runs first. Times are in units of a known schedule's makespan U (a seed),
so ``T <= 1``, every op ends by 1, and 1 is a valid big-M for every disjunction.

Valid cuts that tighten the relaxation: each dim's total op time and each chunk's total
chain time are at most T; each op starts after the ops before it in its chunk's chain and
leaves time for those after it, summed per order (linear in ``y`` and ``w``, so they hold
in the relaxation where the big-M chain rows do not). On the held-out networks of seed 131
(ReduceScatter, K = 2..4, 60 s) they proved an instance the model without them left at a
20% gap (#6: 29.6 s) and took the MIP of #8 from 3.7 to 1.5 s; libra-4d at 1 GiB, K = 4:
36 to 18 s. Symmetry: chunks are interchangeable, so used chunks come
first, sorted by order index, then (``symmetry="size"``) by decreasing size within an
order, or (``symmetry="sequence"``) by when their first op runs on its dim within an order.

Why two ways to break the same symmetry: by size is what the planners' MIP starts fit
(:meth:`ExactModel.values_of` sorts by size) and what the exact planner was measured with.
By sequence fixes sequencing binaries outright, so branch-and-bound never visits the
permutations of chunks that share an order, and the floor proofs, which hold most chunks
on a few orders, are where that counts: libra-4d at 256 MiB (AllReduce, K = 5, nothing
below 1.5314 ms), four chunks in order (0, 1, 2, 3) and one in (1, 0, 2, 3): settled in
4.2 s by sequence, 35.7 s by size.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hipipe.bounds import new_highs
from hipipe.cost import op_time_coefficients
from hipipe.schedule import Chunk, Collective, Phase, Schedule
from hipipe.topology import Topology

Order = tuple[int, ...]

SYMMETRIES: tuple[str, ...] = ("size", "sequence")
"""How chunks sharing an order are told apart: by decreasing size, or by the start order
of their first-phase op on their first dim."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpKey:
    """An op of the model: chunk, phase (index into the collective's phases) and dim."""

    chunk: int
    phase: int
    dim: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Rows:
    """Constraint rows in compressed-row form, ready for ``Highs.addRows``."""

    lower: np.ndarray
    upper: np.ndarray
    starts: np.ndarray
    index: np.ndarray
    value: np.ndarray


def phases(collective: Collective) -> tuple[Phase, ...]:
    """The phases a chunk runs on every dim, in chain order of the halves."""
    if collective is Collective.ALL_REDUCE:
        return (Phase.RS, Phase.AG)
    return (Phase.RS,) if collective is Collective.REDUCE_SCATTER else (Phase.AG,)


class ExactModel:
    """Column layout, rows and the translation between MIP values and schedules.

    Built once per instance; holds only immutable data after ``__init__``.
    """

    def __init__(
        self,
        topology: Topology,
        message_bytes: int,
        num_chunks: int,
        collective: Collective,
        *,
        time_unit_s: float,
        symmetry: str = "size",
    ) -> None:
        if symmetry not in SYMMETRIES:
            raise ValueError(f"symmetry must be one of {', '.join(SYMMETRIES)}, got {symmetry!r}")
        self.symmetry = symmetry
        self.topology = topology
        self.message_bytes = message_bytes
        self.num_chunks = num_chunks
        self.collective = collective
        self.time_unit_s = time_unit_s
        self.phases = phases(collective)
        num_dims = topology.num_dims
        self.orders: list[Order] = list(itertools.permutations(range(num_dims)))
        coefficients = [op_time_coefficients(topology, (k,)) for k in range(num_dims)]
        self.latency = np.array([c for c, _ in coefficients]) / time_unit_s
        # per_byte[p, k]: time units per *message fraction* of a chunk in order p on dim k.
        self.per_byte = np.zeros((len(self.orders), num_dims))
        for p, order in enumerate(self.orders):
            for level, k in enumerate(order):
                before = math.prod(topology.dims[d].size for d in order[:level])
                self.per_byte[p, k] = coefficients[k][1] * message_bytes / before / time_unit_s
        self.ops = [
            OpKey(chunk=j, phase=ph, dim=k)
            for j in range(num_chunks)
            for ph in range(len(self.phases))
            for k in range(num_dims)
        ]
        self.op_column = {op: i for i, op in enumerate(self.ops)}
        self.pairs = [
            (a, b)
            for k in range(num_dims)
            for a, b in itertools.combinations([op for op in self.ops if op.dim == k], 2)
            if a.chunk != b.chunk
        ]
        # Column layout.
        num_orders = len(self.orders)
        self.u0 = 0
        self.y0 = self.u0 + num_chunks
        self.s0 = self.y0 + num_chunks * num_orders
        self.w0 = self.s0 + num_chunks
        self.t0 = self.w0 + num_chunks * num_orders
        self.x0 = self.t0 + len(self.ops)
        self.makespan_col = self.x0 + len(self.pairs)
        self.num_cols = self.makespan_col + 1

    # -- columns -------------------------------------------------------------------

    def y(self, chunk: int, order: int) -> int:
        return self.y0 + chunk * len(self.orders) + order

    def w(self, chunk: int, order: int) -> int:
        return self.w0 + chunk * len(self.orders) + order

    def t(self, op: OpKey) -> int:
        return self.t0 + self.op_column[op]

    def column_bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lower, upper, integer)``: binaries are u, y and x; everything lies in [0, 1]."""
        lower = np.zeros(self.num_cols)
        upper = np.ones(self.num_cols)
        integer = np.zeros(self.num_cols, dtype=np.uint8)
        integer[self.u0 : self.s0] = 1
        integer[self.x0 : self.makespan_col] = 1
        return lower, upper, integer

    # -- rows ------------------------------------------------------------------------

    def duration_terms(self, op: OpKey) -> dict[int, float]:
        """Columns and coefficients of op's duration (time units)."""
        terms = {self.u0 + op.chunk: float(self.latency[op.dim])}
        for p in range(len(self.orders)):
            terms[self.w(op.chunk, p)] = float(self.per_byte[p, op.dim])
        return terms

    def rows(self) -> Rows:
        """Every constraint of the model (see the module docstring)."""
        builder = RowBuilder()
        num_orders = len(self.orders)
        num_dims = self.topology.num_dims
        makespan = self.makespan_col
        for j in range(self.num_chunks):
            # One order each; unused chunks take order 0 (symmetry); sizes follow the order.
            builder.add({self.y(j, p): 1.0 for p in range(num_orders)}, 1.0, 1.0)
            builder.add({self.y(j, 0): 1.0, self.u0 + j: 1.0}, 1.0, math.inf)
            builder.add({self.s0 + j: 1.0, **{self.w(j, p): -1.0 for p in range(num_orders)}}, 0.0, 0.0)
            builder.add({self.s0 + j: 1.0, self.u0 + j: -1.0}, -math.inf, 0.0)
            for p in range(num_orders):
                builder.add({self.w(j, p): 1.0, self.y(j, p): -1.0}, -math.inf, 0.0)
        builder.add({self.s0 + j: 1.0 for j in range(self.num_chunks)}, 1.0, 1.0)
        for op in self.ops:
            # Every op ends by the makespan: T - t_o - d_o >= 0.
            builder.add(
                _combine({makespan: 1.0, self.t(op): -1.0}, self.duration_terms(op), -1.0), 0.0, math.inf
            )
        for j in range(self.num_chunks):
            self._chain_rows(builder, j)
            self._head_tail_rows(builder, j)
            # Cut: the chunk's chain runs its ops one after the other.
            chain_terms: dict[int, float] = {makespan: 1.0}
            for op in self.ops:
                if op.chunk == j:
                    chain_terms = _combine(chain_terms, self.duration_terms(op), -1.0)
            builder.add(chain_terms, 0.0, math.inf)
        for k in range(num_dims):
            # Cut: a dim runs one op at a time.
            load_terms: dict[int, float] = {makespan: 1.0}
            for op in self.ops:
                if op.dim == k:
                    load_terms = _combine(load_terms, self.duration_terms(op), -1.0)
            builder.add(load_terms, 0.0, math.inf)
        for i, (a, b) in enumerate(self.pairs):
            x = self.x0 + i
            # x = 1: a before b, t_b - t_a - d_a - x >= -1;  x = 0: b before a, t_a - t_b - d_b + x >= 0.
            builder.add(
                _combine({self.t(b): 1.0, self.t(a): -1.0, x: -1.0}, self.duration_terms(a), -1.0),
                -1.0,
                math.inf,
            )
            builder.add(
                _combine({self.t(a): 1.0, self.t(b): -1.0, x: 1.0}, self.duration_terms(b), -1.0),
                0.0,
                math.inf,
            )
        self._symmetry_rows(builder)
        return builder.build()

    def _chain_rows(self, builder: "RowBuilder", j: int) -> None:
        """Precedence inside chunk j: by order within a phase, and every RS before every AG."""
        num_dims = self.topology.num_dims
        for ph, phase in enumerate(self.phases):
            for k, k2 in itertools.permutations(range(num_dims), 2):
                before = {
                    self.y(j, p): 1.0
                    for p, order in enumerate(self.orders)
                    if order.index(k) < order.index(k2)
                }
                # RS: k before k2 in the order => RS on k2 after RS on k; AG runs the order backwards.
                first, second = (k, k2) if phase is Phase.RS else (k2, k)
                a = OpKey(chunk=j, phase=ph, dim=first)
                b = OpKey(chunk=j, phase=ph, dim=second)
                # t_b - t_a - d_a - B >= -1, with B = sum of y over orders putting k before k2.
                terms = _combine({self.t(b): 1.0, self.t(a): -1.0}, self.duration_terms(a), -1.0)
                builder.add(_combine(terms, before, -1.0), -1.0, math.inf)
        if len(self.phases) == 2:
            for k, k2 in itertools.product(range(num_dims), repeat=2):
                rs = OpKey(chunk=j, phase=0, dim=k)
                ag = OpKey(chunk=j, phase=1, dim=k2)
                builder.add(
                    _combine({self.t(ag): 1.0, self.t(rs): -1.0}, self.duration_terms(rs), -1.0),
                    0.0,
                    math.inf,
                )

    def op_position(self, order: Order, phase: int, dim: int) -> int:
        """Where the op (phase, dim) comes in a chunk's chain when it travels in ``order``."""
        num_dims = self.topology.num_dims
        level = order.index(dim)
        if self.phases[phase] is Phase.RS:
            return phase * num_dims + level
        return phase * num_dims + (num_dims - 1 - level)

    def op_sequences(
        self, orders: list[Order], sequences: dict[int, list[OpKey]]
    ) -> tuple[tuple[int, ...], ...]:
        """:meth:`decode`'s per-dim sequences as schedule op indices (chunk-major, chain
        steps in :meth:`op_position` order): what the simulator and the planners take."""
        chain_length = len(self.phases) * self.topology.num_dims
        return tuple(
            tuple(
                op.chunk * chain_length + self.op_position(orders[op.chunk], op.phase, op.dim)
                for op in sequences[k]
            )
            for k in range(self.topology.num_dims)
        )

    def _head_tail_rows(self, builder: "RowBuilder", j: int) -> None:
        """Each op starts after its chunk's ops before it in the chain, and the ops after it
        fit before T: per order these are known ops, so the sums are linear in ``y`` and
        ``w`` (exact when one ``y`` is 1, a weighted average in the relaxation, unlike the
        big-M chain rows, which vanish there). ``C (1 - u_j)`` relaxes unused chunks."""
        num_dims = self.topology.num_dims
        slack = float(self.latency.sum()) * len(self.phases)
        for op in (o for o in self.ops if o.chunk == j):
            head: dict[int, float] = {}
            tail: dict[int, float] = {}
            for p, order in enumerate(self.orders):
                position = self.op_position(order, op.phase, op.dim)
                for other in range(len(self.phases)):
                    for k in range(num_dims):
                        at = self.op_position(order, other, k)
                        if at == position:
                            continue
                        side = head if at < position else tail
                        side[self.y(j, p)] = side.get(self.y(j, p), 0.0) + float(self.latency[k])
                        side[self.w(j, p)] = side.get(self.w(j, p), 0.0) + float(self.per_byte[p, k])
            # head <= t_o + C (1 - u_j)
            builder.add(_combine({self.t(op): 1.0, self.u0 + j: -slack}, head, -1.0), -slack, math.inf)
            # t_o + d_o + tail <= T + C (1 - u_j)
            ends = {self.makespan_col: 1.0, self.t(op): -1.0, self.u0 + j: -slack}
            builder.add(_combine(_combine(ends, self.duration_terms(op), -1.0), tail, -1.0), -slack, math.inf)

    def _symmetry_rows(self, builder: "RowBuilder") -> None:
        """Used chunks first, by order index, then within an order larger first
        (``size``) or first on the order's first dim first (``sequence``)."""
        num_orders = len(self.orders)
        pair_column = {pair: self.x0 + i for i, pair in enumerate(self.pairs)}
        for j in range(self.num_chunks - 1):
            builder.add({self.u0 + j: 1.0, self.u0 + j + 1: -1.0}, 0.0, math.inf)
            index_gap = {self.y(j + 1, p): float(p) for p in range(num_orders)}
            index_gap = _combine(index_gap, {self.y(j, p): float(p) for p in range(num_orders)}, -1.0)
            # idx_{j+1} - idx_j + P (1 - u_{j+1}) >= 0
            builder.add({**index_gap, self.u0 + j + 1: -float(num_orders)}, -float(num_orders), math.inf)
            if self.symmetry == "size":
                # s_j - s_{j+1} + (idx_{j+1} - idx_j) + P (1 - u_{j+1}) >= 0
                terms = _combine({self.s0 + j: 1.0, self.s0 + j + 1: -1.0}, index_gap, 1.0)
                builder.add({**terms, self.u0 + j + 1: -float(num_orders)}, -float(num_orders), math.inf)
                continue
            for p, order in enumerate(self.orders):
                # Both in order p: j's phase-0 op on order[0] runs before j + 1's,
                # x - y_jp - y_(j+1)p >= -1. (Relabelling such chunks by that start order
                # keeps every other row, so no schedule is lost; an unused chunk's ops
                # take no time and may sit at the makespan.)
                a = OpKey(chunk=j, phase=0, dim=order[0])
                b = OpKey(chunk=j + 1, phase=0, dim=order[0])
                builder.add(
                    {pair_column[(a, b)]: 1.0, self.y(j, p): -1.0, self.y(j + 1, p): -1.0}, -1.0, math.inf
                )

    # -- translation -----------------------------------------------------------------

    def values_of(self, schedule: Schedule) -> np.ndarray | None:
        """The column values of a schedule (a MIP start); None if it does not fit the model.

        It fits when it has at most K chunks, each visiting every dim once, one dim per op.
        """
        num_dims = self.topology.num_dims
        if schedule.collective is not self.collective or schedule.num_chunks > self.num_chunks:
            return None
        if any(sorted(c.order) != [(k,) for k in range(num_dims)] for c in schedule.chunks):
            return None
        order_index = {order: p for p, order in enumerate(self.orders)}
        first_phase = self.phases[0]

        def symmetry_key(chunk: Chunk) -> float:
            """Size (larger first) or the start of the first-phase op on the first dim."""
            if self.symmetry == "size":
                return -chunk.size_bytes
            first_dim = chunk.dims_order()[0]
            return next(
                op.start_s
                for op in schedule.chunk_ops(chunk.index)
                if op.phase is first_phase and op.dims[0] == first_dim
            )

        chunks = sorted(schedule.chunks, key=lambda c: (order_index[c.dims_order()], symmetry_key(c)))
        values = np.zeros(self.num_cols)
        start_of: dict[OpKey, float] = {}
        position: dict[OpKey, tuple[int, int]] = {}
        for j, chunk in enumerate(chunks):
            p = order_index[chunk.dims_order()]
            fraction = chunk.size_bytes / self.message_bytes
            values[self.u0 + j] = 1.0
            values[self.y(j, p)] = 1.0
            values[self.s0 + j] = fraction
            values[self.w(j, p)] = fraction
            for op in schedule.chunk_ops(chunk.index):
                key = OpKey(chunk=j, phase=self.phases.index(op.phase), dim=op.dims[0])
                start_of[key] = op.start_s / self.time_unit_s
        for j in range(len(chunks), self.num_chunks):
            values[self.y(j, 0)] = 1.0
        for k, sequence in enumerate(schedule.sequences):
            for rank, index in enumerate(sequence):
                timed = schedule.ops[index]
                j = next(i for i, c in enumerate(chunks) if c.index == timed.chunk)
                position[OpKey(chunk=j, phase=self.phases.index(timed.phase), dim=k)] = (1, rank)
        for key in self.ops:
            values[self.t(key)] = start_of.get(key, 0.0)
        for i, (a, b) in enumerate(self.pairs):
            # Unused chunks' ops (zero length, at time 0) go first on every dim.
            values[self.x0 + i] = 1.0 if position.get(a, (0, 0)) < position.get(b, (0, 0)) else 0.0
        values[self.makespan_col] = schedule.makespan_s / self.time_unit_s
        return values

    def decode(self, values: np.ndarray) -> tuple[list[Order], list[float], dict[int, list[OpKey]]]:
        """Used chunks' orders and sizes (bytes), and each dim's ops in start order."""
        used = [j for j in range(self.num_chunks) if values[self.u0 + j] > 0.5]
        orders = [
            self.orders[int(np.argmax([values[self.y(j, p)] for p in range(len(self.orders))]))] for j in used
        ]
        fractions = np.clip(np.array([values[self.s0 + j] for j in used]), 0.0, None)
        fractions /= fractions.sum()
        sizes = [float(f) * self.message_bytes for f in fractions]
        sequences: dict[int, list[OpKey]] = {}
        for k in range(self.topology.num_dims):
            on_dim = [op for op in self.ops if op.dim == k and op.chunk in used]
            # Start, then end (a zero-length op first), then the chain position as a tie-break.
            sequences[k] = sorted(
                on_dim,
                key=lambda op: (
                    round(values[self.t(op)], 12),
                    round(values[self.t(op)] + self._duration_value(op, values), 12),
                    op.chunk,
                    op.phase,
                ),
            )
        return (
            orders,
            sizes,
            {
                k: [OpKey(chunk=used.index(op.chunk), phase=op.phase, dim=op.dim) for op in seq]
                for k, seq in sequences.items()
            },
        )

    def _duration_value(self, op: OpKey, values: np.ndarray) -> float:
        return sum(coefficient * values[column] for column, coefficient in self.duration_terms(op).items())


def _combine(left: dict[int, float], right: dict[int, float], factor: float) -> dict[int, float]:
    """``left + factor * right`` as sparse rows."""
    out = dict(left)
    for column, value in right.items():
        out[column] = out.get(column, 0.0) + factor * value
    return out


class RowBuilder:
    """Collects sparse rows (column -> coefficient, bounds) for one model; zero
    coefficients are dropped. Also builds the hipipe planner's sequence MIP."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.starts: list[int] = []
        self.index: list[int] = []
        self.value: list[float] = []

    def add(self, terms: dict[int, float], lower: float, upper: float) -> None:
        self.lower.append(lower)
        self.upper.append(upper)
        self.starts.append(len(self.index))
        for column, value in terms.items():
            if value != 0.0:
                self.index.append(column)
                self.value.append(value)

    def build(self) -> Rows:
        return Rows(
            lower=np.array(self.lower),
            upper=np.array(self.upper),
            starts=np.array(self.starts, dtype=np.int32),
            index=np.array(self.index, dtype=np.int32),
            value=np.array(self.value),
        )


def solver_values(solver: Any) -> np.ndarray:
    return np.asarray(solver.getSolution().col_value)


def models_overheads(topology: Topology) -> bool:
    """Whether the model charges everything ``topology``'s cost model does: latency,
    bandwidth and a per-op cost, but no hand-offs, local reduction or non-linear terms."""
    overheads = topology.overheads
    return not overheads.handoff_s and not overheads.memory_bytes_per_s and overheads.is_linear


def new_solver(model: ExactModel, settings: dict[str, Any]) -> Any:
    """A HiGHS instance holding ``model`` (minimize T), with ``settings`` as HiGHS options
    and a fixed random seed, so the same limits give the same answer on every run."""
    solver = new_highs()
    for name, value in {"random_seed": 0, **settings}.items():
        solver.setOptionValue(name, value)
    lower, upper, integer = model.column_bounds()
    cost = np.zeros(model.num_cols)
    cost[model.makespan_col] = 1.0
    solver.addCols(
        model.num_cols, cost, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0)
    )
    solver.changeColsIntegrality(model.num_cols, np.arange(model.num_cols, dtype=np.int32), integer)
    rows = model.rows()
    solver.addRows(
        len(rows.lower), rows.lower, rows.upper, len(rows.index), rows.starts, rows.index, rows.value
    )
    return solver


def hold_first_dims(solver: Any, model: ExactModel, first_dims: Sequence[int]) -> None:
    """Hold chunk j of ``solver``'s model to orders starting on ``first_dims[j]`` (sorted, as
    the model's symmetry rows order chunks by order index)."""
    hold_order_prefixes(solver, model, [(first,) for first in first_dims])


def hold_order_prefixes(solver: Any, model: ExactModel, prefixes: Sequence[Order]) -> None:
    """Hold chunk j of ``solver``'s model to orders beginning with ``prefixes[j]`` (sorted,
    as the model's symmetry rows order chunks by order index)."""
    for j, prefix in enumerate(prefixes):
        for p, order in enumerate(model.orders):
            if order[: len(prefix)] != tuple(prefix):
                solver.changeColBounds(model.y(j, p), 0.0, 0.0)
