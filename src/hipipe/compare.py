"""Run several planners over several message sizes and measure them against the bounds.

This is the API behind ``hipipe compare``: plain data in, plain data out, so the
terminal table, the JSON document and the benchmarks all read the same numbers.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hipipe.bounds import best_bound_s, order_mix_bound_s, pipeline_bound_s
from hipipe.cost import lower_bound_s
from hipipe.planners import get_planner, validate_request
from hipipe.planners import plan as run_planner
from hipipe.predict import predict
from hipipe.schedule import Collective
from hipipe.topology import Topology
from hipipe.topology_io import topology_to_dict

DEFAULT_PLANNERS: tuple[str, ...] = ("ring", "hierarchical", "pipelined", "themis", "themis-ideal", "hipipe")
DEFAULT_SIZES_BYTES: tuple[int, ...] = (2**20, 2**24, 2**28, 2**30)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerResult:
    """One planner on one message size."""

    planner: str
    size_bytes: int
    time_s: float
    utilization: float
    """``T* / time_s`` (docs/MODEL.md section 4)."""
    mix_utilization: float
    """``T_mix / time_s``: how close to the best any hierarchical order mix can do."""
    best_bound_utilization: float
    """``max(T_mix, T_pipe) / time_s``: how close to the tightest floor hipipe knows."""
    num_chunks: int
    plan_time_s: float
    collective: Collective = Collective.ALL_REDUCE
    predicted_s: float | None = None
    """Median of :func:`hipipe.predict.predict` when the topology has non-linear overheads."""
    predicted_low_high_s: tuple[float, float] | None = None
    """Its 10th and 90th percentiles."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeBounds:
    size_bytes: int
    lower_bound_s: float
    order_mix_bound_s: float
    pipeline_bound_s: float
    """``T_pipe``: latency + load + fill/drain, for any number of chunks (:mod:`hipipe.bounds`)."""
    best_bound_s: float
    """``max(T_mix, T_pipe)``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    topology: Topology
    bounds: tuple[SizeBounds, ...]
    results: tuple[PlannerResult, ...]
    collective: Collective = Collective.ALL_REDUCE

    def for_size(self, size_bytes: int) -> list[PlannerResult]:
        return [r for r in self.results if r.size_bytes == size_bytes]


def compare(
    topology: Topology,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    planners: Sequence[str] = DEFAULT_PLANNERS,
    *,
    num_chunks: int | None = None,
    collective: Collective | str = Collective.ALL_REDUCE,
    on_progress: Callable[[str, int], None] | None = None,
) -> Comparison:
    """Plan every (size, planner) pair; ``on_progress(planner, size)`` after each one."""
    kind = Collective.parse(collective)
    for name in planners:
        get_planner(name)  # fail on a typo or a bad size before any work is done
    for size in sizes_bytes:
        validate_request(topology, size, num_chunks=num_chunks, collective=kind)
    bounds = tuple(
        SizeBounds(
            size_bytes=size,
            lower_bound_s=lower_bound_s(topology, size, kind),
            order_mix_bound_s=order_mix_bound_s(topology, size, kind),
            pipeline_bound_s=pipeline_bound_s(topology, size, kind),
            best_bound_s=best_bound_s(topology, size, kind),
        )
        for size in sizes_bytes
    )
    results = []
    for bound in bounds:
        for name in planners:
            started = time.perf_counter()
            schedule = run_planner(topology, bound.size_bytes, name, num_chunks=num_chunks, collective=kind)
            plan_time_s = time.perf_counter() - started
            prediction = None if topology.overheads.is_linear else predict(schedule)
            results.append(
                PlannerResult(
                    planner=name,
                    size_bytes=bound.size_bytes,
                    time_s=schedule.makespan_s,
                    utilization=bound.lower_bound_s / schedule.makespan_s,
                    mix_utilization=bound.order_mix_bound_s / schedule.makespan_s,
                    best_bound_utilization=bound.best_bound_s / schedule.makespan_s,
                    num_chunks=schedule.num_chunks,
                    plan_time_s=plan_time_s,
                    collective=kind,
                    predicted_s=None if prediction is None else prediction.median_s,
                    predicted_low_high_s=None
                    if prediction is None
                    else (prediction.low_s, prediction.high_s),
                )
            )
            if on_progress is not None:
                on_progress(name, bound.size_bytes)
    return Comparison(topology=topology, bounds=bounds, results=tuple(results), collective=kind)


def comparison_to_dict(comparison: Comparison) -> dict[str, Any]:
    """The ``hipipe compare --json`` document."""
    topo = comparison.topology
    return {
        "collective": comparison.collective.value,
        "topology": {"label": topo.label(), "num_npus": topo.num_npus, **topology_to_dict(topo)},
        "bounds": [
            {
                "size_bytes": b.size_bytes,
                "lower_bound_s": b.lower_bound_s,
                "order_mix_bound_s": b.order_mix_bound_s,
                "pipeline_bound_s": b.pipeline_bound_s,
                "best_bound_s": b.best_bound_s,
            }
            for b in comparison.bounds
        ],
        "results": [
            {
                "collective": r.collective.value,
                "planner": r.planner,
                "size_bytes": r.size_bytes,
                "time_s": r.time_s,
                "utilization": r.utilization,
                "mix_utilization": r.mix_utilization,
                "best_bound_utilization": r.best_bound_utilization,
                "num_chunks": r.num_chunks,
                "plan_time_s": r.plan_time_s,
            }
            | (
                {}
                if r.predicted_s is None or r.predicted_low_high_s is None
                else {"predicted_s": r.predicted_s, "predicted_p10_p90_s": list(r.predicted_low_high_s)}
            )
            for r in comparison.results
        ],
    }
