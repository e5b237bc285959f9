"""Per-dim sequences by a small MIP: the best sequences and sizes for fixed chunk orders.

The exact planner (:mod:`hipipe.planners.exact`) showed where the local search leaves
time with few chunks: given the proven optimum's chunk orders, the list-scheduled,
swapped and nested sequences reach the optimum on some instances but not on others
(libra-3d at 1 GiB, K = 4: 4.956 ms against 4.794 ms), whose optimal sequences are
stack-shaped without being nested (a dim runs ``2R 0R 3R 3A 1R 1A 0A 2A``). With the
orders fixed, what is left is a disjunctive scheduling problem with variable durations,
small enough for HiGHS' branch and bound at K <= 4: one binary per pair of ops of
different chunks on a dim, against every order binary of the exact model.

Columns, in units of the incumbent's makespan U (so T <= 1 and 1 is a valid big-M):
``s_j`` (chunk j's fraction of the message), ``t_o`` (op o's start), ``x_ab`` (op a
before op b on their dim) and ``T``. Op o lasts ``alpha_o + beta_o s_j(o)`` (the
sizing LP's coefficients, :mod:`.sizing`, hand-offs included on chain rows). Cuts: a
dim's ops and a chunk's chain each fit in T; chunks of the same order are
interchangeable, so they start their first op in the order of their index
(:meth:`_Model.same_order_pairs`).

The search is bounded by a node count, not a clock, so a plan is the same on every
machine.
"""

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from hipipe.bounds import new_highs
from hipipe.planners.exact.model import RowBuilder, Rows
from hipipe.planners.hipipe.candidates import (
    Candidate,
    SearchLog,
    SearchOptions,
    SolvedMip,
    Trial,
    better,
    candidate_for,
    optimize_structure,
)
from hipipe.planners.hipipe.enumeration import (
    combinations,
    enumerates_every_multiset,
    screened_order,
    sized_pairs,
)
from hipipe.planners.hipipe.sequencing import Deadlock, end_times_s
from hipipe.planners.hipipe.structure import OpTable, Order, op_table
from hipipe.schedule import Collective
from hipipe.topology import Topology

MAX_NODES_FEW = 100
"""Nodes per solve with 2 or 3 chunks (the polish solves up to five such per plan; on the
generated networks their improving incumbents came within 100 nodes)."""

MAX_NODES = 400
"""Branch-and-bound nodes per solve with 4 chunks. On the reference grid's few-chunk instances the
improving incumbent came within ~150 nodes where one exists; a node costs ~1 ms here."""

MAX_DIMS = 4
"""Up to 4 dims (at most 32 ops with 4 chunks): beyond, the pairs grow past what a few
hundred nodes settle."""

SOLVER_OPTIONS: dict[str, Any] = {
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_effort": 0.0,
    "mip_detect_symmetry": False,
}
"""The start is the search's plan, already a good incumbent: the primal heuristics took
half the solve time and found nothing the branching did not (reference grid, generated
networks), and the chunks' symmetry is broken by the model's own bounds."""

STUCK_AFTER_S = 30.0
"""A solve still running after this long is stuck in a restart, and is solved again
without restarts (:func:`_solve`). The node limit does not bound a restarted root: HiGHS
1.16 restarted two added-chunk MIPs of a generated 3-dim network (the optimality
benchmark's seed 7, #24: switch 2 at 25 GB/s and 5 us, switch 8 at 25 GB/s, switch 4 at
400 GB/s and 5 us; 64 MiB, K searched) after 1,456 and 1,958 nodes and then ran root cut
rounds without end (the plan had not finished after 10 minutes). Without restarts each
reaches its 3,000 nodes in 1.5-1.7 s. Restarts stay on elsewhere: off for every solve, three
plans of the test suite lost the optima their MIPs reach with them. The longest normal
solves measured took 2.3 s (libra-4d at 256 MiB) and 3.5 s (that network's other MIPs) on a
2-core host under load, so only stuck solves reach the limit, and a plan none of whose
solves reaches it is the same from run to run."""

FEASIBILITY_TOLERANCE = 1e-9
"""As the sizing LP's: the sequences found are re-sized by that LP anyway."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SequenceSolution:
    """The MIP's incumbent: per-dim sequences (op indices) and what they cost."""

    sequences: tuple[tuple[int, ...], ...]
    makespan_s: float
    nodes: int
    proven: bool


def best_sequences(
    topology: Topology,
    message_bytes: float,
    orders: tuple[Order, ...],
    *,
    collective: Collective,
    incumbent_s: float,
    start: tuple[tuple[tuple[int, ...], ...], np.ndarray] | None = None,
    max_nodes: int = MAX_NODES,
) -> SequenceSolution | None:
    """The best sequences for ``orders`` found within ``max_nodes``, never slower than
    ``incumbent_s`` (with ``start``, possibly ``start`` itself); None if none was found.
    (:func:`_solve` also says how many nodes that took.)

    ``start`` (sequences, sizes in bytes for these orders) is handed to HiGHS as its
    first incumbent. HiGHS may refuse it (a start that meets ``incumbent_s`` exactly can
    miss a row by more than the tolerance in floating point; a generated 3-dim network
    with zero latencies did) and then find nothing within the nodes: the start itself is
    the answer then, not None.
    """
    return _solve(
        topology,
        message_bytes,
        orders,
        collective=collective,
        incumbent_s=incumbent_s,
        start=start,
        max_nodes=max_nodes,
    )[0]


def _solve(
    topology: Topology,
    message_bytes: float,
    orders: tuple[Order, ...],
    *,
    collective: Collective,
    incumbent_s: float,
    start: tuple[tuple[tuple[int, ...], ...], np.ndarray] | None,
    max_nodes: int,
) -> tuple[SequenceSolution | None, int]:
    """:func:`best_sequences`' answer and the branch-and-bound nodes it took."""
    table = op_table(topology, orders, collective)
    model = _Model(topology, message_bytes, table, orders, unit_s=incumbent_s)
    start_values = None if start is None else model.values_of(*start)
    for restarts in (True, False):
        solver = model.solver(max_nodes, restarts=restarts)
        if start_values is not None:
            solver.setSolution(model.num_cols, np.arange(model.num_cols, dtype=np.int32), start_values)
        solver.run()
        if solver.getModelStatus() != highspy.HighsModelStatus.kTimeLimit:
            break
    info = solver.getInfo()
    nodes = int(info.mip_node_count)
    if int(info.primal_solution_status) == 0:
        if start is None or start_values is None:
            return None, nodes
        solution = SequenceSolution(
            sequences=start[0],
            makespan_s=float(start_values[model.makespan_col]) * incumbent_s,
            nodes=nodes,
            proven=False,
        )
        return solution, nodes
    values = np.asarray(solver.getSolution().col_value)
    makespan_s = float(values[model.makespan_col]) * incumbent_s
    solution = SequenceSolution(
        sequences=model.sequences_of(values),
        makespan_s=makespan_s,
        nodes=nodes,
        proven=solver.getModelStatus() == highspy.HighsModelStatus.kOptimal,
    )
    return solution, nodes


class _Model:
    """Column layout and rows of one instance; immutable after ``__init__``."""

    def __init__(
        self,
        topology: Topology,
        message_bytes: float,
        table: OpTable,
        orders: tuple[Order, ...],
        *,
        unit_s: float,
    ) -> None:
        self.table = table
        self.message_bytes = float(message_bytes)
        self.unit_s = unit_s
        self.num_chunks = len(orders)
        self.orders = orders
        self.alpha = table.constant_s / unit_s
        self.beta = table.per_chunk_byte_s * self.message_bytes / unit_s
        self.handoff = topology.overheads.handoff_s / unit_s
        self.pairs = [
            (a, b)
            for a, b in itertools.combinations(range(table.num_ops), 2)
            if table.dim[a] == table.dim[b] and table.chunk[a] != table.chunk[b]
        ]
        self.t0 = self.num_chunks
        self.x0 = self.t0 + table.num_ops
        self.makespan_col = self.x0 + len(self.pairs)
        self.num_cols = self.makespan_col + 1
        self.groups = [
            [j for j in range(self.num_chunks) if orders[j] == order] for order in sorted(set(orders))
        ]

    def same_order_pairs(self) -> list[int]:
        """Indices into ``pairs`` of the first ops of consecutive chunks of the same order:
        their binary is fixed to 1 (the lower index starts first).

        Chunks of one order are interchangeable: any schedule, relabelled so that their
        indices follow the order in which they start on their first dim, is the same
        schedule. Fixing those binaries removes branches, where ordering the sizes (the rule
        this replaced) only cut the continuous part: the MIP of four chunks of one order on a
        generated 2-dim network (ring 2 @ 50 GB/s, fully connected 4 @ 400 GB/s, 1 GiB
        AllReduce) was proven in 6,418 nodes instead of 17,492, and its optimum (1.05% below
        the plan the 400-node solve had left) came within the first 400.
        """
        length = self.table.chain_length
        index = {pair: i for i, pair in enumerate(self.pairs)}
        return [
            index[(group[k] * length, group[k + 1] * length)]
            for group in self.groups
            for k in range(len(group) - 1)
        ]

    def canonical(
        self, sequences: tuple[tuple[int, ...], ...], sizes_bytes: np.ndarray
    ) -> tuple[tuple[tuple[int, ...], ...], np.ndarray]:
        """A known schedule relabelled to meet :meth:`same_order_pairs`: within each order's
        chunks, the one whose first op comes first in its dim's sequence takes the lowest
        index. The same schedule, so it stays a valid incumbent."""
        length = self.table.chain_length
        position = {op: rank for sequence in sequences for rank, op in enumerate(sequence)}
        label = list(range(self.num_chunks))
        for group in self.groups:
            for new, old in zip(group, sorted(group, key=lambda j: position[j * length]), strict=True):
                label[old] = new
        relabelled = tuple(
            tuple(label[op // length] * length + op % length for op in seq) for seq in sequences
        )
        sizes = np.empty_like(np.asarray(sizes_bytes, dtype=float))
        sizes[label] = sizes_bytes
        return relabelled, sizes

    def _minus_size_term(self, op: int) -> dict[int, float]:
        """``-beta_o s_j(o)``, the size-dependent part of op o's duration, negated."""
        return {int(self.table.chunk[op]): -float(self.beta[op])}

    def _rows(self) -> Rows:
        table = self.table
        length = table.chain_length
        builder = RowBuilder()
        builder.add({j: 1.0 for j in range(self.num_chunks)}, 1.0, 1.0)
        for op in range(table.num_ops):
            # The next op of the chain (after a hand-off if it changes dim), or T, waits for op.
            if (op + 1) % length:
                after, extra = self.t0 + op + 1, self.handoff if table.dim[op] != table.dim[op + 1] else 0.0
            else:
                after, extra = self.makespan_col, 0.0
            terms = {after: 1.0, self.t0 + op: -1.0, **self._minus_size_term(op)}
            builder.add(terms, float(self.alpha[op]) + extra, np.inf)
        for i, (a, b) in enumerate(self.pairs):
            x = self.x0 + i
            # x = 1: a then b (t_b >= t_a + d_a); x = 0: b then a (t_a >= t_b + d_b).
            a_first = {self.t0 + b: 1.0, self.t0 + a: -1.0, x: -1.0, **self._minus_size_term(a)}
            b_first = {self.t0 + a: 1.0, self.t0 + b: -1.0, x: 1.0, **self._minus_size_term(b)}
            builder.add(a_first, float(self.alpha[a]) - 1.0, np.inf)
            builder.add(b_first, float(self.alpha[b]), np.inf)
        groups = [np.flatnonzero(table.dim == k) for k in range(table.num_dims)]
        groups += [np.flatnonzero(table.chunk == j) for j in range(self.num_chunks)]
        for group in groups:
            # Cut: the ops of a dim (one at a time) or of a chunk (a chain) fit in T.
            cut: dict[int, float] = {self.makespan_col: 1.0}
            for op in group.tolist():
                for column, value in self._minus_size_term(op).items():
                    cut[column] = cut.get(column, 0.0) + value
            builder.add(cut, float(self.alpha[group].sum()), np.inf)
        return builder.build()

    def solver(self, max_nodes: int, *, restarts: bool = True) -> Any:
        """A HiGHS instance holding the model, bounded by ``max_nodes`` (and by
        :data:`STUCK_AFTER_S`), restarting its search only if ``restarts``."""
        solver = new_highs()
        for name, setting in {
            "mip_max_nodes": int(max_nodes),
            "mip_allow_restart": restarts,
            "time_limit": STUCK_AFTER_S,
            "mip_feasibility_tolerance": FEASIBILITY_TOLERANCE,
            "primal_feasibility_tolerance": FEASIBILITY_TOLERANCE,
            "random_seed": 0,
            **SOLVER_OPTIONS,
        }.items():
            solver.setOptionValue(name, setting)
        cost = np.zeros(self.num_cols)
        cost[self.makespan_col] = 1.0
        lower = np.zeros(self.num_cols)
        upper = np.ones(self.num_cols)
        lower[[self.x0 + i for i in self.same_order_pairs()]] = 1.0  # symmetry: same order, lower index first
        solver.addCols(
            self.num_cols, cost, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0)
        )
        integer = np.zeros(self.num_cols, dtype=np.uint8)
        integer[self.x0 : self.makespan_col] = 1
        solver.changeColsIntegrality(self.num_cols, np.arange(self.num_cols, dtype=np.int32), integer)
        rows = self._rows()
        solver.addRows(
            len(rows.lower), rows.lower, rows.upper, len(rows.index), rows.starts, rows.index, rows.value
        )
        return solver

    def values_of(self, sequences: tuple[tuple[int, ...], ...], sizes_bytes: np.ndarray) -> np.ndarray | None:
        """Column values of a known schedule of these orders (None if it deadlocks or is
        slower than the unit: then it is no incumbent for this model)."""
        sequences, sizes_bytes = self.canonical(sequences, sizes_bytes)
        durations = self.table.durations_s(sizes_bytes)
        try:
            ends = end_times_s(self.table, durations, sequences)
        except Deadlock:
            return None
        if self.handoff:
            return None  # end_times_s has no hand-offs: let HiGHS find its own start
        values = np.zeros(self.num_cols)
        values[: self.num_chunks] = sizes_bytes / self.message_bytes
        starts = (np.array(ends) - durations) / self.unit_s
        values[self.t0 : self.x0] = starts
        position = {op: rank for sequence in sequences for rank, op in enumerate(sequence)}
        for i, (a, b) in enumerate(self.pairs):
            values[self.x0 + i] = 1.0 if position[a] < position[b] else 0.0
        values[self.makespan_col] = max(ends) / self.unit_s
        return values if values[self.makespan_col] <= 1.0 + FEASIBILITY_TOLERANCE else None

    def sequences_of(self, values: np.ndarray) -> tuple[tuple[int, ...], ...]:
        """Each dim's ops by start (then end, then op index: zero-length ops first)."""
        starts = values[self.t0 : self.x0]
        ends = starts + self.alpha + self.beta * values[self.table.chunk]
        return tuple(
            tuple(
                sorted(
                    (int(op) for op in np.flatnonzero(self.table.dim == k)),
                    key=lambda op: (round(float(starts[op]), 12), round(float(ends[op]), 12), op),
                )
            )
            for k in range(self.table.num_dims)
        )


def polish_sequences(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    max_chunks: int,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``start``, or a faster plan with its orders and MIP-optimal sequences, or with one of
    its orders once more (:func:`split_orders`, while ``max_chunks`` allows).

    ``start``'s own orders are solved from ``start`` as the MIP's first incumbent. The
    proven optima at K = 4 are often a 3-chunk plan with one order split in two (libra-3d
    at 1 GiB: 4.903 ms with 3 chunks, 4.824 ms with its largest chunk's order split, optimum
    4.794 ms). The MIP's sequences are re-sized by the sizing LP, so the result is timed
    exactly as every other candidate.
    """
    orders = start.structure.orders
    num_chunks = len(orders)
    best = start
    if num_chunks >= 2:
        candidate = _solved(
            topology,
            message_bytes,
            orders,
            start=start,
            incumbent=best,
            source=start.structure.source,
            options=options,
            unit_s=unit_s,
            log=log,
        )
        best = _recorded_faster(log, best, candidate, num_chunks)
    if num_chunks < max_chunks:
        best = split_orders(topology, message_bytes, start, best, options=options, unit_s=unit_s, log=log)
    return best


SPLIT_MAX_SOLVES = 3
"""Orders of a plan that :func:`split_orders` adds once more, its largest chunks' first: a plan
of K - 1 chunks has at most that many distinct orders, and a 4-chunk MIP that finds nothing
costs 0.1-0.5 s on 3 dims, up to 1.6 s on 4."""


def split_orders(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    incumbent: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``incumbent``, or a faster plan with ``start``'s orders and one of them once more (up
    to :data:`SPLIT_MAX_SOLVES` of its distinct orders, by chunk size), judged by its MIP.

    The chunk whose order is split need not be the largest. On held-out generated 3-dim
    networks at K = 4 (seed 31, #3 and #9; ReduceScatter and, mirrored, AllGather) the
    proven optima were the search's 3-chunk plans with a middle-sized chunk's order once
    more: 0.025637 ms against 0.025974 (the plan at K = 4 kept those 3 chunks) and
    0.100293 ms against 0.101991 (the plan at K = 4 had other orders; the split one is the
    plan at K = 3).
    """
    orders = start.structure.orders
    by_size = [orders[int(j)] for j in np.argsort(-np.asarray(start.sizes_bytes), kind="stable")]
    distinct = list(dict.fromkeys(by_size))[:SPLIT_MAX_SOLVES]
    best = incumbent
    for order in distinct:
        trial = (*orders, order)
        if sorted(trial) == sorted(incumbent.structure.orders):
            continue  # the incumbent's own orders, already solved from its sequences
        candidate = _solved(
            topology,
            message_bytes,
            trial,
            start=None,
            incumbent=best,
            source=start.structure.source,
            options=options,
            unit_s=unit_s,
            log=log,
        )
        best = _recorded_faster(log, best, candidate, len(trial))
    return best


def _recorded_faster(
    log: SearchLog, best: Candidate, candidate: Candidate | None, num_chunks: int
) -> Candidate:
    """The faster of ``best`` and a sequence MIP's ``candidate`` for ``num_chunks`` chunks
    (None: the MIP found nothing), the candidate kept in the search's record."""
    if candidate is None:
        return best
    log.tried.append(
        Trial(
            num_chunks=num_chunks,
            kept_chunks=candidate.structure.num_chunks,
            source="sequence-mip",
            makespan_s=candidate.makespan_s,
        )
    )
    return candidate if better(best, candidate) else best


def _solved(
    topology: Topology,
    message_bytes: int,
    orders: tuple[Order, ...],
    *,
    start: Candidate | None,
    incumbent: Candidate,
    source: str,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    max_nodes: int | None = None,
) -> Candidate | None:
    """The sequence MIP's answer for ``orders`` (from ``start``'s sequences and sizes when
    given, which must have these orders), against ``incumbent``'s makespan, re-sized by the
    sizing LP; None when the MIP found nothing. Each solve is kept in ``log``: the same one
    comes up again when the settled plans of consecutive Ks coincide."""
    if max_nodes is None:
        max_nodes = MAX_NODES if len(orders) >= 4 else MAX_NODES_FEW
    key = (
        orders,
        None if start is None else (start.structure.sequences, tuple(start.sizes_bytes.tolist())),
        incumbent.makespan_s,
        max_nodes,
    )
    if key not in log.sequence_mips:
        inputs = (topology, message_bytes, options.collective, *key)
        if inputs not in log.solved_mips:
            solution, nodes = _solve(
                topology,
                message_bytes,
                orders,
                collective=options.collective,
                incumbent_s=incumbent.makespan_s,
                start=None if start is None else (start.structure.sequences, start.sizes_bytes),
                max_nodes=max_nodes,
            )
            log.solved_mips[inputs] = SolvedMip(
                sequences=None if solution is None else solution.sequences,
                nodes=nodes,
                proven=solution is not None and solution.proven,
            )
        solved = log.solved_mips[inputs]
        log.sequence_mips[key] = solved.sequences
        log.sequence_mip_nodes[key] = solved.nodes
        if solved.proven:
            log.proven_orders.add(tuple(sorted(orders)))
    sequences = log.sequence_mips[key]
    if sequences is None:
        return None
    return optimize_structure(
        topology,
        message_bytes,
        orders,
        [sequences],
        source=source,
        options=options,
        unit_s=unit_s,
        log=log,
        resequence=False,
    )


SUBSTITUTION_MAX_DIMS = 4
"""Order substitutions are judged by MIP on networks of up to 4 dims (as far as the MIP goes)."""

SUBSTITUTION_PER_ROUND = 3
"""Neighbours of one plan whose MIP is solved, the best screened first
(:func:`.enumeration.screened_order`): a 4-dim plan of 4 chunks has 20 neighbours and a
MIP of 32 ops that finds nothing costs about 1.2 s on a 2-core host."""

SUBSTITUTION_MAX_SOLVES = 8
"""Sequence MIPs one substitution search may solve. A 3-dim solve costs 0.2-0.5 s, a 4-dim
one 0.1-1.6 s, mostly at its root node whatever its node limit."""

NEW_FIRST_MAX_DIMS = 3
"""On up to this many dims the substitution search goes on to the substitutions that move a
chunk to another first dim (:func:`order_neighbours` with ``new_first_dim``). On held-out
generated 3-dim networks at K = 4 (seeds 11 and 13, #30 and #24) the proven optimum moves
the plan's small chunk (4% and 8% of the message) from ``(0, 1, 2)`` to ``(1, 0, 2)``:
1.26% and 2.40% faster than the plan. For AllReduce on 4 dims there are three times as
many such neighbours and a 4-dim MIP costs up to 1.6 s."""

NEW_FIRST_ONE_PHASE_MAX_DIMS = 4
"""The same rounds for ReduceScatter and AllGather go up to 4 dims: their MIPs have half
the ops of an AllReduce's (one phase per chunk and dim), and the exact planner proves their
4-dim K = 4 optima, which showed what the rounds miss there. On the optimality benchmark's
generated network #22 (16 MiB, K = 4) the AllGather optimum moves one chunk's
``(0, 3, 1, 2)`` to ``(3, 0, 1, 2)``, a neighbour whose MIP proves it in 0.2 s: the plan
went 0.10765 -> 0.10618 ms (the optimum)."""

NEW_FIRST_PER_ROUND = 2
"""Neighbours with a new first dim whose MIP a round solves: the optima above ranked 1st
and 2nd of 15 and 10 by the screen."""

NEW_FIRST_PER_ROUND_FOUR_DIMS = 4
"""The same on 4 dims, where a 4-chunk plan has 54 such neighbours (15 on 3 dims): the
AllGather optimum above ranked beyond the first 2."""

NEW_FIRST_MAX_SOLVES = 4
"""Sequence MIPs the new-first-dim rounds may solve (a fruitless round costs 0.5-1 s)."""

DEEP_NODES = 10_000
"""Branch-and-bound nodes of the deeper MIPs that end a substitution search on 2 to 4 dims
(up to :data:`DEEP_MAX_DIMS`), in all (:func:`_deeper`): the plan's own orders again, from
its sequences, unless a MIP already proved them, then the multisets the search left
unproven. A 400-node MIP stops at an incumbent. On the two networks above the
neighbour's MIP reached 0.24306 and 8.39874 ms; only with several thousand nodes did it reach
the optima, 0.24030 and 8.24488 ms (proven after 3,790 and 9,780 nodes, 2.2 and 4.1 s on a
2-core host). On a third (seed 19, #19) the plan had the optimum's orders at 0.54613 ms; their
deeper MIP found the optimum, 0.53516 ms (-2.0%)."""

DEEP_MIN_NODES = 2_000
"""Nodes a deeper MIP needs at least to be worth starting (see :func:`_deeper`)."""

DEEP_MAX_DIMS = 4
"""Up to this many dims (from 2) the substitution search ends with the deeper MIPs. On 2 dims
(since chunks of one order start in index order, :meth:`_Model.same_order_pairs`) they took
the AllReduce of a generated network (seed 501 #24, K = 4) from 5.987 to the proven
5.9248 ms, and 30 such 2-dim networks plan in 28.6 s instead of 12.0 s (at most 3.9 s). On 4 dims
the exact planner rarely proves K = 4 within a minute, but its incumbent can still lead: on
seed 7's generated 4-dim network #34 (16 MiB) it was 0.1079 ms (30% gap) against hipipe's
0.11032, with the same orders; their deeper MIP finds 0.10786 ms. On 20 networks drawn for
this check (4 dims, K = 4, AllReduce; the exact planner given 60 s each, proving 4) the
deeper MIP took 4 plans 0.27-2.70% below the exact planner's schedule (none was above it by
more than 1% before or after) for 300 -> 327 s of plan time in all (at most +9 s a plan);
3,000 nodes would have found 3 of the 4."""


def order_neighbours(
    orders: tuple[Order, ...], num_dims: int, *, new_first_dim: bool = False
) -> list[tuple[Order, ...]]:
    """The order multisets (sorted) that differ from ``orders`` in one chunk's order, in chunk
    order: on 3 dims or more only the orders that keep the chunk's first dim (with
    ``new_first_dim``, only those that change it), on 2 dims (where keeping it leaves
    nothing) the other order.

    On the reference grid's 3-dim instances at K = 4, the proven optimum was such a
    neighbour of the search's plan every time (four of four), and the other substitutions
    (three times as many MIPs) found nothing more.
    """
    own = tuple(sorted(orders))
    neighbours: list[tuple[Order, ...]] = []
    for j, current in enumerate(orders):
        for order in itertools.permutations(range(num_dims)):
            if order == current or (num_dims >= 3 and (order[0] != current[0]) != new_first_dim):
                continue
            trial = tuple(sorted((*orders[:j], order, *orders[j + 1 :])))
            if trial != own and trial not in neighbours:
                neighbours.append(trial)
    return neighbours


def substitute_orders(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``start``, or a faster plan one order substitution away (:func:`order_neighbours`),
    repeated while that helps, each neighbour judged by its MIP-optimal sequences.

    At K = 4 on 3 dims the proven optima of the reference grid were all one substitution
    away from the search's plan (libra-3d at 256 MiB: ``(1, 2, 0)`` becomes ``(1, 0, 2)``,
    1.5374 -> 1.5300 ms), but that neighbour is slower than the plan until its sequences are
    re-solved: list-scheduled, swapped and nested it came to 1.694 ms, and it ranked 10th of
    15 by a cheaper screen (equal or current sizes, nested descent, one LP). The climb
    (:func:`.local_search.climb_orders`) judges neighbours that way, so it cannot take this
    step; the MIP can. Each MIP only accepts plans faster than the best so far.

    A round solves the MIPs of the :data:`SUBSTITUTION_PER_ROUND` neighbours that two cheap
    screens rank best (:func:`.enumeration.screened_order`), not of all of them: on 4 dims
    there are 20 and a fruitless 4-dim MIP costs about 1.2 s. On a generated 4-dim network
    at 1 GiB, K = 4, one such step (a chunk's ``(1, 3, 0, 2)`` -> ``(1, 3, 2, 0)``) took the
    plan from 17.755 to 17.495 ms (the proven optimum: 17.493 ms).

    On 3 dims (up to :data:`NEW_FIRST_MAX_DIMS`; for ReduceScatter and AllGather up to
    :data:`NEW_FIRST_ONE_PHASE_MAX_DIMS`), rounds of the substitutions that give a chunk
    another first dim follow, after those that keep it (first, so that these cannot take
    the solves of the neighbours that won on the reference grid). When they move a chunk,
    the substitutions that keep first dims get their rounds again, from the moved plan: on
    seed 7's generated network #22 (ReduceScatter, 16 MiB, K = 4) the new first dim was
    worth 0.10812 -> 0.10784 ms and the keep-first step it opened 0.10723 ms (the proven
    optimum: 0.1062 ms). On 3 and 4 dims (up to
    :data:`DEEP_MAX_DIMS`, and on 2 dims) the plan then gets its own orders' MIP once more,
    unless a MIP already proved them, and the multisets the search left unproven theirs, with
    :data:`DEEP_NODES` in all (:func:`_deeper`).
    """
    if topology.num_dims > SUBSTITUTION_MAX_DIMS or start.structure.num_chunks < 2:
        return start
    max_dims = (
        NEW_FIRST_MAX_DIMS if options.collective is Collective.ALL_REDUCE else NEW_FIRST_ONE_PHASE_MAX_DIMS
    )
    new_first_dims = 3 <= topology.num_dims <= max_dims

    tried: list[tuple[Order, ...]] = []

    def rounds(from_plan: Candidate, *, new_first: bool) -> Candidate:
        """The substitution rounds from ``from_plan``: those that keep first dims, or move one."""
        if new_first:
            per_round = NEW_FIRST_PER_ROUND if topology.num_dims <= 3 else NEW_FIRST_PER_ROUND_FOUR_DIMS
            max_solves = NEW_FIRST_MAX_SOLVES
        else:
            per_round, max_solves = SUBSTITUTION_PER_ROUND, SUBSTITUTION_MAX_SOLVES
        return _improving_rounds(
            topology,
            message_bytes,
            from_plan,
            lambda plan: [
                (trial, None)
                for trial in order_neighbours(
                    plan.structure.orders, topology.num_dims, new_first_dim=new_first
                )
            ],
            per_round=per_round,
            max_solves=max_solves,
            options=options,
            unit_s=unit_s,
            log=log,
            tried=tried,
        )

    best = rounds(start, new_first=False)
    if new_first_dims:
        moved = rounds(best, new_first=True)
        # A chunk on a new first dim opens substitutions that keep first dims again.
        best = best if moved is best else rounds(moved, new_first=False)
    if 2 <= topology.num_dims <= DEEP_MAX_DIMS:
        best = _deeper(topology, message_bytes, start, best, tried, options=options, unit_s=unit_s, log=log)
    log.improved(start, best, "substitution")
    return best


IDLE_START_NODES = 3_000
"""Branch-and-bound nodes per first dim's MIP (:func:`add_sequenced_chunk`). On libra-4d at
256 MiB (AllReduce, 5 chunks on 4 dims, 40 ops) the improving incumbent came within 1,000
nodes (2 s on a 2-core host). On rfs-3d at 64 MiB a forced K = 5 runs these MIPs against a
looser incumbent than the search does (its best of at most 5 chunks, 0.5561 ms), and 1,000
nodes found nothing where 3,000 find the search's 0.5345 ms; on eight other 5-chunk plans
(reference and generated networks) 3,000 nodes changed neither plan nor plan time beyond
the host's noise."""

GROW_EVERY_ORDER_MAX_DIMS = 3
"""Up to this many dims the added chunk's MIP runs for every order that starts on its first
dim (2 on 3 dims), not only for the one whose list-scheduled plan is fastest. On a held-out
network (seed 2035 #0 of ``benchmarks/heldout.py``'s family: ring 2, fully connected 4 and
2, 256 MiB, K = 5) the list-scheduled pick found nothing and ``--chunks 5`` kept its 4-chunk
plan (8.1749 ms, 5.5% above the exact planner's 60 s incumbent); the other order on the
same dim, ``(2, 0, 1)``, sequenced by MIP is 8.0357 ms. On 4 dims a dim starts 6 orders."""

RESEQUENCE_NODES = 3_000
"""Branch-and-bound nodes of each MIP that re-sequences a finished 5-chunk plan
(:func:`resequenced`): 0.5-1.8 s on a 2-core host for 3 dims, 0.8-1.5 s on libra-4d."""


def resequenced(
    topology: Topology,
    message_bytes: int,
    plan: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``plan``, or its own orders with sequences and sizes solved by MIP, once from its
    sequences and once from scratch (:data:`RESEQUENCE_NODES` each), if that is faster.

    Past the polish (K > 4) a plan's sequences come from list scheduling, pair swaps and
    nesting, or from a MIP that had other orders to sequence. On held-out networks at
    K = 5 (seed 2031, ``benchmarks/heldout.py``'s family) that left 0.4% (#4: switch 8,
    switch 3, switch 2 at 1 GiB, 8.4321 -> 8.4005 ms, the exact planner's best) and 2.2%
    (#14: 1.4560 -> 1.4344 ms; the exact planner's 60 s incumbent, same orders, is
    1.4239 ms) on the table. The two starts find different plans: on #4 only the one from
    the plan's sequences gained, on #14 the one from scratch went further, and only against
    the plan's makespan: run against the first one's 1.4524 ms it found nothing."""
    if not 2 <= topology.num_dims <= SUBSTITUTION_MAX_DIMS or plan.lp_makespan_s is None:
        return plan
    best = plan
    for start in (plan, None):
        solved = _solved(
            topology,
            message_bytes,
            plan.structure.orders,
            start=start,
            incumbent=plan,
            source=plan.structure.source,
            options=options,
            unit_s=unit_s,
            log=log,
            max_nodes=RESEQUENCE_NODES,
        )
        if solved is not None and better(best, solved):
            best = solved
    if best is not plan:
        log.tried.append(
            Trial(
                num_chunks=plan.structure.num_chunks,
                kept_chunks=best.structure.num_chunks,
                source="resequenced",
                makespan_s=best.makespan_s,
            )
        )
    return best


def add_idle_start_chunk(
    topology: Topology,
    message_bytes: int,
    base: Candidate,
    *,
    incumbent: Candidate,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """``base`` plus one chunk that starts on a dim where none of ``base``'s chunks starts,
    its sequences solved by MIP; then its order substitutions (:func:`substitute_orders`).
    None unless that is faster than ``incumbent``.

    A dim that no chunk starts on idles while the pipeline fills, and in an AllReduce it
    idles again while the last AllGather drains. A small chunk that starts there gives it
    work, but only when its ops interleave with the big chunks' ops in a way no
    list-scheduling rule builds: on libra-4d at 256 MiB (AllReduce) the 4-chunk plan
    (1.6444 ms) plus a chunk in ``(3, 2, 1, 0)`` comes to 1.6692 ms list-scheduled (slower
    than the base) and to 1.6153 ms with MIP sequences; the order substitution that follows
    reaches 1.6081 ms, the exact planner's best 5-chunk schedule, where the search had
    1.6267 ms. For each idle dim the chunk's order is the one whose list-scheduled plan is
    fastest (:func:`candidate_for`), its plan the MIP's start when the LP kept the chunk.
    """
    starts = {order[0] for order in base.structure.orders}
    idle = [dim for dim in range(topology.num_dims) if dim not in starts]
    return _grown_by_mip(
        topology,
        message_bytes,
        base,
        idle,
        incumbent=incumbent,
        options=options,
        unit_s=unit_s,
        log=log,
    )


def add_sequenced_chunk(
    topology: Topology,
    message_bytes: int,
    base: Candidate,
    *,
    incumbent: Candidate,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """:func:`add_idle_start_chunk`'s step for a chunk starting on any dim: the idle dims
    first (their MIPs run against ``incumbent``, as they would alone), then the dims where
    chunks already start. None unless faster than ``incumbent``.

    A busy dim's new chunk needs MIP sequences too. On a held-out generated network (seed
    2026, #3: ring 8, switch 4 and fully connected 8 at 1 GiB, K = 5) forced K = 5 kept its
    4-chunk plan (6.8405 ms): a fifth chunk in ``(2, 0, 1)``, where two chunks already start,
    list-schedules to 6.9785 ms, sequenced by MIP it is 6.7288 ms, and the substitutions that
    follow reach 6.6129 ms, the exact planner's proven 5-chunk optimum. The search grows only
    the plans of the first K its polish does not reach (a 40-op MIP on 4 dims costs 2-3 s;
    larger plans have less start-up idle time to fill).
    """
    starts = {order[0] for order in base.structure.orders}
    first_dims = sorted(range(topology.num_dims), key=lambda dim: (dim in starts, dim))
    return _grown_by_mip(
        topology,
        message_bytes,
        base,
        first_dims,
        incumbent=incumbent,
        options=options,
        unit_s=unit_s,
        log=log,
    )


def _grown_by_mip(
    topology: Topology,
    message_bytes: int,
    base: Candidate,
    first_dims: Sequence[int],
    *,
    incumbent: Candidate,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """``base`` plus one chunk starting on each of ``first_dims`` in turn (in every order that
    starts there on up to :data:`GROW_EVERY_ORDER_MAX_DIMS` dims, fastest list-scheduled plan
    first; beyond, only in that one), sequenced by MIP against the best so far; the
    fastest, after :func:`substitute_orders`, or None if none beat ``incumbent``. A chunk on
    a dim where no chunk of ``base`` starts is an ``idle-start chunk``, any other an
    ``added chunk``."""
    orders = base.structure.orders
    if not 2 <= topology.num_dims <= SUBSTITUTION_MAX_DIMS or base.lp_makespan_s is None:
        return None
    starts = {order[0] for order in orders}
    best: Candidate | None = None
    for dim in first_dims:
        source = "added chunk" if dim in starts else "idle-start chunk"
        listed = [
            (
                candidate_for(
                    topology,
                    message_bytes,
                    source,
                    (*orders, order),
                    options=options,
                    unit_s=unit_s,
                    log=log,
                ),
                order,
            )
            for order in itertools.permutations(range(topology.num_dims))
            if order[0] == dim
        ]
        listed.sort(key=lambda pair: pair[0].makespan_s)
        for start, order in listed if topology.num_dims <= GROW_EVERY_ORDER_MAX_DIMS else listed[:1]:
            trial_orders = (*orders, order)
            solved = _solved(
                topology,
                message_bytes,
                trial_orders,
                start=start if start.structure.orders == trial_orders else None,
                incumbent=best or incumbent,
                source=source,
                options=options,
                unit_s=unit_s,
                log=log,
                max_nodes=IDLE_START_NODES,
            )
            if solved is not None and better(best or incumbent, solved):
                best = solved
    if best is None:
        return None
    log.tried.append(
        Trial(
            num_chunks=len(orders) + 1,
            kept_chunks=best.structure.num_chunks,
            source=best.structure.source,
            makespan_s=best.makespan_s,
        )
    )
    return substitute_orders(topology, message_bytes, best, options=options, unit_s=unit_s, log=log)


RESHAPE_MAX_CHUNKS = 3
"""The reshaping step (:func:`reshape_orders`) runs on plans of at most this many chunks,
where a sequence MIP and its re-sizing cost 0.1-0.3 s (a 4-chunk one on 4 dims: up to 1.2 s)."""

RESHAPE_ENUMERATED = frozenset({(3, 3)})
"""(dims, K) where the enumeration tries every order multiset and the reshaping steps still
run (:func:`reshape_orders`): there it MIP-solves only the best few; elsewhere (2 dims, or
K = 2) the steps gained nothing on the generated networks tried."""

RESHAPE_PER_ROUND = 5
"""Neighbours whose MIP a reshaping round solves, the best screened first. On a held-out
generated 4-dim network (seed 11, #32) the three improving steps to the proven optimum
ranked 5th, 2nd and 1st."""

RESHAPE_MAX_SOLVES = 10
"""Sequence MIPs one reshaping search may solve: 2.5-3.5 s at 3 chunks on 4 dims (a round that
finds nothing, 1.1-1.3 s)."""

ADDED_SHARE = 0.1
"""The share of the message an added chunk gets in the screen (the others shrink to
make room): the chunks that the proven optima add to a plan are small ones on an idle
first dim (8.6% and 18% of the message on two generated 4-dim networks). Screened at
equal sizes instead, the best addition ranked 30th of 70 neighbours; at this share, 1st."""


def reshaped_neighbours(
    orders: tuple[Order, ...], sizes_bytes: np.ndarray, num_dims: int, max_chunks: int
) -> list[tuple[tuple[Order, ...], np.ndarray]]:
    """Plans one step from ``orders``, each with the sizes its screen uses: every chunk's
    order replaced by any other order (first dim included; the chunk keeps its size), and,
    below ``max_chunks``, one chunk added in any order with :data:`ADDED_SHARE` of the
    message. One entry per order multiset, in that order."""
    own = tuple(sorted(orders))
    sizes = np.asarray(sizes_bytes, dtype=float)
    found: dict[tuple[Order, ...], tuple[tuple[Order, ...], np.ndarray]] = {}
    every = list(itertools.permutations(range(num_dims)))
    for j, current in enumerate(orders):
        for order in every:
            trial = (*orders[:j], order, *orders[j + 1 :])
            key = tuple(sorted(trial))
            if order != current and key != own and key not in found:
                found[key] = (trial, sizes)
    if len(orders) < max_chunks:
        added = np.append(sizes * (1 - ADDED_SHARE), sizes.sum() * ADDED_SHARE)
        for order in every:
            trial = (*orders, order)
            key = tuple(sorted(trial))
            if key not in found:
                found[key] = (trial, added)
    return list(found.values())


def reshape_orders(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    max_chunks: int,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``start``, or a faster plan a few reshaping steps away (:func:`reshaped_neighbours`:
    any chunk's order replaced, or a chunk added), each neighbour judged by its MIP-optimal
    sequences, repeated while that helps. For few-chunk plans (:data:`RESHAPE_MAX_CHUNKS`).

    Where the enumeration tries every order multiset (K = 2, or 3 dims) it only MIP-solves
    the sequences of the best few, ranked by list schedules; of those cases the steps run at
    K = 3 on 3 dims (56 multisets), where they closed a miss. On a held-out generated 3-dim
    network (seed 29, #2: switch 2 @ 50 GB/s, switch 8 @ 400 GB/s, ring 8 @ 200 GB/s; 256
    MiB) the plan's three chunks ``(1, 2, 0), (2, 0, 1), (0, 1, 2)`` stopped at 1.15697 ms,
    2.0% above the proven optimum; two reshaping steps (two tail swaps) reach it, 1.13407
    ms. On 68 other generated networks of 2-3 dims at K <= 3 (seeds 7, 11, 23, 29), run on
    all of them, the steps changed no plan by more than 0.01% and took their plan time from
    27.5 to 43.5 s in all (at most 2.6 s a plan): on 2 dims and at K = 2 they stay off, with
    nothing seen to gain there.

    The enumeration (:mod:`.enumeration`) ranks order multisets by list-scheduled and
    LP-sized sequences, and on 4 dims it only pools the orders of the best pairs; the
    proven optima it misses are often a step from the polished plan whose sequences only
    the MIP finds. On held-out generated 4-dim networks (seed 11) at K = 3: #34's optimum
    adds a chunk of 8.6% on an idle first dim to the 2-chunk plan (0.3120 -> 0.2953 ms,
    whose added order ranked 11th in the pairs, outside the pool); #32's is three steps
    away, one of them a chunk moved to another first dim (1.4587 -> 1.4320 ms).

    Neighbours are screened at the plan's own sizes (:func:`.enumeration.screened_order`)
    and the MIPs of the :data:`RESHAPE_PER_ROUND` best are solved, against the best so far.
    """
    if (
        topology.num_dims > MAX_DIMS
        or max_chunks < 2
        or max_chunks > RESHAPE_MAX_CHUNKS
        or start.structure.num_chunks > max_chunks
        or (
            enumerates_every_multiset(topology.num_dims, max_chunks)
            and (topology.num_dims, max_chunks) not in RESHAPE_ENUMERATED
        )
    ):
        return start
    best = _improving_rounds(
        topology,
        message_bytes,
        start,
        lambda plan: reshaped_neighbours(
            plan.structure.orders, plan.sizes_bytes, topology.num_dims, max_chunks
        ),
        per_round=RESHAPE_PER_ROUND,
        max_solves=RESHAPE_MAX_SOLVES,
        options=options,
        unit_s=unit_s,
        log=log,
    )
    log.improved(start, best, "reshape")
    return best


EXHAUSTIVE_MAX_MULTISETS = 56
"""Order multisets of 3 or more chunks up to which :func:`every_multiset` solves the sequence
MIP of every one: the 56 triples of 3 dims (0.2-0.4 s for a ReduceScatter, 1-3 s for an
AllReduce on a 2-core host, each MIP 1-50 ms at its root, up to 0.3 s when it branches)."""

EXHAUSTIVE_MAX_PAIRS = 300
"""The same for pairs, all 300 of 4 dims: a 2-chunk MIP has at most 16 pairs of ops that
share a dim and settles in 1-15 ms, all 300 in about 0.3 s."""


def exhausts_multisets(num_dims: int, num_chunks: int) -> bool:
    """Whether :func:`every_multiset` runs for ``num_chunks`` chunks on ``num_dims`` dims:
    the enumeration screens every multiset there, and they are at most
    :data:`EXHAUSTIVE_MAX_PAIRS` pairs or :data:`EXHAUSTIVE_MAX_MULTISETS` larger multisets."""
    multisets = combinations(math.factorial(num_dims), num_chunks)
    return (
        num_chunks >= 2
        and num_dims <= MAX_DIMS
        and enumerates_every_multiset(num_dims, num_chunks)
        and multisets <= (EXHAUSTIVE_MAX_PAIRS if num_chunks == 2 else EXHAUSTIVE_MAX_MULTISETS)
    )


def every_multiset(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    max_chunks: int,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``start``, or the fastest plan of any multiset of ``max_chunks`` orders, each judged
    by its MIP-optimal sequences against the best so far (:func:`exhausts_multisets`).

    The enumeration ranks the multisets by list-scheduled, LP-sized sequences and MIP-solves
    only its :data:`.enumeration.KEPT` best, and that rank misleads: on held-out generated
    3-dim networks at K = 3 the proven optimum's multiset ranked 5th (an AllReduce: 1024 MiB
    on switch 2 @ 100 GB/s / 500 ns, ring 2 @ 400 GB/s / 2 us, ring 6 @ 150 GB/s / 500 ns;
    the plan was 2.0% slower) and 12th (a ReduceScatter, 4.1% slower: its screened sequences
    were 12.6% above its MIP's). Every multiset's MIP, cut off at the incumbent, mostly ends
    at its root node, so solving all of them costs little more than the ranking.
    """
    if not exhausts_multisets(topology.num_dims, max_chunks) or start.structure.num_chunks > max_chunks:
        return start
    orders = list(itertools.permutations(range(topology.num_dims)))
    trials = list(itertools.combinations_with_replacement(orders, max_chunks))
    best = _fastest_of(topology, message_bytes, start, trials, options=options, unit_s=unit_s, log=log)
    log.improved(start, best, "every multiset")
    return best


def _fastest_of(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    trials: Sequence[tuple[Order, ...]],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``start``, or the fastest plan of the sorted order multisets ``trials``, each solved by
    its MIP in turn against the best so far."""
    best = start
    for trial in trials:
        if trial == tuple(sorted(best.structure.orders)) or trial in log.proven_orders:
            continue  # the incumbent's own orders, or a MIP already proved these orders' best
        candidate = _solved(
            topology,
            message_bytes,
            trial,
            start=None,
            incumbent=best,
            source=start.structure.source,
            options=options,
            unit_s=unit_s,
            log=log,
        )
        best = _recorded_faster(log, best, candidate, len(trial))
    return best


EXTENDED_PAIRS = 2
"""The best LP-sized pairs that :func:`extended_pairs` extends by a chunk in every order: the
two optima below ranked 2nd; extending the best 3 found the same at 1.5x the cost."""


def extends_pairs(num_dims: int, num_chunks: int) -> bool:
    """Whether :func:`extended_pairs` runs: 3 chunks where the enumeration pools the orders
    (4 dims: 2600 triples) but screens every pair."""
    return (
        num_chunks == 3
        and num_dims <= MAX_DIMS
        and not enumerates_every_multiset(num_dims, num_chunks)
        and enumerates_every_multiset(num_dims, 2)
    )


def extended_pairs(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``start``, or a faster 3-chunk plan made of one of the :data:`EXTENDED_PAIRS` best
    pairs of orders (:func:`.enumeration.sized_pairs`) and a chunk in any order, each judged
    by its MIP-optimal sequences against the best so far (:func:`extends_pairs`).

    On 4 dims the enumeration tries the triples of the 10 orders that make the best pairs,
    and the reshaping steps change one chunk at a time. On held-out generated 4-dim networks
    the proven optima at K = 3 were a good pair plus a chunk in an order outside that pool,
    two steps from the plan: a ReduceScatter with a 12.6% chunk on a dim no other chunk
    starts on (1.78% faster than the plan; its pair ranked 2nd) and an AllReduce (seed 11
    #31 of the optimality benchmark, 1.28% faster). Up to 48 MIPs, most of them ending at
    their root: about 0.05 s for a ReduceScatter, 0.4-4 s for an AllReduce on a 2-core host.
    """
    if not extends_pairs(topology.num_dims, 3) or start.structure.num_chunks > 3:
        return start  # a plan of 2 chunks (one emptied) is extended too: the trials have 3
    orders = list(itertools.permutations(range(topology.num_dims)))
    pairs = sized_pairs(topology, message_bytes, options=options, unit_s=unit_s, log=log)
    trials: list[tuple[Order, ...]] = []
    for pair in pairs[:EXTENDED_PAIRS]:
        for order in orders:
            trial = tuple(sorted((*pair.structure.orders, order)))
            if trial not in trials:
                trials.append(trial)
    best = _fastest_of(topology, message_bytes, start, trials, options=options, unit_s=unit_s, log=log)
    log.improved(start, best, "extended pairs")
    return best


def _deeper(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    best: Candidate,
    tried: list[tuple[Order, ...]],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    """``best``, or what deeper MIPs find, :data:`DEEP_NODES` nodes in all: first of the
    plan's own orders (from its sequences), then of the multisets the substitution search
    left unproven (``start``'s, then those its rounds tried, in that order: ``tried``, whether
    their MIP ran in the rounds or earlier in the search), while at least
    :data:`DEEP_MIN_NODES` are left. A MIP that a proof ends early leaves its nodes to the
    next. Counting only the MIPs the rounds ran missed held-out 117#3 (2 dims, K = 4): its
    optimum's orders, four chunks of ``(1, 0)``, had their 400-node MIP earlier in the search
    (without result), and 5,000 nodes find it (+0.88% -> 0.00%)."""
    queue = [best.structure.orders, start.structure.orders, *tried]
    seen: set[tuple[Order, ...]] = set()
    budget = DEEP_NODES
    for orders in queue:
        multiset = tuple(sorted(orders))
        if multiset in seen or multiset in log.proven_orders or len(orders) != best.structure.num_chunks:
            continue
        if budget < DEEP_MIN_NODES:
            break
        seen.add(multiset)
        own = multiset == tuple(sorted(best.structure.orders))
        spent = sum(log.sequence_mip_nodes.values())
        candidate = _solved(
            topology,
            message_bytes,
            best.structure.orders if own else orders,
            start=best if own else None,
            incumbent=best,
            source=start.structure.source,
            options=options,
            unit_s=unit_s,
            log=log,
            max_nodes=budget,
        )
        budget -= sum(log.sequence_mip_nodes.values()) - spent  # nothing if the solve was cached
        if candidate is not None and better(best, candidate):
            best = candidate
    return best


Neighbour = tuple[tuple[Order, ...], np.ndarray | None]
"""A plan's orders one step away, with the sizes its screen uses (None: equal sizes)."""


def _improving_rounds(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    neighbours: Callable[[Candidate], Sequence[Neighbour]],
    *,
    per_round: int,
    max_solves: int,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    tried: list[tuple[Order, ...]] | None = None,
) -> Candidate:
    """The search of :func:`substitute_orders` and :func:`reshape_orders`: each round ranks
    the unseen ``neighbours`` of the best plan so far (:func:`.enumeration.screened_order`,
    at their sizes where all have them) and solves the MIPs of the first ``per_round``
    against it, keeping the first faster plan; rounds go on while one improves, up to
    ``max_solves`` MIPs (a MIP already in ``log`` costs nothing). Each neighbour whose MIP
    is asked for is appended to ``tried``, when given."""
    best = start
    solves = 0
    seen: set[tuple[Order, ...]] = {tuple(sorted(start.structure.orders))}
    improved = True
    while improved and solves < max_solves:
        improved = False
        fresh = [(orders, sizes) for orders, sizes in neighbours(best) if tuple(sorted(orders)) not in seen]
        sizes_bytes = [sizes for _, sizes in fresh if sizes is not None]
        ranked = screened_order(
            topology,
            message_bytes,
            [orders for orders, _ in fresh],
            options=options,
            unit_s=unit_s,
            log=log,
            sizes_bytes=sizes_bytes if len(sizes_bytes) == len(fresh) else None,
        )
        for trial in ranked[:per_round]:
            if solves >= max_solves:
                break
            seen.add(tuple(sorted(trial)))
            if tried is not None:
                tried.append(trial)
            known = len(log.sequence_mips)
            candidate = _solved(
                topology,
                message_bytes,
                trial,
                start=None,
                incumbent=best,
                source=start.structure.source,
                options=options,
                unit_s=unit_s,
                log=log,
            )
            solves += len(log.sequence_mips) - known
            if candidate is not None and better(best, candidate):
                best, improved = candidate, True
                break
    return best
