"""Recorded bench runs predicted again (``hipipe.testbed.repredict``, ``benchmarks/repredict.py``).

Pure and torch-free: a bench document is built from a synthetic calibration whose overhead
run was slower than its model (so the per-op cost is fitted), written as ``hipipe bench
--json`` writes it, and predicted again.
"""

import functools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hipipe.errors import HipipeError
from hipipe.planners import plan
from hipipe.predict import predicted_s
from hipipe.report.bench import result_to_dict
from hipipe.testbed.fit import (
    Calibration,
    OverheadRun,
    Sample,
    calibration_from_samples,
    fit_all,
    overhead_schedule,
    retime,
)
from hipipe.testbed.repredict import repredict_document, rms_log_error
from hipipe.testbed.results import BenchConfig, BenchResult, BenchRow

MIB = 1 << 20
SIZES = (2, 4)
RATES = (100e6, 50e6)
REPO = Path(__file__).resolve().parent.parent


@functools.cache
def _calibration() -> Calibration:
    """Lines of 1 ms + the wire; an overhead run 30% slower than they predict (no traces,
    no host term): the per-op cost is what the bisection gives it."""
    samples = []
    for dim, n in enumerate(SIZES):
        bytes_per_s = RATES[dim] / 8
        for full_bytes in (64 << 10, 1 << 20, 4 << 20):
            time_s = 1e-3 + (n - 1) / n * full_bytes / bytes_per_s
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
    log.write_text("card lines\n" + json.dumps({"benchmark": "testbed", "runs": [document, document]}) + "\n")
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
