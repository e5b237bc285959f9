"""A traced bench run's op times against what the cost model charges each op.

A row's measured / predicted says *that* a prediction is off, not *where*. ``hipipe bench
--gantt PLANNER`` keeps rank 0's start and end of every op of one run; this module sets
each op's measured duration beside the mean duration the replay (:mod:`hipipe.predict`)
gives it on the calibration the rows were predicted on, with the other dims that were
busy while it ran, and sums them per (dims, phase, size) and per dim.

The comparison has to be the replay's *mean* (:func:`hipipe.predict.mean_op_duration_s`),
jitter included: an op on a measured curve has the mean arrival delay taken out of its
base time and added back by the jitter, so comparing with the base alone reads every such
op as 20-50% slower than modelled when it is not (a misreading this module exists to
prevent). Rank 0's duration runs from its own start: a late partner shows up in it as
the latest arrival the jitter models.

Pure and torch-free.
"""

import statistics
from dataclasses import dataclass
from typing import Any

from hipipe.cost import group_size
from hipipe.errors import HipipeError
from hipipe.predict import mean_op_duration_s, op_base_times_s, other_dims_busy
from hipipe.schedule import Schedule, schedule_from_dict
from hipipe.testbed.fit import retime
from hipipe.topology import Topology


@dataclass(frozen=True, kw_only=True, slots=True)
class OpGroup:
    """The ops of one traced run that share dims, phase and size."""

    dims: tuple[int, ...]
    phase: str
    full_bytes: float
    count: int
    measured_s: float
    """Median measured duration (rank 0)."""
    modelled_s: float
    """Median of the replay's mean durations of these ops."""

    @property
    def ratio(self) -> float:
        return self.measured_s / self.modelled_s if self.modelled_s > 0 else float("inf")


@dataclass(frozen=True, kw_only=True, slots=True)
class DimLoad:
    """One dim's total op time in the traced run, measured and modelled."""

    dim: int
    ops: int
    measured_busy_s: float
    modelled_busy_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceResiduals:
    """Every op of one traced run against the model, grouped."""

    planner: str
    message_bytes: int
    measured_makespan_s: float
    groups: tuple[OpGroup, ...]
    dims: tuple[DimLoad, ...]


def traced_panels(document: dict[str, Any]) -> tuple[Schedule, Schedule] | None:
    """The (planned, measured) schedules of a bench document's traced run; None without one."""
    panels = document.get("gantt") or []
    planned = [p for p in panels if not p["schedule"].get("info", {}).get("measured")]
    measured = [p for p in panels if p["schedule"].get("info", {}).get("measured")]
    if not planned or not measured:
        return None
    return schedule_from_dict(planned[0]["schedule"]), schedule_from_dict(measured[0]["schedule"])


def trace_residuals(planned: Schedule, measured: Schedule, predicting_on: Topology) -> TraceResiduals:
    """``measured``'s op durations (``planned`` as run) against the model on ``predicting_on``."""
    if len(planned.ops) != len(measured.ops) or planned.sequences != measured.sequences:
        raise HipipeError("the measured trace is not a run of the planned schedule")
    schedule = retime(planned, predicting_on)
    base_s = op_base_times_s(schedule)
    jitter_s = predicting_on.overheads.jitter_s
    num_dims = predicting_on.num_dims
    durations: dict[tuple[tuple[int, ...], str, float], list[tuple[float, float]]] = {}
    busy: list[list[float]] = [[0.0, 0.0] for _ in range(num_dims)]
    measured_times_s = [(op.start_s, op.end_s) for op in measured.ops]
    for op, seen in zip(schedule.ops, measured.ops, strict=True):
        others = other_dims_busy(schedule, measured_times_s, op.index)
        modelled_s = mean_op_duration_s(
            base_s(op.index, others), jitter_s, group_size(predicting_on, op.dims)
        )
        measured_s = seen.end_s - seen.start_s
        durations.setdefault((op.dims, op.phase.value, op.full_bytes), []).append((measured_s, modelled_s))
        for k in op.dims:
            busy[k][0] += measured_s
            busy[k][1] += modelled_s
    groups = tuple(
        OpGroup(
            dims=dims,
            phase=phase,
            full_bytes=full_bytes,
            count=len(pairs),
            measured_s=statistics.median(m for m, _ in pairs),
            modelled_s=statistics.median(e for _, e in pairs),
        )
        for (dims, phase, full_bytes), pairs in sorted(durations.items())
    )
    return TraceResiduals(
        planner=planned.planner,
        message_bytes=planned.message_bytes,
        measured_makespan_s=measured.makespan_s,
        groups=groups,
        dims=tuple(
            DimLoad(dim=k, ops=len(schedule.sequences[k]), measured_busy_s=m, modelled_busy_s=e)
            for k, (m, e) in enumerate(busy)
        ),
    )
