"""Baseline seeds: the baselines' own structures, improved by the sizing LP.

The LP over chunk sizes can only improve a fixed structure (the baseline's own sizes
are a feasible point), so re-sizing the hierarchical, pipelined and Themis schedules
makes HiPIPE never worse than any of them. Only done when the search's best does not
already beat the baseline: most plans never pay for it.
"""

from dataclasses import dataclass, replace

import numpy as np

from hipipe.errors import SolverError
from hipipe.planners.baselines import plan_hierarchical, plan_pipelined, plan_themis, plan_themis_ideal
from hipipe.planners.hipipe.candidates import Candidate, SearchLog, SearchOptions, Trial, optimize_structure
from hipipe.planners.hipipe.structure import Structure
from hipipe.schedule import Collective
from hipipe.topology import Topology


@dataclass(frozen=True, kw_only=True, slots=True)
class Seed:
    """A baseline's own schedule as a structure, with its sizes and simulated makespan."""

    structure: Structure
    sizes_bytes: np.ndarray
    makespan_s: float


def baseline_seeds(
    topology: Topology, message_bytes: int, num_chunks: int | None, collective: Collective
) -> list[Seed]:
    """The hierarchical, pipelined and Themis baselines, run by their own code."""
    seeds: list[Seed] = []
    for name, planner in (
        ("hierarchical", plan_hierarchical),
        ("pipelined", plan_pipelined),
        ("themis", plan_themis),
        ("themis-ideal", plan_themis_ideal),
    ):
        schedule = planner(topology, message_bytes, num_chunks=num_chunks, collective=collective)
        seeds.append(
            Seed(
                structure=Structure(
                    orders=tuple(c.dims_order() for c in schedule.chunks),
                    sequences=schedule.sequences,
                    source=name,
                    collective=collective,
                ),
                sizes_bytes=np.array([c.size_bytes for c in schedule.chunks]),
                makespan_s=schedule.makespan_s,
            )
        )
    return seeds


def improve_with_seeds(
    topology: Topology,
    message_bytes: int,
    best: Candidate | None,
    forced: int | None,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
) -> tuple[Candidate | None, dict[str, float]]:
    """``best``, or a re-sized baseline structure if that is better; and the baselines'
    own makespans. ``forced``: the K the user forced (only same-K seeds then)."""
    baselines: dict[str, float] = {}
    for seed in baseline_seeds(topology, message_bytes, forced, options.collective):
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
            candidate = optimize_structure(
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
            Trial(
                num_chunks=seed.structure.num_chunks,
                source=seed.structure.source,
                makespan_s=candidate.makespan_s,
            )
        )
        if best is None or candidate.makespan_s < best.makespan_s:
            best = candidate
    return best, baselines
