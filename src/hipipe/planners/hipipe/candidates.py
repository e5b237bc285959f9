"""Evaluating one structure: list-scheduled sequences, LP sizes, re-sequencing rounds.

A *candidate* is a structure (chunk orders + per-dim sequences) with chunk sizes and the
makespan they give. :func:`optimize_structure` turns chunk orders into the best
candidate it finds: sequences from the list-scheduling rules on uniform sizes, LP sizes
for each, then rounds of re-sequencing on the best sizes and re-solving (the sizing LP:
docs/MODEL.md section 7); empty chunks are dropped at the end.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hipipe.bounds import OrderMix, chunked_bound_s, half_chain_scale
from hipipe.planners.hipipe.sequencing import BASIC_RULES, NESTED_RULES, Rule, list_schedule, longest_path_s
from hipipe.planners.hipipe.sizing import SizingModel
from hipipe.planners.hipipe.structure import Order, Structure, op_table, without_chunks
from hipipe.schedule import Collective
from hipipe.topology import Topology

CHUNK_LADDER: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Numbers of chunks tried, in order: about x1.4 apart, so the best is never far off."""

ALL_RULES_MAX_CHUNKS = 8
"""Up to this K, the first sequences come from every list-scheduling rule (LPs are cheap)."""

NESTED_MAX_CHUNKS = 4
"""The nested rules are tried up to this K: the optima they match have a few chunks."""

PLAN_BUDGET = 12_000
"""The plan-time budget, in op-LPs (one LP over n ops counts n), for the whole plan.
Deterministic, unlike a wall-clock budget, so the same input always gets the same plan;
12,000 is about 0.4 s of HiGHS on a 2-core machine. The stages spend it in turn, each
up to a cumulative share (a stage finishes the step at hand when its share is spent):"""

LADDER_SHARE = 0.5
"""The K ladder and its probes stop once half the budget is spent..."""

CLIMB_SHARE = 2 / 3
CLIMB_STEP_SHARE = 0.25
"""...the order climb may then spend a quarter more, up to two thirds in all..."""

SPLIT_SHARE = 1.0
"""...and splitting chunks has the rest."""

IMPROVEMENT = 1e-9
"""Relative gain below which a new candidate does not count as better (LP noise)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOptions:
    """What the search plans and what it may change; the ablations switch parts of it off."""

    collective: Collective = Collective.ALL_REDUCE
    """The collective planned: it fixes the chains' length and phases, nothing else."""
    chunk_counts: tuple[int, ...] = CHUNK_LADDER
    """The K ladder, tried in order (ignored when ``forced_chunks`` is set)."""
    forced_chunks: int | None = None
    """The K the user or the ablation forced. With the local search on, the search turns it
    into "at most K chunks" (``chunk_limit``); without (the ablations), this K alone: no
    ladder, no probes, no splitting, seeds of this K only."""
    chunk_limit: int | None = None
    """At most this many chunks: the search confined to K' <= this (a forced K above the
    few-chunk range), its ladder ending at this K and every later step held to it."""
    lp_sizes: bool = True
    """False: uniform chunk sizes (the ``hipipe-uniform`` ablation)."""
    ascending_only: bool = False
    """True: every chunk in ascending order (the ``hipipe-fixed-order`` ablation)."""
    baseline_seeds: bool = True
    climb: bool = True
    """Local search over the orders of a few-chunk winner (off in the ablations)."""
    max_rounds: int = 3
    """Re-sequencing rounds per K after the first LP."""
    patience: int = 2
    """Stop the K ladder after this many Ks in a row that do not improve on the best
    (one, above ``FULL_ROUNDS_MAX_CHUNKS``, where each K costs more)."""
    lp_work_budget: int = PLAN_BUDGET
    """The one plan-time budget (op-LPs), shared by every stage of the search."""

    @property
    def ladder(self) -> tuple[int, ...]:
        """The Ks the search builds from scratch."""
        return (self.forced_chunks,) if self.forced_chunks is not None else self.chunk_counts

    @property
    def searches_chunks(self) -> bool:
        """Whether K is the search's to choose (not forced by the user or the ablation)."""
        return self.forced_chunks is None and len(self.chunk_counts) > 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A structure with its sizes and the makespan they give."""

    structure: Structure
    sizes_bytes: np.ndarray
    makespan_s: float
    """Longest path of the fixed sequences with these sizes (what the simulator will say)."""
    lp_makespan_s: float | None
    """The LP optimum for this structure (None when sizes are not from the LP)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Trial:
    """One line of the search's record: a candidate, a failed LP, or where the ladder stopped."""

    num_chunks: int
    """The K asked for."""
    source: str | None = None
    """Order family or search step (``mix``, ``greedy``, ``climb``, ``split``, a baseline)."""
    makespan_s: float | None = None
    kept_chunks: int | None = None
    """K after empty chunks were dropped."""
    error: str | None = None
    """Why this structure's LP failed (the search went on without it)."""
    pruned: str | None = None
    """Why the ladder stopped at this K."""

    def to_info(self) -> dict[str, Any]:
        """Plain JSON for ``Schedule.info["candidates"]`` (fields that are set only)."""
        fields = {
            "num_chunks": self.num_chunks,
            "kept_chunks": self.kept_chunks,
            "source": self.source,
            "makespan_s": self.makespan_s,
            "error": self.error,
            "pruned": self.pruned,
        }
        return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True)
class SolvedMip:
    """What one sequence MIP gave (:func:`.sequence_mip._solve`): its sequences (None: it
    found none), the branch-and-bound nodes it took, and whether it proved them optimal."""

    sequences: tuple[tuple[int, ...], ...] | None
    nodes: int
    proven: bool


@dataclass(kw_only=True)
class SearchLog:
    """What the search tried and the LP work it spent. Mutable: filled in as it goes."""

    budget: int = PLAN_BUDGET
    """The plan's budget (op-LPs); see :data:`PLAN_BUDGET`."""
    tried: list[Trial] = field(default_factory=list)
    lp_solves: int = 0
    simplex_iterations: int = 0
    lp_work: int = 0
    """Sum over LP solves of the ops each LP had: what the plan-time budget counts."""
    stage_limit: float = PLAN_BUDGET * LADDER_SHARE
    """LP work at which the current stage stops (set by :meth:`allow`)."""
    strikes: dict[str, int] = field(default_factory=dict)
    """Per order family, how many Ks in a row it trailed that K's best by RETIRE_MARGIN."""
    retired: set[str] = field(default_factory=set)
    """Families no longer tried at larger K (the mix never retires)."""
    floors: dict[int, float] = field(default_factory=dict)
    """The plan's chunked latency floors by K (one LP each; shared with the logs of its
    steps): every stage asks for them, often for the same K."""
    enumerated: dict[tuple[object, ...], list[Candidate]] = field(default_factory=dict)
    """The enumeration's screened and LP-sized multisets by (stage, orders, K)
    (:mod:`.enumeration`): K = 2's screened pairs also choose the orders K = 3 combines."""
    sequence_mips: dict[tuple[object, ...], tuple[tuple[int, ...], ...] | None] = field(default_factory=dict)
    """Sequence-MIP results (:mod:`.sequence_mip`) by their inputs: the settled plans of
    consecutive Ks are often the same plan, and a MIP costs a few hundred milliseconds."""
    sequence_mip_nodes: dict[tuple[object, ...], int] = field(default_factory=dict)
    """Branch-and-bound nodes each of those solves took (the deeper solves share a budget)."""
    free_tails: dict[tuple[object, ...], Candidate] = field(default_factory=dict)
    """What :func:`.tail_mip.free_tails` made of a plan, by the plan's orders, sequences and
    sizes: the polished plans of consecutive Ks are often the same plan, and its MIP costs
    up to seconds."""
    proven_orders: set[tuple[Order, ...]] = field(default_factory=set)
    """Order multisets (sorted) whose sequence MIP proved its answer optimal for them: no
    deeper MIP of theirs can find more (:func:`.sequence_mip.substitute_orders`)."""
    solved_mips: dict[tuple[object, ...], SolvedMip] = field(default_factory=dict)
    """Every sequence MIP solved for this plan, by all of its inputs; unlike the fields
    above, shared by the logs of the plan's stages and of the plans it re-times
    (:func:`hipipe.planners.hipipe.planner._plan`). Those stages and plans solve many of
    the same MIPs (a plan on a calibrated 2x4 testbed solved 74, 21 of them distinct),
    and a MIP's answer depends on its inputs alone, so each log still records it as
    solved: the search takes the same path, without solving it again."""

    def floor_s(
        self, topology: Topology, message_bytes: float, num_chunks: int, collective: Collective
    ) -> float:
        """:func:`hipipe.bounds.chunked_bound_s` for this plan (same topology, message and
        collective on every call), computed once per K."""
        if num_chunks not in self.floors:
            self.floors[num_chunks] = chunked_bound_s(
                topology, message_bytes, num_chunks, collective=collective
            )
        return self.floors[num_chunks]

    def improved(self, start: Candidate, best: Candidate, source: str) -> None:
        """Record that the search step ``source`` moved ``start`` to ``best`` (nothing if not)."""
        if best is not start:
            self.tried.append(
                Trial(
                    num_chunks=start.structure.num_chunks,
                    kept_chunks=best.structure.num_chunks,
                    source=source,
                    makespan_s=best.makespan_s,
                )
            )

    def record(self, num_ops: int, iterations: int) -> None:
        self.lp_solves += 1
        self.simplex_iterations += iterations
        self.lp_work += num_ops

    def add_work(self, other: "SearchLog") -> None:
        """Count ``other``'s LP solves, iterations and work as this log's too (a stage run
        in a log of its own, so that it does not eat into this one's budget)."""
        self.lp_solves += other.lp_solves
        self.simplex_iterations += other.simplex_iterations
        self.lp_work += other.lp_work

    def allow(self, share: float, *, step_share: float | None = None) -> None:
        """Let the next stage run until ``share`` of the budget is spent in all (and, with
        ``step_share``, no more than that share on top of what is spent already)."""
        limit = share * self.budget
        if step_share is not None:
            limit = min(limit, self.lp_work + step_share * self.budget)
        self.stage_limit = limit

    @property
    def over_budget(self) -> bool:
        """The current stage has spent its share: finish the step at hand, then stop."""
        return self.lp_work >= self.stage_limit


def time_unit_s(topology: Topology, message_bytes: float, mix: OrderMix, collective: Collective) -> float:
    """A rough makespan: the LP's times are in this unit so they are O(1)."""
    moves = collective.moves_per_byte
    latency_s = sum(moves * d.latency_s * d.latency_steps for d in topology.dims)
    return mix.time_per_byte_s * half_chain_scale(collective) * message_bytes + latency_s


def better(a: Candidate | None, b: Candidate) -> bool:
    return a is None or b.makespan_s < a.makespan_s * (1 - IMPROVEMENT)


def optimize_structure(
    topology: Topology,
    message_bytes: float,
    orders: tuple[Order, ...],
    sequences: list[tuple[tuple[int, ...], ...]],
    *,
    source: str,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    resequence: bool,
) -> Candidate:
    """Best candidate over ``sequences`` (and re-sequencing rounds when ``resequence``)."""
    collective = options.collective
    table = op_table(topology, orders, collective)
    num_chunks = len(orders)
    uniform = np.full(num_chunks, message_bytes / num_chunks)
    if not options.lp_sizes:
        best: Candidate | None = None
        for seq in sequences:
            makespan = longest_path_s(table, table.durations_s(uniform), seq)
            candidate = Candidate(
                structure=Structure(orders=orders, sequences=seq, source=source, collective=collective),
                sizes_bytes=uniform,
                makespan_s=makespan,
                lp_makespan_s=None,
            )
            if better(best, candidate):
                best = candidate
        assert best is not None
        return best
    model = SizingModel(topology, message_bytes, orders, collective=collective, time_unit_s=unit_s)
    best = None
    seen: set[tuple[tuple[int, ...], ...]] = set()
    pending = list(sequences)
    for _ in range(options.max_rounds + 1):
        improved = False
        for seq in pending:
            if seq in seen:
                continue
            seen.add(seq)
            sizing = model.solve(seq)
            log.record(table.num_ops, sizing.iterations)
            makespan = longest_path_s(table, table.durations_s(sizing.sizes_bytes), seq)
            candidate = Candidate(
                structure=Structure(orders=orders, sequences=seq, source=source, collective=collective),
                sizes_bytes=sizing.sizes_bytes,
                makespan_s=makespan,
                lp_makespan_s=sizing.makespan_s,
            )
            if better(best, candidate):
                best = candidate
                improved = True
        if not (resequence and improved) or best is None or log.over_budget:
            break
        durations = table.durations_s(best.sizes_bytes)
        pending = [list_schedule(table, durations, rule) for rule in BASIC_RULES]
    assert best is not None
    return drop_empty_chunks(topology, message_bytes, best, unit_s=unit_s, log=log)


def candidate_for(
    topology: Topology,
    message_bytes: float,
    source: str,
    orders: tuple[Order, ...],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    rules: tuple[Rule, ...] | None = None,
) -> Candidate:
    """The best candidate for these orders: list-scheduled sequences (every rule up to
    ALL_RULES_MAX_CHUNKS, else the basic ones; or ``rules``), LP sizes, re-sequencing rounds."""
    num_chunks = len(orders)
    table = op_table(topology, orders, options.collective)
    durations = table.durations_s(np.full(num_chunks, message_bytes / num_chunks))
    if rules is None:
        rules = tuple(Rule) if num_chunks <= ALL_RULES_MAX_CHUNKS else BASIC_RULES
    if num_chunks > NESTED_MAX_CHUNKS:
        rules = tuple(rule for rule in rules if rule not in NESTED_RULES)
    sequences = list(dict.fromkeys(list_schedule(table, durations, rule) for rule in rules))
    return optimize_structure(
        topology,
        message_bytes,
        orders,
        sequences,
        source=source,
        options=options,
        unit_s=unit_s,
        log=log,
        resequence=True,
    )


def drop_empty_chunks(
    topology: Topology, message_bytes: float, candidate: Candidate, *, unit_s: float, log: SearchLog
) -> Candidate:
    """Remove zero-size chunks (they would pay latency for nothing) and re-solve the LP.

    Removing ops from fixed sequences can only shorten every path, so the re-solved LP
    is at least as good; repeated in case the new optimum empties another chunk.
    """
    while True:
        empty = {j for j, size in enumerate(candidate.sizes_bytes) if size <= 0}
        if not empty:
            return candidate
        structure = without_chunks(candidate.structure, empty)
        model = SizingModel(
            topology, message_bytes, structure.orders, collective=structure.collective, time_unit_s=unit_s
        )
        sizing = model.solve(structure.sequences)
        table = model.table
        log.record(table.num_ops, sizing.iterations)
        candidate = Candidate(
            structure=structure,
            sizes_bytes=sizing.sizes_bytes,
            makespan_s=longest_path_s(table, table.durations_s(sizing.sizes_bytes), structure.sequences),
            lp_makespan_s=sizing.makespan_s,
        )
