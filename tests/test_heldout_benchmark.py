"""``benchmarks/heldout.py``: the wider family of networks a checker is likely to draw."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hipipe.schedule import Collective

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports its sibling optimality.py
    try:
        spec = importlib.util.spec_from_file_location("heldout_benchmark", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_wide_instances_are_reproducible_and_split_evenly():
    heldout = _module()
    first = heldout.wide_instances(25, 101)
    assert [(t.dims, m, k) for t, m, k, _ in first] == [
        (t.dims, m, k) for t, m, k, _ in heldout.wide_instances(25, 101)
    ]
    for topology, message, k, text in first:
        assert 2 <= topology.num_dims <= 3
        assert 2 <= k <= (3 if topology.num_dims == 3 else 4)
        assert message % (4 * topology.num_npus) == 0  # whole 4-byte elements in every shard
        assert message >= 1024**2
        assert text.count("GB/s") == topology.num_dims
    assert {d.size for t, _, _, _ in first for d in t.dims} - set(heldout.SIZES) == set()
    assert any(d.size in (3, 6) for t, _, _, _ in first for d in t.dims)  # not powers of two only


def test_parse_seeds():
    heldout = _module()
    assert heldout.parse_seeds("101-103") == [101, 102, 103]
    assert heldout.parse_seeds("7,201-202") == [7, 201, 202]


@pytest.mark.slow
@pytest.mark.one_process
def test_heldout_benchmark_end_to_end(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seeds", "201", "--count", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout.strip().splitlines()[-1])
    assert document["benchmark"] == "heldout" and document["seeds"] == [201]
    assert set(document["summary"]) == {c.value for c in Collective}
    for summary in document["summary"].values():
        assert summary["generated"] == 2
        assert summary["generated_exact_slower_than_hipipe"] == 0
    assert len(document["entries"]) == 6
    for entry in document["entries"]:
        assert entry["seed"] == 201 and entry["collective"] in document["summary"]
        if entry["proven"]:
            assert entry["exact_s"] <= entry["hipipe_s"] * (1 + 1e-9)
    (report,) = tmp_path.glob("heldout-*.md")
    assert "hipipe within 1% of the proven optimum" in report.read_text()


def test_chunks_and_collectives_options():
    heldout = _module()
    drawn = heldout.wide_instances(6, 101)
    at_five = heldout.at_chunks(drawn, 5)
    assert [k for _, _, k, _ in at_five] == [5] * 6
    assert [(t.dims, m, text) for t, m, _, text in at_five] == [(t.dims, m, text) for t, m, _, text in drawn]
    assert heldout.at_chunks(drawn, None) == drawn
    assert heldout.parse_collectives("reduce_scatter,all_reduce") == [
        Collective.REDUCE_SCATTER,
        Collective.ALL_REDUCE,
    ]
    with pytest.raises(Exception, match="choose from all_reduce"):
        heldout.parse_collectives("allreduce")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--chunks", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "--chunks must be 1..6" in done.stderr
