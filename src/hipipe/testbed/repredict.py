"""Recorded testbed runs predicted again under the current cost model.

A fidelity benchmark takes an hour on the 2-core testbed, and its run-to-run noise is
10-30% on many-op rows: a change to the cost model (:mod:`hipipe.predict`) is better
judged first against every run already recorded, in seconds. A ``hipipe bench --json``
document holds what that needs: every row's measured times and (since rows record it)
the schedule it ran, the calibration the rows were predicted on (refitted among them),
and that overhead run's measured times.

Re-predicting keeps every term the calibration measured directly (lines, curves, host
CPU, hand-off, jitter) and, with ``refit_op_s``, fits the per-op cost again on the
recorded overhead run: it is the one term fitted *through* the model (by bisection on
its prediction, :func:`hipipe.testbed.fit.fit_op_s`), so the one a model change moves.
Rows recorded before rows kept their schedules are re-planned on the calibration the
plans were made on: the same schedules for the baselines, and for hipipe only as long as
its planner has not changed (such rows are flagged). A document with a traced run
(``--gantt``) also gets that run's op times set against the same model
(:mod:`hipipe.testbed.residuals`).
"""

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from hipipe.errors import HipipeError
from hipipe.overheads import Overheads
from hipipe.planners import PLANNERS, plan
from hipipe.predict import predicted_s
from hipipe.schedule import schedule_from_dict
from hipipe.testbed.fit import OVERHEAD_NUM_CHUNKS, OVERHEAD_PLANNER, OVERHEAD_SCHEDULE_NAME, fit_op_s, retime
from hipipe.testbed.layout import format_rate
from hipipe.testbed.residuals import TraceResiduals, trace_residuals, traced_panels
from hipipe.topology import Topology
from hipipe.topology_io import topology_from_dict

DOCUMENT_FORMAT = "hipipe.bench"


@dataclass(frozen=True, kw_only=True, slots=True)
class RepredictedRow:
    """One recorded row: what it measured, what was predicted then, and now."""

    name: str
    message_bytes: int
    measured_s: float
    """The recorded median."""
    recorded_s: float
    """The prediction recorded with the run."""
    predicted_s: float
    """The prediction of the current model on the recorded calibration."""
    replanned: bool
    """The document did not hold the row's schedule: it was planned again."""

    @property
    def recorded_ratio(self) -> float:
        return self.measured_s / self.recorded_s

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


@dataclass(frozen=True, kw_only=True, slots=True)
class RepredictedRun:
    """One ``hipipe bench`` document (one testbed) predicted again."""

    shape: str
    rates_bits_per_s: tuple[float, ...]
    recorded_op_s: float
    op_s: float
    """The per-op cost the predictions used: refitted, or the recorded one."""
    rows: tuple[RepredictedRow, ...]
    residuals: TraceResiduals | None = None
    """The traced run's op times against the model (documents of ``hipipe bench --gantt``)."""


def repredict_document(
    document: Any, *, refit_op_s: bool = True, calibration_of: Any = None
) -> RepredictedRun:
    """Every planner row of a ``hipipe bench --json`` document (torch's excepted: its own
    algorithm has no schedule) predicted on the document's calibration by today's model.

    ``calibration_of``: another document of the same testbed (shape and rates) whose
    calibration the rows are predicted on instead. Two calibrations of one testbed differ
    by what the host did while each ran; predicting one run on both shows how much of a
    row's measured / predicted is the calibration's own run-to-run spread.
    """
    _check_format(document)
    source = document
    if calibration_of is not None:
        _check_format(calibration_of)
        if not same_testbed(calibration_of, document):
            raise HipipeError(
                f"the other calibration is of {testbed_name(calibration_of)}, "
                f"these rows ran on {testbed_name(document)}"
            )
        source = calibration_of
    calibration = source.get("calibration")
    if not isinstance(calibration, dict) or "overheads" not in calibration:
        raise HipipeError("this bench document has no calibration to predict on")
    planned_on = topology_from_dict(document["topology"])
    calibrated = planned_on if source is document else topology_from_dict(source["topology"])
    predicting_on = replace(calibrated, overheads=Overheads.from_dict(calibration["overheads"]))
    recorded_op_s = predicting_on.overheads.op_s
    if refit_op_s:
        predicting_on = _with_refitted_op_s(predicting_on, calibration)
    rows = []
    for row in document["rows"]:
        recorded = row.get("schedule")
        if recorded is None and row["name"] not in PLANNERS:
            continue  # torch's all_reduce (its own algorithm), or a tuned row of an older document
        schedule = (
            schedule_from_dict(recorded)
            if recorded is not None
            else plan(planned_on, row["message_bytes"], row["name"])
        )
        rows.append(
            RepredictedRow(
                name=row["name"],
                message_bytes=row["message_bytes"],
                measured_s=row["median_s"],
                recorded_s=row["predicted_s"],
                predicted_s=predicted_s(retime(schedule, predicting_on)),
                replanned=recorded is None,
            )
        )
    traced = traced_panels(document)
    return RepredictedRun(
        shape=document["shape"],
        rates_bits_per_s=tuple(document["rates_bits_per_s"]),
        recorded_op_s=recorded_op_s,
        op_s=predicting_on.overheads.op_s,
        rows=tuple(rows),
        residuals=trace_residuals(*traced, predicting_on) if traced is not None else None,
    )


def same_testbed(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two bench documents ran on the same testbed: shape and rates."""
    return (one.get("shape"), one.get("rates_bits_per_s")) == (
        other.get("shape"),
        other.get("rates_bits_per_s"),
    )


def testbed_name(document: dict[str, Any]) -> str:
    """``2x4 at 100 Mbit/s/50 Mbit/s``."""
    rates = "/".join(format_rate(r) for r in document.get("rates_bits_per_s") or ())
    return f"{document.get('shape')} at {rates}"


def _check_format(document: Any) -> None:
    if not isinstance(document, dict) or document.get("format") != DOCUMENT_FORMAT:
        raise HipipeError(f"not a hipipe bench document (format {DOCUMENT_FORMAT!r} expected)")


def _with_refitted_op_s(topology: Topology, calibration: dict[str, Any]) -> Topology:
    """``topology`` with the per-op cost fitted again on the calibration's recorded overhead run."""
    times_s = calibration.get("overhead_times_s") or []
    if calibration.get("overhead_schedule") != OVERHEAD_SCHEDULE_NAME or not times_s:
        raise HipipeError(
            f"the calibration has no recorded run of the overhead schedule ({OVERHEAD_SCHEDULE_NAME}) "
            "to fit the per-op cost on"
        )
    lines_only = replace(topology, overheads=Overheads())
    schedule = plan(
        lines_only, calibration["overhead_message_bytes"], OVERHEAD_PLANNER, num_chunks=OVERHEAD_NUM_CHUNKS
    )
    overheads = replace(topology.overheads, op_s=0.0)
    op_s = fit_op_s(
        retime(schedule, replace(topology, overheads=overheads)), overheads, statistics.median(times_s)
    )
    return replace(topology, overheads=replace(overheads, op_s=op_s))


def rms_log_error(ratios: list[float]) -> float:
    """The root mean square of ``log(measured / predicted)``: 0.1 is about 10% typical error,
    symmetric in over- and under-prediction."""
    if not ratios:
        return math.nan
    return math.sqrt(sum(math.log(r) ** 2 for r in ratios) / len(ratios))
