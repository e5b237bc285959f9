"""Chunk sizes by LP (docs/MODEL.md section 7), solved with HiGHS.

With orders and per-dimension sequences fixed, the makespan is an LP in the chunk
sizes ``s_j`` and the op start times ``t_o``::

    min T
    t_q - t_p - b_p s_j(p) >= a_p     for p -> q consecutive in a chain or on a dim
                                      (+ the calibrated hand-off h when a chain changes dim)
    T   - t_p - b_p s_j(p) >= a_p     for p the last op of a chunk
    sum_j s_j = M,  s, t >= 0

(op p lasts ``a_p + b_p s_j(p)``, :func:`hipipe.cost.op_time_coefficients`). Sizes are
fractions of M and times are in units of a rough makespan, so every coefficient is
O(1) or smaller, whatever the message (1 KiB or 64 GiB) and the link speeds.

One :class:`SizingModel` serves one set of chunk orders: chain rows are built once;
sequence rows are swapped when the sequences change, only where they differ, and
HiGHS re-solves from the previous optimal basis (a warm start: on the reference grid
10-30% fewer simplex iterations than cold solves; the re-sequenced LPs differ in about
half their sequence rows, so most of the basis has to change anyway).
"""

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hipipe.bounds import new_highs, run_and_check
from hipipe.errors import SolverError
from hipipe.planners.hipipe.structure import Order, op_table
from hipipe.schedule import Collective
from hipipe.topology import Topology

SOLVER_OPTIONS: dict[str, Any] = {
    "presolve": "off",
    "primal_feasibility_tolerance": 1e-9,
    "dual_feasibility_tolerance": 1e-9,
}
"""Presolve costs more than it saves on these small sparse LPs. Tight tolerances: a
row may be violated by the tolerance (in units of the rough makespan), and a path adds
up one violation per op, so HiGHS' default 1e-7 drifted 1.6e-5 over a 124-op chain in
a generated case; 1e-9 keeps LP and simulator within 1e-6 (1e-10 made HiGHS give up
with status Unknown on some degenerate LPs)."""

FALLBACK_OPTIONS: dict[str, Any] = {
    "primal_feasibility_tolerance": 1e-7,
    "dual_feasibility_tolerance": 1e-7,
    "simplex_strategy": 4,
}
"""Second attempt after a failed solve: HiGHS' default tolerances, primal simplex."""

DUAL_EPSILON = 1e-9
"""Row duals below this are zero (non-binding rows)."""

ZERO_CHUNK_FRACTION = 1e-12
"""A chunk below this fraction of the message is empty: dropped, not paid latency for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sizing:
    """An optimal LP solution for one structure."""

    sizes_bytes: np.ndarray
    makespan_s: float
    """The LP's optimum T (not re-timed)."""
    iterations: int
    """Simplex iterations this solve took (small when the warm start worked)."""


class SizingModel:
    """The makespan LP of one set of chunk orders, kept alive across sequence changes.

    Mutable on purpose: it owns a HiGHS instance whose basis is the warm start.
    """

    def __init__(
        self,
        topology: Topology,
        message_bytes: float,
        orders: tuple[Order, ...],
        *,
        collective: Collective,
        time_unit_s: float,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.table = op_table(topology, orders, collective)
        self.message_bytes = float(message_bytes)
        self.time_unit_s = time_unit_s
        self.num_chunks = len(orders)
        table = self.table
        # Scaled coefficients: duration / unit = alpha + beta * (s / M).
        self._alpha = table.constant_s / time_unit_s
        self._beta = table.per_chunk_byte_s * self.message_bytes / time_unit_s
        self._solver = new_highs()
        self._options = dict(options or {})
        for name, value in {**SOLVER_OPTIONS, **self._options}.items():
            self._solver.setOptionValue(name, value)
        num_cols = self.num_chunks + table.num_ops + 1
        self._t_col = self.num_chunks
        self._makespan_col = num_cols - 1
        cost = np.zeros(num_cols)
        cost[-1] = 1.0
        lower = np.zeros(num_cols)
        upper = np.full(num_cols, np.inf)
        upper[: self.num_chunks] = 1.0
        self._solver.addCols(
            num_cols, cost, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0)
        )
        chain_length = table.chain_length
        ops = np.arange(table.num_ops)
        not_last = ops[(ops + 1) % chain_length != 0]
        last = ops[(ops + 1) % chain_length == 0]
        # A chunk moving to another dim waits for the calibrated hand-off (0 in alpha-beta).
        handoff = np.where(
            table.dim[not_last] != table.dim[not_last + 1], topology.overheads.handoff_s / time_unit_s, 0.0
        )
        self._add_precedences(not_last, not_last + 1, extra=handoff)
        self._add_precedences(last, np.full(len(last), -1))
        sum_row_index = np.arange(self.num_chunks, dtype=np.int32)
        self._solver.addRows(
            1,
            np.ones(1),
            np.ones(1),
            self.num_chunks,
            np.zeros(1, np.int32),
            sum_row_index,
            np.ones(self.num_chunks),
        )
        self._num_fixed_rows = len(not_last) + len(last) + 1
        self._sequence_pairs: list[tuple[int, int]] = []

    def _add_precedences(
        self, before: np.ndarray, after: np.ndarray, *, extra: np.ndarray | None = None
    ) -> None:
        """Rows ``t_after - t_before - beta s_chunk >= alpha (+ extra)``; ``after == -1`` means T."""
        count = len(before)
        if not count:
            return
        after_col = np.where(after < 0, self._makespan_col, self._t_col + after)
        index = np.stack([after_col, self._t_col + before, self.table.chunk[before]], axis=1).ravel()
        value = np.stack([np.ones(count), -np.ones(count), -self._beta[before]], axis=1).ravel()
        starts = np.arange(0, 3 * count, 3, dtype=np.int32)
        self._solver.addRows(
            count,
            self._alpha[before] if extra is None else self._alpha[before] + extra,
            np.full(count, np.inf),
            3 * count,
            starts,
            index.astype(np.int32),
            value,
        )

    def critical_pairs(self) -> list[tuple[int, int]]:
        """Sequence pairs ``(p, q)`` whose rows bind at the last optimum, most binding first.

        A binding row has a nonzero dual: the makespan would drop if q could start before
        p ends, so swapping them is the move most likely to help.
        """
        duals = np.asarray(self._solver.getSolution().row_dual)[self._num_fixed_rows :]
        order = np.argsort(-np.abs(duals), kind="stable")
        return [self._sequence_pairs[i] for i in order if abs(duals[i]) > DUAL_EPSILON]

    def solve(self, sequences: tuple[tuple[int, ...], ...]) -> Sizing:
        """Optimal sizes for these sequences (warm-started from the previous solve)."""
        chain_length = self.table.chain_length
        wanted = {
            (p, q)
            for sequence in sequences
            for p, q in itertools.pairwise(sequence)
            if not (q == p + 1 and q % chain_length)  # already a chain row
        }
        current = self._sequence_pairs
        stale = [i for i, pair in enumerate(current) if pair not in wanted]
        if stale:
            rows = np.array(stale, dtype=np.int32) + self._num_fixed_rows
            self._solver.deleteRows(len(rows), rows)
            stale_set = set(stale)
            current = [pair for i, pair in enumerate(current) if i not in stale_set]
        present = set(current)
        fresh = sorted(wanted - present)
        if fresh:
            pairs = np.array(fresh, dtype=np.int64)
            self._add_precedences(pairs[:, 0], pairs[:, 1])
            current = current + fresh
        self._sequence_pairs = current
        what = f"the chunk-size LP ({self.num_chunks} chunks)"
        try:
            run_and_check(self._solver, what)
        except SolverError:
            # Degenerate LPs can stall HiGHS at tight tolerances: retry cold, then cold with
            # HiGHS' defaults (the planner's LP-vs-simulator check still guards the result).
            self._solver.clearSolver()
            for name, value in FALLBACK_OPTIONS.items():
                self._solver.setOptionValue(name, value)
            try:
                run_and_check(self._solver, what)
            finally:
                for name, value in {**SOLVER_OPTIONS, **self._options}.items():
                    self._solver.setOptionValue(name, value)
        values = np.asarray(self._solver.getSolution().col_value)
        fractions = np.clip(values[: self.num_chunks], 0.0, None)
        fractions[fractions < ZERO_CHUNK_FRACTION] = 0.0
        fractions /= fractions.sum()
        return Sizing(
            sizes_bytes=fractions * self.message_bytes,
            makespan_s=float(values[self._makespan_col]) * self.time_unit_s,
            iterations=int(self._solver.getInfo().simplex_iteration_count),
        )
