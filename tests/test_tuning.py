"""``hipipe tune``: the cache (round trip, keys, corrupt files), candidates, selection, and
one real tuning on a tiny testbed (root) whose choice is checked against its own
recorded measurements, never against wall time."""

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from hipipe.cli import main
from hipipe.planners import BASELINES, plan
from hipipe.planners.hipipe import sequence_mip
from hipipe.presets import PRESETS
from hipipe.repeats import median_relative_error
from hipipe.report.tune import tuning_table
from hipipe.schedule import Collective, Schedule
from hipipe.testbed import netns
from hipipe.testbed.layout import TestbedError, nominal_topology
from hipipe.topology_io import load_topology, topology_to_yaml
from hipipe.tuning import (
    Measurement,
    TunedEntry,
    TuningError,
    TuningKey,
    load_tuned,
    read_cache,
    select_fastest,
    topology_fingerprint,
    tuning_candidates,
    write_entry,
)
from hipipe.tuning.candidates import best_chunk_counts, tuned_entry
from hipipe.tuning.testbed import TuneConfig
from testbed_host import root_skip_reason, unused_prefix

SPEC = "switch:2:5MB/s:1ms,switch:2:15MB/s:1ms"
MIB = 1 << 20


def _entry(topology_spec: str = SPEC, message_bytes: int = MIB, dtype: str = "float32") -> TunedEntry:
    topology = load_topology(topology_spec)
    schedule = plan(topology, message_bytes, "themis")
    return TunedEntry(
        key=TuningKey.of(topology, "all_reduce", message_bytes, dtype),
        chosen="themis",
        schedule=schedule,
        measurements=(
            Measurement(
                name="themis", planner="themis", num_chunks=64, predicted_s=0.3, times_s=(0.2, 0.4, 0.3)
            ),
            Measurement(name="ring", planner="ring", num_chunks=1, predicted_s=0.3, times_s=(0.5, 0.5, 0.5)),
        ),
        warmup=1,
        source="test",
        topology_name=topology.name,
    )


# --- cache ------------------------------------------------------------------------------


def test_cache_round_trip_keeps_every_field(tmp_path: Path) -> None:
    cache = tmp_path / "tuned.json"
    entry = _entry()
    write_entry(cache, entry)
    assert read_cache(cache) == {entry.key: entry}
    topology = load_topology(SPEC)
    schedule = load_tuned(cache, topology, "all_reduce", MIB, "float32")
    assert schedule == entry.schedule
    # a second key is added beside the first, the same key is replaced
    other = _entry(message_bytes=2 * MIB)
    write_entry(cache, other)
    write_entry(cache, entry)
    assert set(read_cache(cache)) == {entry.key, other.key}
    assert json.loads(cache.read_text())["format"] == "hipipe.tuning-cache"
    assert not [p for p in tmp_path.iterdir() if p.name != "tuned.json"], "no temporary file left"


def test_keys_separate_topology_collective_size_and_dtype(tmp_path: Path) -> None:
    cache = tmp_path / "tuned.json"
    write_entry(cache, _entry())
    topology = load_topology(SPEC)
    assert load_tuned(cache, topology, Collective.ALL_REDUCE, MIB, "float32") is not None
    assert load_tuned(cache, topology, Collective.ALL_REDUCE, MIB, "float16") is None
    assert load_tuned(cache, topology, Collective.ALL_REDUCE, 2 * MIB, "float32") is None
    assert load_tuned(cache, topology, Collective.REDUCE_SCATTER, MIB, "float32") is None
    faster = load_topology("switch:2:5MB/s:1ms,switch:2:16MB/s:1ms")
    assert load_tuned(cache, faster, Collective.ALL_REDUCE, MIB, "float32") is None
    assert load_tuned(tmp_path / "absent.json", topology, "all_reduce", MIB, "float32") is None


def test_fingerprint_ignores_the_name_and_survives_yaml(tmp_path: Path) -> None:
    topology = load_topology(SPEC)
    path = tmp_path / "t.yaml"
    path.write_text(topology_to_yaml(topology).replace(f"name: {topology.name}", "name: renamed"))
    again = load_topology(str(path))
    assert again.name != topology.name
    assert topology_fingerprint(again) == topology_fingerprint(topology)
    assert topology_fingerprint(
        load_topology("switch:2:5MB/s:2ms,switch:2:15MB/s:1ms")
    ) != topology_fingerprint(topology)


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"format": "something-else", "version": 1, "entries": []}',
        '{"format": "hipipe.tuning-cache", "version": 99, "entries": []}',
        '{"format": "hipipe.tuning-cache", "version": 1, "entries": [{"topology": "x"}]}',
    ],
)
def test_a_corrupt_cache_is_one_clear_error(tmp_path: Path, text: str) -> None:
    cache = tmp_path / "tuned.json"
    cache.write_text(text)
    with pytest.raises(TuningError, match="is unreadable") as info:
        load_tuned(cache, load_topology(SPEC), "all_reduce", MIB, "float32")
    assert "\n" not in str(info.value)
    with pytest.raises(TuningError):
        write_entry(cache, _entry())
    assert cache.read_text() == text, "a corrupt cache is never overwritten"


def test_cli_refuses_a_corrupt_or_missing_cache_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "tuned.json"
    cache.write_text("{not json")
    assert main(["tune", SPEC, "--size", "1MiB", "--cache", str(cache)]) == 2
    bench = ["bench", "--testbed", "2x2", "--rates", "40,120Mbit", "--size", "1MiB"]
    assert main([*bench, "--tuned", str(cache), "-o", str(tmp_path / "b")]) == 2
    assert main([*bench, "--tuned", str(tmp_path / "none.json"), "-o", str(tmp_path / "b")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 3 and all(line.startswith("hipipe: error:") for line in lines), lines
    assert "is unreadable" in lines[0] and "is unreadable" in lines[1] and "not found" in lines[2]


@pytest.mark.parametrize(
    ("flags", "rule", "message"),
    [
        (
            ["--repeats", "3", "--max-repeats", "2"],
            {"repeats": 3, "max_repeats": 2},
            "--max-repeats 2 is below --repeats 3",
        ),
        (["--repeats", "0"], {"repeats": 0}, "--repeats must be at least 1, got 0"),
        (
            ["--precision", "1.5"],
            {"precision": 1.5},
            "--precision is a fraction of the median in \\[0, 1\\), got 1.5",
        ),
    ],
)
def test_tune_refuses_a_bad_repeat_rule_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], rule: dict[str, Any], message: str
) -> None:
    cache = tmp_path / "tuned.json"
    assert main(["tune", SPEC, "--size", "1MiB", "--cache", str(cache), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and re.fullmatch(f"hipipe: error: {message}", err), err
    assert not cache.exists(), "nothing was measured, nothing written"
    with pytest.raises(TestbedError, match=message):
        TuneConfig(sizes=(2, 2), rates_bits_per_s=(40e6, 120e6), message_bytes=MIB, **rule)


def test_jobs_are_a_testbed_setting_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="tune checks for torch first")
    cache = tmp_path / "tuned.json"
    assert main(["tune", SPEC, "--size", "1MiB", "--cache", str(cache), "--jobs", "2"]) == 2
    bench = ["bench", "--testbed", "2x2", "--rates", "40,120Mbit", "--size", "1MiB", "--jobs", "0"]
    assert main([*bench, "-o", str(tmp_path / "b")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        "hipipe: error: --jobs is for the testbed: under torchrun the job is the one torchrun started",
        "hipipe: error: --jobs must be at least 1, got 0",
    ]
    assert not cache.exists() and not list(tmp_path.iterdir())


def test_the_tuning_table_counts_each_candidates_runs() -> None:
    entry = replace(
        _entry(),
        measurements=(
            replace(_entry().measurements[0], times_s=(0.2, 0.4, 0.3, 0.35, 0.25)),
            _entry().measurements[1],
        ),
    )
    console = Console(width=200, record=True)
    console.print(tuning_table(entry))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if "│" in line}
    runs = {name: line.split("│")[5].strip() for name, line in rows.items() if name in ("themis", "ring")}
    assert runs == {"themis": "5", "ring": "3"}


def test_bench_needs_an_entry_for_every_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "tuned.json"
    topology = nominal_topology((2, 2), (40e6, 120e6))
    entry = _entry()
    write_entry(
        cache,
        TunedEntry(
            key=TuningKey.of(topology, "all_reduce", MIB, "float32"),
            chosen=entry.chosen,
            schedule=plan(topology, MIB, "themis"),
            measurements=entry.measurements,
            warmup=1,
            source="test",
        ),
    )
    argv = [
        "bench",
        "--testbed",
        "2x2",
        "--rates",
        "40,120Mbit",
        "--size",
        "1MiB,2MiB",
        "--tuned",
        str(cache),
    ]
    assert main([*argv, "-o", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "has no float32 all_reduce of 2 MiB" in err and len(err.strip().splitlines()) == 1


# --- candidates and selection -------------------------------------------------------------


def test_candidates_are_hipipe_first_then_every_baseline() -> None:
    topology = load_topology(SPEC)
    candidates = tuning_candidates(topology, MIB, best_few=3)
    names = [c.name for c in candidates]
    assert names[0] == "hipipe"
    assert candidates[0].schedule == plan(topology, MIB, "hipipe")
    hipipe_names = [n for n in names if n.startswith("hipipe")]
    assert 1 <= len(hipipe_names) <= 3
    assert all(n == "hipipe" or n.removeprefix("hipipe K=").isdigit() for n in hipipe_names)
    assert set(names) - set(hipipe_names) == set(BASELINES)
    assert len(set(names)) == len(names)
    ks = best_chunk_counts(candidates[0].schedule, 10)
    assert ks and all(isinstance(k, int) for k in ks)
    scattered = tuning_candidates(topology, MIB, collective=Collective.REDUCE_SCATTER, best_few=2)
    assert scattered[0].name == "hipipe"
    assert {c.schedule.collective for c in scattered} == {Collective.REDUCE_SCATTER}


def test_selection_takes_the_smallest_median_and_the_first_on_a_tie() -> None:
    def m(name: str, *times: float) -> Measurement:
        return Measurement(name=name, planner=name, num_chunks=1, predicted_s=1.0, times_s=times)

    # mean would pick b (one outlier in a), the median picks a
    assert select_fastest([m("a", 1.0, 1.0, 9.0), m("b", 1.5, 1.5, 1.5)]).name == "a"
    assert select_fastest([m("a", 2.0), m("b", 1.0), m("c", 1.0)]).name == "b"
    with pytest.raises(TuningError):
        select_fastest([])


def test_tuned_entry_keeps_the_fastest_candidates_schedule() -> None:
    topology = load_topology(SPEC)
    candidates = tuning_candidates(topology, MIB, best_few=1)
    times = {c.name: (float(i + 1),) for i, c in enumerate(reversed(candidates))}
    entry = tuned_entry(
        TuningKey.of(topology, "all_reduce", MIB, "float32"), candidates, times, warmup=0, source="t"
    )
    assert entry.chosen == candidates[-1].name
    assert entry.schedule == candidates[-1].schedule
    assert [m.name for m in entry.measurements] == [c.name for c in candidates]


# --- the real testbed (root) ---------------------------------------------------------------


@pytest.mark.root
@pytest.mark.slow
def test_hipipe_tune_on_a_tiny_testbed_keeps_the_measured_fastest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = root_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="tuning runs the executor")
    import hipipe.tuning.testbed as tuning_testbed

    state_dir = tmp_path / "state"
    prefix = unused_prefix()
    # The CLI's own testbed, under this test's prefix and state dir so its removal can be checked.
    monkeypatch.setattr(
        tuning_testbed,
        "tune_on_testbed",
        functools.partial(
            tuning_testbed.tune_on_testbed, prefix=prefix, state_dir=state_dir, workdir=tmp_path / "tune"
        ),
    )
    cache, output = tmp_path / "tuned.json", tmp_path / "kept.json"
    argv = ["tune", "--testbed", "2x2", "--rates", "40,120Mbit", "--size", "256KiB", "--no-calibrate"]
    argv += ["--warmup", "1", "--repeats", "2", "--max-repeats", "2", "--jobs", "2", "--best-few", "2"]
    argv += ["--cache", str(cache), "-o", str(output)]
    try:
        assert main(argv) == 0, capsys.readouterr().err
    finally:
        netns.down(prefix, state_dir=state_dir)
    assert netns.existing_netns(prefix) == []
    assert "kept " in capsys.readouterr().out

    topology = nominal_topology((2, 2), (40e6, 120e6))
    entries = read_cache(cache)
    key = TuningKey.of(topology, "all_reduce", 256 * 1024, "float32")
    assert list(entries) == [key]
    entry = entries[key]
    # Planned on the nominal topology (--no-calibrate): the candidates are deterministic.
    candidates = tuning_candidates(topology, 256 * 1024, best_few=2)
    assert [m.name for m in entry.measurements] == [c.name for c in candidates]
    assert set(BASELINES) <= {m.name for m in entry.measurements}
    # --max-repeats equal to --repeats: a fixed count whatever the spread, one run in each of 2 jobs
    assert all(len(m.times_s) == 2 and min(m.times_s) > 0 for m in entry.measurements)
    # The selection, checked on the recorded measurements: the smallest median, the earliest on a tie.
    best = min(m.median_s for m in entry.measurements)
    assert entry.chosen == next(m.name for m in entry.measurements if m.median_s == best)
    assert entry.schedule == next(c.schedule for c in candidates if c.name == entry.chosen)
    assert Schedule.from_json(output.read_text()) == entry.schedule
    assert load_tuned(cache, topology, "all_reduce", 256 * 1024, "float32") == entry.schedule

    # hipipe bench --tuned runs the kept schedule as its own row
    import hipipe.cli.bench as cli_bench

    monkeypatch.setattr(
        cli_bench,
        "run_bench",
        functools.partial(
            cli_bench.run_bench, prefix=prefix, state_dir=state_dir, workdir=tmp_path / "bench"
        ),
    )
    argv = ["bench", "--testbed", "2x2", "--rates", "40,120Mbit", "--size", "256KiB", "--planners", "themis"]
    argv += ["--no-torch", "--no-calibrate", "--rate-check-s", "0", "--repeats", "1", "--jobs", "1"]
    argv += ["--extra-jobs", "0", "--tuned", str(cache)]
    try:
        assert main([*argv, "-o", str(tmp_path / "bench")]) == 0, capsys.readouterr().err
    finally:
        netns.down(prefix, state_dir=state_dir)
    assert netns.existing_netns(prefix) == []
    rows = {r["name"]: r for r in json.loads((tmp_path / "bench.json").read_text())["rows"]}
    assert set(rows) == {"themis", "hipipe-tuned"}
    assert rows["hipipe-tuned"]["median_s"] > 0 and rows["hipipe-tuned"]["predicted_s"] > 0


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_hipipe_tune_under_torchrun_writes_the_measured_fastest(tmp_path: Path, collective: str) -> None:
    pytest.importorskip("torch")
    bin_dir = str(Path(sys.executable).parent)
    torchrun, hipipe = shutil.which("torchrun", path=bin_dir), shutil.which("hipipe", path=bin_dir)
    if torchrun is None or hipipe is None:
        pytest.skip("torchrun or the hipipe script is not installed next to this Python")
    spec = "ring:2:1GB/s:1us,ring:2:1GB/s:1us"
    command = [torchrun, "--standalone", "--log-dir", str(tmp_path / "torchrun"), "--nproc-per-node", "4"]
    command += ["--no-python", hipipe, "tune", spec]
    command += ["--size", "64KiB", "--repeats", "2", "--max-repeats", "5", "--precision", "0.02"]
    command += ["--best-few", "2", "--timeout", "30"]
    command += ["--cache", "tuned.json", "-o", "kept.json", "--collective", collective]
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and its ranks: our own session
        process.communicate()
        pytest.fail("hipipe tune under torchrun did not finish in 240 s")
    assert process.returncode == 0, err[-2000:]
    assert sum(line.startswith("kept ") for line in out.splitlines()) == 1, "only rank 0 reports"
    topology = load_topology(spec)
    entry = read_cache(tmp_path / "tuned.json")[TuningKey.of(topology, collective, 64 * 1024, "float32")]
    names = [m.name for m in entry.measurements]
    assert names == [
        c.name for c in tuning_candidates(topology, 64 * 1024, collective=collective, best_few=2)
    ]
    assert entry.schedule.collective.value == collective
    assert entry.chosen == select_fastest(entry.measurements).name
    # Each candidate repeated until its median settled (2% standard error), 2 to 5 runs: one
    # that stopped early was settled then, and not one run before.
    for m in entry.measurements:
        assert 2 <= len(m.times_s) <= 5, (m.name, m.times_s)
        if len(m.times_s) < 5:
            assert median_relative_error(m.times_s) <= 0.02, (m.name, m.times_s)
        if len(m.times_s) > 2:
            assert median_relative_error(m.times_s[:-1]) > 0.02, (m.name, m.times_s)
    assert Schedule.from_json((tmp_path / "kept.json").read_text()) == entry.schedule


# --- using the cache: hipipe run --tuned -------------------------------------------------


def test_run_refuses_a_cache_without_the_entry_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "tuned.json"
    write_entry(cache, _entry())
    run = ["run", SPEC, "--nproc", "4", "--tuned", str(cache)]
    assert main([*run, "--size", "2MiB"]) == 2  # the cache knows 1 MiB only
    assert main([*run, "--size", "1MiB", "--schedule", str(cache)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 2 and all(line.startswith("hipipe: error:") for line in lines), lines
    assert "has no tuned all_reduce of 2MiB (float32)" in lines[0]
    assert "not both" in lines[1]


@pytest.mark.torch
@pytest.mark.slow
def test_run_with_tuned_runs_the_cached_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    cache = tmp_path / "tuned.json"
    entry = _entry()
    write_entry(cache, entry)
    assert main(["run", SPEC, "--size", "1MiB", "--nproc", "4", "--tuned", str(cache), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["verified"] and result["planner"] == "themis"  # hipipe run's default planner is hipipe
    assert result["num_chunks"] == entry.schedule.num_chunks


@pytest.mark.parametrize("collective", [Collective.ALL_REDUCE, Collective.REDUCE_SCATTER])
def test_hipipe_candidates_are_the_plans_plan_gives_with_fewer_mips(
    monkeypatch: pytest.MonkeyPatch, collective: Collective
) -> None:
    """The re-plans at the search's next-best Ks share the first plan's sequence MIPs
    (:class:`hipipe.planners.hipipe.HipipePlans`): the same schedules as planning each alone."""
    topology = PRESETS["tpu-2d"]()
    message = 16 * MIB
    solve = sequence_mip._solve
    solves: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        solves.append(1)
        return solve(*args, **kwargs)

    monkeypatch.setattr(sequence_mip, "_solve", counted)
    # by name, as the CLI and the torchrun tuner pass it
    candidates = tuning_candidates(topology, message, collective=collective.value, best_few=3, baselines=())
    shared = len(solves)
    solves.clear()
    alone = [plan(topology, message, "hipipe", collective=collective)] + [
        plan(
            topology,
            message,
            "hipipe",
            num_chunks=int(c.name.removeprefix("hipipe K=")),
            collective=collective,
        )
        for c in candidates[1:]
    ]
    assert len(candidates) == 3 and candidates[1].name.startswith("hipipe K=")
    assert [c.schedule for c in candidates] == alone
    assert 0 < shared < len(solves)
