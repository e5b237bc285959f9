"""The search around the LP (HIPIPE.md section 5, steps 2, 3, 5 and 6).

For each number of chunks K (a geometric ladder, stopped once it stops improving):
orders from the fluid mix, sequences from a list scheduler on the current sizes, sizes
from the makespan LP, and again (re-sequence on the new sizes, re-solve, warm) until a
round brings nothing. The baselines' own structures (orders + sequences) are seeds: the
LP can only improve a fixed structure, so the result is never worse than a baseline.
"""

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hipipe.bounds import OrderMix, chunked_bound_s, order_loads
from hipipe.errors import SolverError
from hipipe.planners.baselines import plan_hierarchical, plan_pipelined, plan_themis, themis_orders
from hipipe.planners.hipipe.sequencing import BASIC_RULES, Rule, list_schedule, longest_path_s
from hipipe.planners.hipipe.sizing import SizingModel
from hipipe.planners.hipipe.structure import (
    Order,
    Structure,
    assign_orders,
    bookend_orders,
    op_table,
    without_chunks,
)
from hipipe.topology import Topology

CHUNK_LADDER: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Numbers of chunks tried, in order: about x1.4 apart, so the best is never far off."""

FASTEST_FIRST_MAX_CHUNKS = 8
"""Fastest-first orders are tried up to this K; beyond, only the mix can keep dims busy."""

FULL_ROUNDS_MAX_CHUNKS = 16
"""Above this K, one re-sequencing round only: LPs grow with K and late rounds gain little."""

PROBE_CHUNKS: tuple[int, ...] = (32,)
"""Extra Ks tried after the ladder stops, when pipelining pays at all (see PROBE_MIN_CHUNKS)."""

PROBE_MIN_CHUNKS = 6
"""Probe only when the ladder's best K is at least this (a bandwidth-bound message)."""

ALL_RULES_MAX_CHUNKS = 8
"""Up to this K, the first sequences come from every list-scheduling rule (LPs are cheap)."""

MIN_GAIN = 0.002
"""Above FULL_ROUNDS_MAX_CHUNKS, stop the ladder once a K gains less than this (relative)."""

MAX_OPS = 512
"""Ks whose chunks would have more ops than this (K * 2D) are not tried: LP time grows
about quadratically with the ops, and so many chunks only pay off at zero latency,
where they gain well under 1%."""

RETIRE_MARGIN = 0.05
RETIRE_STRIKES = 2
"""An order family that trails the best of its K by 5% twice in a row is not tried at
larger K: its LPs are better spent on the families that work for this network."""

LP_WORK_BUDGET = 6000
"""Plan-time budget, in op-LPs (one LP over n ops counts n): once spent, the search
finishes the K at hand and stops. Deterministic, unlike a wall-clock budget, so the same
input always gets the same plan; ~6000 is about 0.2 s of HiGHS on a 2-core machine."""

IMPROVEMENT = 1e-9
"""Relative gain below which a new candidate does not count as better (LP noise)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOptions:
    """What the search may change; the ablations switch parts of it off."""

    chunk_counts: tuple[int, ...] = CHUNK_LADDER
    lp_sizes: bool = True
    """False: uniform chunk sizes (the ``hipipe-uniform`` ablation)."""
    ascending_only: bool = False
    """True: every chunk in ascending order (the ``hipipe-fixed-order`` ablation)."""
    baseline_seeds: bool = True
    max_rounds: int = 3
    """Re-sequencing rounds per K after the first LP."""
    patience: int = 2
    """Stop the K ladder after this many Ks in a row that do not improve on the best
    (one, above ``FULL_ROUNDS_MAX_CHUNKS``, where each K costs more)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A structure with its sizes and the makespan they give."""

    structure: Structure
    sizes_bytes: np.ndarray
    makespan_s: float
    """Longest path of the fixed sequences with these sizes (what the simulator will say)."""
    lp_makespan_s: float | None
    """The LP optimum for this structure (None when sizes are not from the LP)."""


@dataclass(kw_only=True)
class SearchLog:
    """What the search tried, for ``Schedule.info``. Mutable: filled in as it goes."""

    tried: list[dict[str, Any]] = field(default_factory=list)
    lp_solves: int = 0
    simplex_iterations: int = 0
    lp_work: int = 0
    """Sum over LP solves of the ops each LP had: what the plan-time budget counts."""
    strikes: dict[str, int] = field(default_factory=dict)
    """Per order family, how many Ks in a row it trailed that K's best by RETIRE_MARGIN."""
    retired: set[str] = field(default_factory=set)
    """Families no longer tried at larger K (the mix never retires)."""

    def record(self, num_ops: int, iterations: int) -> None:
        self.lp_solves += 1
        self.simplex_iterations += iterations
        self.lp_work += num_ops

    @property
    def over_budget(self) -> bool:
        return self.lp_work >= LP_WORK_BUDGET


def time_unit_s(topology: Topology, message_bytes: float, mix: OrderMix) -> float:
    """A rough makespan: the LP's times are in this unit so they are O(1)."""
    latency_s = sum(2 * d.latency_s * d.latency_steps for d in topology.dims)
    return mix.time_per_byte_s * message_bytes + latency_s


def _better(a: Candidate | None, b: Candidate) -> bool:
    return a is None or b.makespan_s < a.makespan_s * (1 - IMPROVEMENT)


def _optimize_structure(
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
    table = op_table(topology, orders)
    num_chunks = len(orders)
    uniform = np.full(num_chunks, message_bytes / num_chunks)
    if not options.lp_sizes:
        best: Candidate | None = None
        for seq in sequences:
            makespan = longest_path_s(table, table.durations_s(uniform), seq)
            candidate = Candidate(
                structure=Structure(orders=orders, sequences=seq, source=source),
                sizes_bytes=uniform,
                makespan_s=makespan,
                lp_makespan_s=None,
            )
            if _better(best, candidate):
                best = candidate
        assert best is not None
        return best
    model = SizingModel(topology, message_bytes, orders, time_unit_s=unit_s)
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
                structure=Structure(orders=orders, sequences=seq, source=source),
                sizes_bytes=sizing.sizes_bytes,
                makespan_s=makespan,
                lp_makespan_s=sizing.makespan_s,
            )
            if _better(best, candidate):
                best = candidate
                improved = True
        if not (resequence and improved) or best is None or log.over_budget:
            break
        durations = table.durations_s(best.sizes_bytes)
        pending = [list_schedule(table, durations, rule) for rule in BASIC_RULES]
    assert best is not None
    return drop_empty_chunks(topology, message_bytes, best, unit_s=unit_s, log=log)


def fastest_first(topology: Topology) -> Order:
    """The order that makes one chunk's chain shortest: dims by descending bandwidth.

    Swapping adjacent dims i, j changes the chain's bandwidth time by a factor of
    ``1/B_i - 1/B_j`` (the ``(n-1)/n`` terms cancel), so faster dims go first. Every
    order pays the same latencies, so this is the best single order for K = 1 and the
    natural one for latency-bound messages (few chunks, little to overlap).
    """
    return tuple(sorted(range(topology.num_dims), key=lambda k: (-topology.dims[k].bandwidth_bytes_per_s, k)))


def _families(
    topology: Topology, message_bytes: float, mix: OrderMix, num_chunks: int, options: SearchOptions
) -> list[tuple[str, tuple[Order, ...]]]:
    """Chunk orders to try for this K: the fluid mix (with bookends when a light order
    would be left out), Themis' greedy orders, and fastest-first for small K."""
    if options.ascending_only:
        return [("ascending", (tuple(range(topology.num_dims)),) * num_chunks)]
    families = [("mix", assign_orders(mix.orders, mix.weights, num_chunks))]
    if num_chunks > 1:
        # Themis' greedy orders (least-loaded dims first, chunk by chunk): many distinct
        # orders where the mix has a few, which often fills and drains the pipeline better.
        greedy = tuple(
            tuple(k for group in order for k in group)
            for order in themis_orders(topology, int(message_bytes), num_chunks)
        )
        if greedy != families[0][1]:
            families.append(("greedy", greedy))
    bookends = bookend_orders(mix.orders, mix.weights, num_chunks)
    if bookends is not None and not set(mix.orders) <= set(families[0][1]):
        # Some order of the mix is too light to get a chunk of its own at this K: give
        # it a chunk at each end, where it keeps the dims it starts on busy.
        families.append(("mix-bookends", bookends))
    single = (fastest_first(topology),) * num_chunks
    if num_chunks <= FASTEST_FIRST_MAX_CHUNKS and single != families[0][1]:
        families.append(("fastest-first", single))
    return families


def _candidate_for(
    topology: Topology,
    message_bytes: float,
    source: str,
    orders: tuple[Order, ...],
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    num_chunks = len(orders)
    table = op_table(topology, orders)
    durations = table.durations_s(np.full(num_chunks, message_bytes / num_chunks))
    rules = tuple(Rule) if num_chunks <= ALL_RULES_MAX_CHUNKS else BASIC_RULES
    sequences = list(dict.fromkeys(list_schedule(table, durations, rule) for rule in rules))
    return _optimize_structure(
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


@dataclass(frozen=True, kw_only=True, slots=True)
class Seed:
    """A baseline's own schedule as a structure, with its sizes and simulated makespan."""

    structure: Structure
    sizes_bytes: np.ndarray
    makespan_s: float


def baseline_seeds(topology: Topology, message_bytes: int, num_chunks: int | None) -> list[Seed]:
    """The hierarchical, pipelined and Themis baselines, run by their own code."""
    seeds: list[Seed] = []
    for name, planner in (
        ("hierarchical", plan_hierarchical),
        ("pipelined", plan_pipelined),
        ("themis", plan_themis),
    ):
        schedule = planner(topology, message_bytes, num_chunks=num_chunks)
        seeds.append(
            Seed(
                structure=Structure(
                    orders=tuple(c.dims_order() for c in schedule.chunks),
                    sequences=schedule.sequences,
                    source=name,
                ),
                sizes_bytes=np.array([c.size_bytes for c in schedule.chunks]),
                makespan_s=schedule.makespan_s,
            )
        )
    return seeds


def _best_for_chunks(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate | None:
    """Best candidate over the order families for one K (logged in ``log.tried``); None if
    every LP failed."""
    best_here: Candidate | None = None
    rounds = options.max_rounds if num_chunks <= FULL_ROUNDS_MAX_CHUNKS else min(1, options.max_rounds)
    results: dict[str, float] = {}
    for source, orders in _families(topology, message_bytes, mix, num_chunks, options):
        if source in log.retired:
            continue
        try:
            candidate = _candidate_for(
                topology,
                message_bytes,
                source,
                orders,
                options=replace(options, max_rounds=rounds),
                unit_s=unit_s,
                log=log,
            )
        except SolverError as error:
            # One structure's LP failing is no reason to fail the plan: skip it, say so.
            log.tried.append({"num_chunks": num_chunks, "source": source, "error": str(error)})
            continue
        log.tried.append(
            {
                "num_chunks": num_chunks,
                "kept_chunks": candidate.structure.num_chunks,
                "source": source,
                "makespan_s": candidate.makespan_s,
            }
        )
        results[source] = candidate.makespan_s
        if _better(best_here, candidate):
            best_here = candidate
    if best_here is not None:
        for source, makespan_s in results.items():
            behind = makespan_s > best_here.makespan_s * (1 + RETIRE_MARGIN)
            log.strikes[source] = log.strikes.get(source, 0) + 1 if behind else 0
            if log.strikes[source] >= RETIRE_STRIKES and source != "mix":
                log.retired.add(source)
    return best_here


def _requested_chunks(log: SearchLog, best: Candidate) -> int:
    """The K the ladder asked for when it found ``best`` (before empty chunks were dropped)."""
    for entry in log.tried:
        if entry.get("makespan_s") == best.makespan_s and "kept_chunks" in entry:
            return int(entry["num_chunks"])
    return best.structure.num_chunks


def search(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    *,
    options: SearchOptions,
    log: SearchLog,
) -> tuple[Candidate, dict[str, float]]:
    """Best candidate over the K ladder and the baseline seeds; also the baselines' makespans."""
    unit_s = time_unit_s(topology, message_bytes, mix)
    best: Candidate | None = None
    misses = 0
    tried: set[int] = set()
    loads = order_loads(topology)
    for num_chunks in options.chunk_counts:
        if len(options.chunk_counts) > 1 and num_chunks * 2 * topology.num_dims > MAX_OPS:
            break
        if best is not None and log.over_budget:
            log.tried.append({"num_chunks": num_chunks, "pruned": "plan-time budget spent"})
            break
        if (
            best is not None
            and chunked_bound_s(topology, message_bytes, num_chunks, loads=loads) >= best.makespan_s
        ):
            log.tried.append({"num_chunks": num_chunks, "pruned": "latency floor >= best"})
            break  # the floor grows with K: no larger K can win either
        tried.add(num_chunks)
        best_here = _best_for_chunks(
            topology, message_bytes, mix, num_chunks, options=options, unit_s=unit_s, log=log
        )
        if best_here is not None and _better(best, best_here):
            gain = 1 - best_here.makespan_s / best.makespan_s if best is not None else 1.0
            best = best_here
            # A K above the full-rounds range that gains almost nothing still counts as a
            # miss: the next K costs more than it can bring.
            misses = 1 if num_chunks > FULL_ROUNDS_MAX_CHUNKS and gain < MIN_GAIN else 0
            if misses >= 1 and num_chunks > FULL_ROUNDS_MAX_CHUNKS:
                break
        else:
            misses += 1
            if misses >= (options.patience if num_chunks <= FULL_ROUNDS_MAX_CHUNKS else 1):
                break
    if (
        best is not None
        and len(options.chunk_counts) > 1
        and _requested_chunks(log, best) >= PROBE_MIN_CHUNKS
    ):
        # Probes: many chunks, one round. The LP empties the chunks it does not want and
        # they are dropped, so a large K lets the LP choose which chunks to keep: it finds
        # structures the ladder's neighbours miss.
        for num_chunks in PROBE_CHUNKS:
            if num_chunks in tried or num_chunks * 2 * topology.num_dims > MAX_OPS or log.over_budget:
                continue
            candidate = _best_for_chunks(
                topology, message_bytes, mix, num_chunks, options=options, unit_s=unit_s, log=log
            )
            if candidate is not None and _better(best, candidate):
                best = candidate
    assert best is not None
    baselines: dict[str, float] = {}
    if options.baseline_seeds:
        forced = options.chunk_counts[0] if len(options.chunk_counts) == 1 else None
        for seed in baseline_seeds(topology, message_bytes, forced):
            baselines[seed.structure.source] = seed.makespan_s
            if forced is not None and seed.structure.num_chunks != forced:
                continue
            if best is not None and best.makespan_s <= seed.makespan_s:
                continue  # already at least as good: no need to improve this seed
            own_sizes = Candidate(
                structure=seed.structure,
                sizes_bytes=seed.sizes_bytes,
                makespan_s=seed.makespan_s,
                lp_makespan_s=None,
            )
            try:
                candidate = _optimize_structure(
                    topology,
                    message_bytes,
                    seed.structure.orders,
                    [seed.structure.sequences],
                    source=seed.structure.source,
                    options=replace(options, max_rounds=0),
                    unit_s=unit_s,
                    log=log,
                    resequence=False,
                )
            except SolverError:
                candidate = own_sizes  # the baseline's own sizes are feasible by construction
            if candidate.makespan_s > seed.makespan_s:
                candidate = own_sizes  # LP round-off lost a hair against its starting point
            log.tried.append(
                {
                    "num_chunks": seed.structure.num_chunks,
                    "source": seed.structure.source,
                    "makespan_s": candidate.makespan_s,
                }
            )
            if best is None or candidate.makespan_s < best.makespan_s:
                best = candidate
    if best is None:
        errors = [entry["error"] for entry in log.tried if "error" in entry]
        raise SolverError(errors[-1] if errors else "no candidate schedule was found")
    return best, baselines


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
        model = SizingModel(topology, message_bytes, structure.orders, time_unit_s=unit_s)
        sizing = model.solve(structure.sequences)
        table = op_table(topology, structure.orders)
        log.record(table.num_ops, sizing.iterations)
        candidate = Candidate(
            structure=structure,
            sizes_bytes=sizing.sizes_bytes,
            makespan_s=longest_path_s(table, table.durations_s(sizing.sizes_bytes), structure.sequences),
            lp_makespan_s=sizing.makespan_s,
        )
