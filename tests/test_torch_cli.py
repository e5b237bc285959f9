"""``hipipe run``: with ``--nproc`` in-process through ``main(argv)``, and under a real ``torchrun``."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hipipe.cli import main
from hipipe.planners import plan
from hipipe.schedule import Schedule
from hipipe.topology_io import load_topology

SPEC = "ring:2:4GB/s:1us,ring:4:1GB/s:1us"
SIZE_BYTES = 40004
"""10001 int32 elements: not a multiple of the 8 ranks."""


def one_error_line(err: str, fragment: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("hipipe: error:") and fragment in lines[0], lines[0]


def test_run_without_torch_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    assert main(["run", SPEC, "--size", "1KiB", "--nproc", "8"]) == 2
    one_error_line(capsys.readouterr().err, "install hipipe[torch]")


@pytest.mark.torch
def test_run_refuses_mismatches_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["run", SPEC, "--size", "1KiB", "--nproc", "4"]) == 2
    one_error_line(capsys.readouterr().err, "needs 8 ranks, --nproc is 4")
    assert main(["run", SPEC, "--size", "1KiB"]) == 2
    one_error_line(capsys.readouterr().err, "torchrun")
    schedule_path = tmp_path / "schedule.json"
    schedule_path.write_text(plan(load_topology(SPEC), SIZE_BYTES, "themis").to_json())
    assert main(["run", "--schedule", str(schedule_path), "--size", "1MiB", "--nproc", "8"]) == 2
    one_error_line(capsys.readouterr().err, "is for 40004 bytes")
    assert main(["run", SPEC, "--size", "1001", "--dtype", "int32", "--nproc", "8"]) == 2
    one_error_line(capsys.readouterr().err, "not a whole number of int32 elements")


@pytest.mark.torch
@pytest.mark.slow
def test_run_nproc_8_verifies_and_reports(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    schedule = plan(load_topology(SPEC), SIZE_BYTES, "hipipe")
    schedule_path = tmp_path / "schedule.json"
    schedule_path.write_text(schedule.to_json())
    trace_path, gantt_path = tmp_path / "measured.json", tmp_path / "gantt.png"
    argv = ["run", "--schedule", str(schedule_path), "--nproc", "8", "--dtype", "int32", "--iters", "2"]
    argv += ["--trace", str(trace_path), "--gantt", str(gantt_path), "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verified"] and result["max_abs_error"] == 0
    assert result["world_size"] == 8 and result["message_bytes"] == SIZE_BYTES
    assert result["planned_s"] == pytest.approx(schedule.makespan_s)
    names = [t["name"] for t in result["timings"]]
    assert names == ["hipipe", "torch all_reduce"]
    for timing in result["timings"]:
        assert timing["busbw_gbps"] == pytest.approx(timing["algbw_gbps"] * 2 * 7 / 8)
        assert timing["algbw_gbps"] == pytest.approx(SIZE_BYTES / timing["time_s"] / 1e9)
    measured = Schedule.from_json(trace_path.read_text())
    assert measured.sequences == schedule.sequences and len(measured.ops) == len(schedule.ops)
    assert measured.makespan_s > 0 and gantt_path.stat().st_size > 0


def _torchrun(tmp_path: Path, args: list[str]) -> tuple[int, str, str]:
    """``torchrun --standalone --nproc-per-node 8 hipipe run ARGS``: exit code, stdout, stderr."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    hipipe = shutil.which("hipipe", path=str(Path(sys.executable).parent))
    if torchrun is None or hipipe is None:
        pytest.skip("torchrun or the hipipe script is not installed next to this Python")
    command = [torchrun, "--standalone", "--log-dir", str(tmp_path / "torchrun"), "--nproc-per-node", "8"]
    command += ["--no-python", hipipe, "run", *args]
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
        out, err = process.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and the ranks it started: our own session
        process.communicate()
        pytest.fail("hipipe run under torchrun did not finish in 150 s")
    return process.returncode, out, err


@pytest.mark.torch
@pytest.mark.slow
def test_run_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = [SPEC, "--size", "40004", "--dtype", "int32", "--iters", "2", "--planner", "themis"]
    returncode, out, err = _torchrun(tmp_path, [*args, "--timeout", "30"])
    assert returncode == 0, err[-2000:]
    assert "result matches torch.distributed.all_reduce" in out
    assert out.count("torch all_reduce") == 1, "only rank 0 prints"


SPEC_2X2X2 = "ring:2:1GB/s:1us,ring:2:1GB/s:1us,ring:2:1GB/s:1us"
SHARDED_BYTES = 8 * 1001 * 8
"""8 shards of 1001 int64 elements."""


@pytest.mark.torch
def test_run_collective_refuses_bad_input_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    trace_path = tmp_path / "trace.json"
    # 1000 bytes: 125 int64 elements, which 8 ranks cannot share equally.
    argv = ["run", SPEC_2X2X2, "--size", "1000", "--dtype", "int64", "--planner", "themis", "--nproc", "8"]
    for collective in ("reduce_scatter", "all_gather"):
        assert main([*argv, "--collective", collective, "--trace", str(trace_path)]) == 2
        one_error_line(capsys.readouterr().err, "do not split into 8 equal shards")
    schedule_path = tmp_path / "rs.json"
    rs = plan(load_topology(SPEC_2X2X2), SHARDED_BYTES, "themis", collective="reduce_scatter")
    schedule_path.write_text(rs.to_json())
    for asked in ("all_gather", "all_reduce"):
        argv = ["run", "--schedule", str(schedule_path), "--collective", asked, "--nproc", "8"]
        assert main([*argv, "--trace", str(trace_path)]) == 2
        one_error_line(capsys.readouterr().err, f"plans reduce_scatter, not {asked}")
    assert main(["run", SPEC_2X2X2, "--size", "1KiB", "--collective", "gather", "--nproc", "8"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert not trace_path.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["rs.json"]


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_run_collective_nproc_8_matches_torch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, collective: str
) -> None:
    pytest.importorskip("torch")
    trace_path = tmp_path / "measured.json"
    argv = ["run", SPEC_2X2X2, "--size", str(SHARDED_BYTES), "--collective", collective, "--nproc", "8"]
    argv += ["--planner", "pipelined", "--chunks", "4", "--dtype", "int64", "--iters", "1", "--json"]
    assert main([*argv, "--trace", str(trace_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["collective"] == collective
    assert result["verified"] and result["max_abs_error"] == 0
    torch_name = {"reduce_scatter": "reduce_scatter_tensor", "all_gather": "all_gather_into_tensor"}
    assert [t["name"] for t in result["timings"]] == ["hipipe", f"torch {torch_name[collective]}"]
    for timing in result["timings"]:
        assert timing["busbw_gbps"] == pytest.approx(timing["algbw_gbps"] * 7 / 8)
        assert timing["algbw_gbps"] == pytest.approx(SHARDED_BYTES / timing["time_s"] / 1e9)
    measured = Schedule.from_json(trace_path.read_text())
    assert measured.collective.value == collective and measured.num_chunks == 4
    assert len(measured.ops) == 4 * 3
    # The same schedule from a file runs without --collective (it carries its own).
    schedule_path = tmp_path / "schedule.json"
    planned = plan(load_topology(SPEC_2X2X2), SHARDED_BYTES, "hierarchical", collective=collective)
    schedule_path.write_text(planned.to_json())
    argv = ["run", "--schedule", str(schedule_path), "--nproc", "8", "--dtype", "float32", "--iters", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"result matches torch.distributed.{torch_name[collective]}" in out


@pytest.mark.torch
@pytest.mark.slow
def test_run_reduce_scatter_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = [SPEC_2X2X2, "--size", str(SHARDED_BYTES), "--collective", "reduce_scatter", "--dtype", "int64"]
    returncode, out, err = _torchrun(
        tmp_path, [*args, "--planner", "themis", "--iters", "1", "--timeout", "30"]
    )
    assert returncode == 0, err[-2000:]
    assert "result matches torch.distributed.reduce_scatter_tensor" in out
    assert out.count("torch reduce_scatter_tensor") == 1, "only rank 0 prints"
