"""The search around the LP (HIPIPE.md section 5, steps 2, 3, 5 and 6).

For each number of chunks K (a geometric ladder, stopped once it stops improving):
orders from the fluid mix, sequences from a list scheduler on the current sizes, sizes
from the makespan LP, and again (re-sequence on the new sizes, re-solve, warm) until a
round brings nothing. The baselines' own structures (orders + sequences) are seeds: the
LP can only improve a fixed structure, so the result is never worse than a baseline.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hipipe.bounds import OrderMix
from hipipe.planners.baselines import plan_hierarchical, plan_pipelined, plan_themis
from hipipe.planners.hipipe.sequencing import Rule, list_schedule, longest_path_s
from hipipe.planners.hipipe.sizing import SizingModel
from hipipe.planners.hipipe.structure import Order, Structure, assign_orders, op_table, without_chunks
from hipipe.topology import Topology

CHUNK_LADDER: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Numbers of chunks tried, in order: about x1.4 apart, so the best is never far off."""

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
    """Stop the K ladder after this many Ks in a row that do not improve on the best."""


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
            log.lp_solves += 1
            log.simplex_iterations += sizing.iterations
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
        if not (resequence and improved) or best is None:
            break
        durations = table.durations_s(best.sizes_bytes)
        pending = [list_schedule(table, durations, rule) for rule in Rule]
    assert best is not None
    return best


def _mix_candidate(
    topology: Topology,
    message_bytes: float,
    mix: OrderMix,
    num_chunks: int,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> Candidate:
    if options.ascending_only:
        orders = (tuple(range(topology.num_dims)),) * num_chunks
    else:
        orders = assign_orders(mix.orders, mix.weights, num_chunks)
    table = op_table(topology, orders)
    durations = table.durations_s(np.full(num_chunks, message_bytes / num_chunks))
    sequences = [list_schedule(table, durations, rule) for rule in Rule]
    return _optimize_structure(
        topology,
        message_bytes,
        orders,
        sequences,
        source="mix" if not options.ascending_only else "ascending",
        options=options,
        unit_s=unit_s,
        log=log,
        resequence=True,
    )


def baseline_makespans_and_seeds(
    topology: Topology, message_bytes: int, num_chunks: int | None
) -> tuple[dict[str, float], list[Structure]]:
    """The hierarchical, pipelined and Themis baselines: their makespans and structures."""
    makespans: dict[str, float] = {}
    seeds: list[Structure] = []
    for name, planner in (
        ("hierarchical", plan_hierarchical),
        ("pipelined", plan_pipelined),
        ("themis", plan_themis),
    ):
        schedule = planner(topology, message_bytes, num_chunks=num_chunks)
        makespans[name] = schedule.makespan_s
        seeds.append(
            Structure(
                orders=tuple(c.dims_order() for c in schedule.chunks),
                sequences=schedule.sequences,
                source=name,
            )
        )
    return makespans, seeds


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
    for num_chunks in options.chunk_counts:
        candidate = _mix_candidate(
            topology, message_bytes, mix, num_chunks, options=options, unit_s=unit_s, log=log
        )
        log.tried.append(
            {
                "num_chunks": num_chunks,
                "source": candidate.structure.source,
                "makespan_s": candidate.makespan_s,
            }
        )
        if _better(best, candidate):
            best, misses = candidate, 0
        else:
            misses += 1
            if misses >= options.patience:
                break
    assert best is not None
    baselines: dict[str, float] = {}
    if options.baseline_seeds:
        forced = options.chunk_counts[0] if len(options.chunk_counts) == 1 else None
        baselines, seeds = baseline_makespans_and_seeds(topology, message_bytes, forced)
        for seed in seeds:
            if forced is not None and seed.num_chunks != forced:
                continue
            if best.makespan_s <= baselines[seed.source]:
                continue  # already at least as good: no need to improve this seed
            candidate = _optimize_structure(
                topology,
                message_bytes,
                seed.orders,
                [seed.sequences],
                source=seed.source,
                options=options,
                unit_s=unit_s,
                log=log,
                resequence=True,
            )
            log.tried.append(
                {"num_chunks": seed.num_chunks, "source": seed.source, "makespan_s": candidate.makespan_s}
            )
            if _better(best, candidate):
                best = candidate
    return best, baselines


def drop_empty_chunks(
    topology: Topology, message_bytes: int, candidate: Candidate, *, unit_s: float, log: SearchLog
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
        log.lp_solves += 1
        log.simplex_iterations += sizing.iterations
        table = op_table(topology, structure.orders)
        candidate = Candidate(
            structure=structure,
            sizes_bytes=sizing.sizes_bytes,
            makespan_s=longest_path_s(table, table.durations_s(sizing.sizes_bytes), structure.sequences),
            lp_makespan_s=sizing.makespan_s,
        )
