"""The CLI in-process: ``main(argv)`` returns the exit code; errors are one clean line."""

import json
from pathlib import Path

import pytest

from hipipe.cli import main
from hipipe.schedule import Schedule

BASELINE_PLANNERS = "ring,hierarchical,pipelined,themis"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clean_error(code: int, err: str, fragment: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("hipipe: error:")
    assert fragment in lines[0]
    assert "Traceback" not in err


def test_topologies_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "topologies")
    assert code == 0
    for name in ("rfs-3d", "hgx-h100-32", "switch-3d-512", "libra-3d", "libra-4d", "tpu-2d"):
        assert name in out
    code, out, _ = run_cli(capsys, "topologies", "--json")
    assert json.loads(out)[0]["name"] == "rfs-3d"


def test_compare_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "compare", "tpu-2d", "--sizes", "1MiB,64MiB", "--planners", BASELINE_PLANNERS, "--json"
    )
    assert code == 0
    document = json.loads(out)
    assert document["topology"]["label"] == "tpu-2d"
    results = document["results"]
    assert len(results) == 2 * 4
    for row in results:
        assert set(row) >= {"planner", "size_bytes", "time_s", "utilization", "num_chunks", "plan_time_s"}
        assert 0 < row["utilization"] <= 1
    bounds = {b["size_bytes"]: b for b in document["bounds"]}
    assert bounds[2**26]["order_mix_bound_s"] >= bounds[2**26]["lower_bound_s"] * (1 - 1e-9)


def test_compare_table_on_the_default_network(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "compare", "--sizes", "16MiB", "--planners", BASELINE_PLANNERS)
    assert code == 0
    assert "rfs-3d" in out and "themis" in out and "T_mix" in out


def test_plan_writes_schedule_and_gantt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule_path, gantt_path = tmp_path / "s.json", tmp_path / "g.png"
    code, out, _ = run_cli(
        capsys,
        "plan",
        "rfs-3d",
        "--size",
        "16MiB",
        "--planner",
        "themis",
        "--chunks",
        "8",
        "--json",
        str(schedule_path),
        "--gantt",
        str(gantt_path),
        "--explain",
    )
    assert code == 0
    schedule = Schedule.from_json(schedule_path.read_text())
    assert schedule.planner == "themis" and schedule.num_chunks == 8
    assert gantt_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "utilization" in out

    code, out, _ = run_cli(capsys, "simulate", str(schedule_path), "--policy", "fixed")
    assert code == 0
    assert "+0.00e+00 relative" in out


def test_plan_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "plan", "tpu-2d", "--size", "1MiB", "--planner", "hierarchical", "--json", "-"
    )
    assert code == 0
    assert Schedule.from_json(out).message_bytes == 2**20


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("compare", "no-such-net", "--planners", "ring"), "unknown topology"),
        (("compare", "tpu-2d", "--sizes", "0", "--planners", "ring"), "positive"),
        (("compare", "tpu-2d", "--sizes=-4MiB", "--planners", "ring"), "positive"),
        (("compare", "ring:1:10GB/s:1us", "--planners", "ring"), "at least 2 NPUs"),
        (("compare", "ring:4:-10GB/s:1us", "--planners", "ring"), "bandwidth must be positive"),
        (("compare", "ring:4:10GB/s", "--planners", "ring"), "kind:size:bandwidth:latency"),
        (("compare", "tpu-2d", "--planners", "magic"), "unknown planner"),
        (("compare", "/no/such/file.yaml"), "cannot read topology file"),
        (
            ("plan", "tpu-2d", "--size", "1MiB", "--planner", "ring", "--gantt", "/no/such/dir/g.png"),
            "does not exist",
        ),
        (("simulate", "/no/such/schedule.json"), "No such file"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert_clean_error(code, err, fragment)


def test_malformed_yaml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "net.yaml"
    path.write_text("dims: [ {kind: ring, size: 4\n")
    code, _, err = run_cli(capsys, "compare", str(path), "--planners", "ring")
    assert_clean_error(code, err, "not valid YAML")


def test_failed_plan_leaves_no_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule_path, gantt_path = tmp_path / "s.json", tmp_path / "g.png"
    code, _, err = run_cli(
        capsys,
        "plan",
        "tpu-2d",
        "--size",
        "1MiB",
        "--planner",
        "nope",
        "--json",
        str(schedule_path),
        "--gantt",
        str(gantt_path),
    )
    assert_clean_error(code, err, "unknown planner")
    assert list(tmp_path.iterdir()) == []


def test_schedule_json_that_is_not_a_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"format": "something-else"}')
    code, _, err = run_cli(capsys, "simulate", str(path))
    assert_clean_error(code, err, "not a hipipe schedule")
    path.write_text("{not json")
    code, _, err = run_cli(capsys, "simulate", str(path))
    assert_clean_error(code, err, "not valid JSON")


def test_output_files_get_the_usual_permissions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    umask = os.umask(0o022)
    try:
        path = tmp_path / "s.json"
        code, _, _ = run_cli(
            capsys, "plan", "tpu-2d", "--size", "1MiB", "--planner", "ring", "--json", str(path)
        )
        assert code == 0
        assert path.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(umask)
