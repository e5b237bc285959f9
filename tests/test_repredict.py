"""Recorded bench runs predicted again (``hipipe.testbed.repredict``, ``benchmarks/repredict.py``).

Pure and torch-free: a bench document is built from a synthetic calibration whose overhead
run was slower than its model (so the per-op cost is fitted), written as ``hipipe bench
--json`` writes it, and predicted again.
"""

import functools
import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hipipe.errors import HipipeError
from hipipe.planners import plan
from hipipe.predict import mean_op_duration_s, predicted_s, replay_op_times_s
from hipipe.report.bench import result_to_dict
from hipipe.schedule import schedule_from_dict, schedule_to_dict
from hipipe.testbed.fit import (
    Calibration,
    OverheadRun,
    Sample,
    calibration_from_samples,
    fit_all,
    overhead_schedule,
    retime,
)
from hipipe.testbed.protocol import measured_schedule
from hipipe.testbed.repredict import repredict_document, rms_log_error
from hipipe.testbed.results import BenchConfig, BenchResult, BenchRow

MIB = 1 << 20
SIZES = (2, 4)
RATES = (100e6, 50e6)
REPO = Path(__file__).resolve().parent.parent


def _calibration() -> Calibration:
    """Lines of 1 ms + the wire; an overhead run 30% slower than they predict (no traces,
    no host term): the per-op cost is what the bisection gives it."""
    return _calibration_with(1e-3)


@functools.cache
def _calibration_with(op_latency_s: float) -> Calibration:
    """:func:`_calibration` with lines of ``op_latency_s`` + the wire."""
    samples = []
    for dim, n in enumerate(SIZES):
        bytes_per_s = RATES[dim] / 8
        for full_bytes in (64 << 10, 1 << 20, 4 << 20):
            time_s = op_latency_s + (n - 1) / n * full_bytes / bytes_per_s
            samples += [
                Sample(dim=dim, phase=phase, full_bytes=full_bytes, time_s=time_s) for phase in ("RS", "AG")
            ]
    fits = fit_all(SIZES, samples)
    schedule = overhead_schedule(fits, 4 * MIB)
    run = OverheadRun(schedule=schedule, times_s=(1.3 * schedule.makespan_s,) * 3)
    calibration = calibration_from_samples(SIZES, samples, overhead=run)
    assert calibration.overheads.op_s > 0
    return calibration


def _document(calibration: Calibration) -> dict[str, Any]:
    """What ``hipipe bench --json`` writes for three planners at 4 MiB, each measured 5%
    slower than its prediction on ``calibration``; a fresh copy each call."""
    return json.loads(_document_text(calibration))


@functools.cache
def _document_text(calibration: Calibration) -> str:
    """:func:`_document`, planned once (hipipe re-times its best candidates: seconds)."""
    topology = calibration.topology()
    rows = []
    for name in ("hipipe", "themis", "hierarchical"):
        schedule = plan(topology, 4 * MIB, name)
        predicted = predicted_s(schedule)
        rows.append(
            BenchRow(
                name=name,
                message_bytes=4 * MIB,
                num_ranks=8,
                times_s=(1.05 * predicted,),
                predicted_s=predicted,
                schedule=schedule,
            )
        )
    result = BenchResult(
        config=BenchConfig(
            sizes=SIZES, rates_bits_per_s=RATES, messages_bytes=(4 * MIB,), include_torch=False
        ),
        prefix="hp0000",
        kernel="",
        rates=(),
        calibration=calibration,
        topology=topology,
        rows=tuple(rows),
    )
    return json.dumps(result_to_dict(result), allow_nan=False)


@pytest.mark.slow
@pytest.mark.one_process
def test_a_recorded_run_is_predicted_again_exactly_as_it_was_by_the_same_model() -> None:
    calibration = _calibration()
    document = _document(calibration)
    assert all("schedule" in row for row in document["rows"])  # the rows keep what they ran
    run = repredict_document(document)
    assert [r.name for r in run.rows] == ["hipipe", "themis", "hierarchical"]
    for row, recorded in zip(run.rows, document["rows"], strict=True):
        assert not row.replanned
        assert row.predicted_s == pytest.approx(recorded["predicted_s"], rel=1e-5)
        assert row.ratio == pytest.approx(1.05, rel=1e-5) and row.recorded_ratio == pytest.approx(1.05)
    # The per-op cost fitted again on the recorded overhead run is the recorded one.
    assert run.op_s == pytest.approx(calibration.overheads.op_s, rel=1e-4)
    assert run.recorded_op_s == calibration.overheads.op_s
    kept = repredict_document(document, refit_op_s=False)
    assert kept.op_s == calibration.overheads.op_s


def test_the_per_op_cost_is_fitted_again_through_the_model_it_serves() -> None:
    calibration = _calibration()
    document = _document(calibration)
    # A model that charges more elsewhere (a 50 us hand-off between dims) leaves less of the
    # overhead run to the per-op cost: refitted, it drops, and the overhead run is still matched.
    overheads = dict(document["calibration"]["overheads"], handoff_s=5e-5)
    changed = dict(document, calibration=dict(document["calibration"], overheads=overheads))
    refitted = repredict_document(changed)
    assert 0 < refitted.op_s < calibration.overheads.op_s
    on = replace(
        calibration.topology(), overheads=replace(calibration.overheads, handoff_s=5e-5, op_s=refitted.op_s)
    )
    run = calibration.overhead_run
    assert run is not None
    assert predicted_s(retime(run.schedule, on)) == pytest.approx(run.times_s[0], rel=1e-3)  # bisection
    # Kept instead, the recorded per-op cost plus the hand-off over-predicts every multi-op row.
    kept = repredict_document(changed, refit_op_s=False)
    for before, after in zip(repredict_document(document).rows, kept.rows, strict=True):
        assert after.predicted_s >= before.predicted_s


@pytest.mark.slow
@pytest.mark.one_process
def test_documents_without_schedules_are_replanned_and_flagged() -> None:
    document = _document(_calibration())
    for row in document["rows"]:
        del row["schedule"]
    document["rows"].append(dict(document["rows"][0], name="torch.distributed.all_reduce"))
    run = repredict_document(document)
    assert [r.name for r in run.rows] == ["hipipe", "themis", "hierarchical"]  # torch's has no schedule
    assert all(r.replanned for r in run.rows)
    # Planned again on the same topology by the same code: the same predictions.
    for row, recorded in zip(run.rows, document["rows"], strict=False):
        assert row.predicted_s == pytest.approx(recorded["predicted_s"], rel=1e-5)


def test_what_cannot_be_predicted_again_is_one_line() -> None:
    with pytest.raises(HipipeError, match="not a hipipe bench document"):
        repredict_document({"rows": []})
    document = _document(_calibration())
    with pytest.raises(HipipeError, match="no recorded run of the overhead schedule"):
        repredict_document(dict(document, calibration=dict(document["calibration"], overhead_times_s=[])))
    assert repredict_document(
        dict(document, calibration=dict(document["calibration"], overhead_times_s=[])), refit_op_s=False
    ).rows
    assert rms_log_error([1.1, 1 / 1.1]) == pytest.approx(0.0953, abs=1e-4)


def test_the_benchmark_script_reads_a_testbed_benchmark_log_and_ends_with_one_json_line(
    tmp_path: Path,
) -> None:
    document = _document(_calibration())
    log = tmp_path / "bench.log"
    log.write_text(
        "card lines\n"
        + json.dumps({"benchmark": "testbed", "runs": [document, _traced(document, 1.25)]})
        + "\n"
    )
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "repredict.py"), str(log)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 6 and summary["replanned"] == 0
    assert summary["within_10pct_recorded"] == summary["within_10pct_now"] == 6
    assert summary["rms_log_error_now"] == pytest.approx(summary["rms_log_error_recorded"], rel=1e-4)
    assert [t["planner"] for t in summary["traced_dim_busy_measured_over_modelled"]] == ["themis"]
    assert summary["traced_dim_busy_measured_over_modelled"][0]["per_dim"] == pytest.approx([1.25, 1.0])
    assert "traced themis 4 MiB (rank 0)" in done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    failed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "repredict.py"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stdout.strip().splitlines() == [
        f"error: {bad}: neither a hipipe bench document nor a testbed benchmark's JSON"
    ]


def _traced(document: dict[str, Any], stretch_dim0: float) -> dict[str, Any]:
    """``document`` with a traced run of its themis row, as ``hipipe bench --gantt themis``
    writes it: the run replayed on the calibration, dim 0's ops then ``stretch_dim0`` longer."""
    calibration = _calibration()
    planned = retime(schedule_from_dict(document["rows"][1]["schedule"]), calibration.topology())
    starts, ends = replay_op_times_s(planned, random.Random(0))
    times = [
        (s, s + (e - s) * (stretch_dim0 if op.dims == (0,) else 1.0))
        for op, s, e in zip(planned.ops, starts, ends, strict=True)
    ]
    measured = measured_schedule(planned, times, rank=0)
    gantt = [
        {"title": "themis 4 MiB: planned", "schedule": schedule_to_dict(planned)},
        {"title": "themis 4 MiB: measured (rank 0)", "schedule": schedule_to_dict(measured)},
    ]
    return json.loads(json.dumps(dict(document, gantt=gantt)))


def test_a_traced_run_is_set_op_by_op_against_what_the_model_charges() -> None:
    document = _document(_calibration())
    assert repredict_document(document).residuals is None  # no --gantt, no trace
    exact = repredict_document(_traced(document, 1.0)).residuals
    assert exact is not None and exact.planner == "themis"
    assert sum(g.count for g in exact.groups) == 4 * 64  # every op of 64 chunks on 2 dims, in a group
    for group in exact.groups:  # the trace is the model's own replay (no jitter): every ratio 1
        assert group.ratio == pytest.approx(1.0, rel=1e-9)
    assert [load.measured_busy_s / load.modelled_busy_s for load in exact.dims] == pytest.approx([1.0, 1.0])
    slow = repredict_document(_traced(document, 1.25)).residuals
    assert slow is not None
    for group in slow.groups:
        assert group.ratio == pytest.approx(1.25 if group.dims == (0,) else 1.0, rel=1e-9)
    assert slow.dims[0].measured_busy_s / slow.dims[0].modelled_busy_s == pytest.approx(1.25)
    wrong = _traced(document, 1.0)  # a valid schedule, but not the one planned: hierarchical's
    wrong["gantt"][1]["schedule"] = dict(document["rows"][2]["schedule"], info={"measured": True})
    with pytest.raises(HipipeError, match="not a run of the planned schedule"):
        repredict_document(wrong)


def test_the_mean_op_duration_holds_the_jitter_a_base_time_leaves_out() -> None:
    # the latest of n unit-mean exponential arrivals has mean 1 + 1/2 + ... + 1/n
    assert mean_op_duration_s(0.010, 0.002, 4) == pytest.approx(
        0.010 + 0.002 * (1 + 1 / 2 + 1 / 3 + 1 / 4), rel=2e-3
    )
    assert mean_op_duration_s(0.010, 0.0, 4) == 0.010
    # a base below zero (a curve op's mean delay taken out) is floored as the replay floors it:
    # E[max(0, X - c)] for X the latest of 2 arrivals of mean m is 2m e^(-c/m) - m/2 e^(-2c/m)
    m, c = 0.002, 0.003
    exact = 2 * m * math.exp(-c / m) - m / 2 * math.exp(-2 * c / m)
    assert mean_op_duration_s(-c, m, 2) == pytest.approx(exact, rel=5e-3)


@pytest.mark.slow
@pytest.mark.one_process
def test_rows_can_be_predicted_on_another_calibration_of_the_same_testbed(tmp_path: Path) -> None:
    document = _document(_calibration())
    # A second calibration of the same testbed whose lines read 1 ms more per op (a busier host).
    other = json.loads(_document_text(_calibration_with(2e-3)))
    own = repredict_document(document)
    assert [r.predicted_s for r in repredict_document(document, calibration_of=document).rows] == [
        r.predicted_s for r in own.rows
    ]
    moved = repredict_document(document, calibration_of=other)
    assert [r.measured_s for r in moved.rows] == [r.measured_s for r in own.rows]
    for before, after in zip(own.rows, moved.rows, strict=True):
        assert after.predicted_s > before.predicted_s * 1.001  # slower lines, slower predictions
    elsewhere = dict(other, shape="4x2")
    with pytest.raises(HipipeError, match=r"the other calibration is of 4x2 at .* these rows ran on 2x4"):
        repredict_document(document, calibration_of=elsewhere)
    mine, theirs, wrong = tmp_path / "mine.json", tmp_path / "theirs.json", tmp_path / "wrong.json"
    mine.write_text(json.dumps(document))
    theirs.write_text(json.dumps({"benchmark": "testbed", "runs": [other]}))
    wrong.write_text(json.dumps(elsewhere))
    script = [sys.executable, str(REPO / "benchmarks" / "repredict.py"), str(mine), "--calibration-of"]
    done = subprocess.run([*script, str(theirs)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["calibration_of"] == str(theirs) and summary["rows"] == 3
    assert summary["rms_log_error_now"] > summary["rms_log_error_recorded"]
    failed = subprocess.run([*script, str(wrong)], capture_output=True, text=True, check=False)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stdout.strip().splitlines() == [
        f"error: {wrong}: no run of 2x4 at 100 Mbit/s/50 Mbit/s to take the calibration of"
    ]
    # Of several testbeds, those OTHER has a calibration of are predicted; the rest named as skipped.
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"benchmark": "testbed", "runs": [document, dict(document, shape="4x2")]}))
    partly = subprocess.run(
        [*script[:2], str(both), *script[3:], str(theirs)], capture_output=True, text=True, check=False
    )
    assert partly.returncode == 0, partly.stderr
    assert json.loads(partly.stdout.strip().splitlines()[-1])["rows"] == 3
    words = " ".join(partly.stdout.split())  # the console wraps long lines
    assert "skipped (no such calibration there): 4x2 at 100 Mbit/s/50 Mbit/s" in words
