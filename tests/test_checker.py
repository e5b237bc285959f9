"""The checker accepts real schedules and rejects broken ones with a message that says why.

Broken schedules are real ones altered with ``dataclasses.replace`` (or built by the
simulator from chunks a buggy planner could produce), so each test breaks exactly one
thing and asserts on the words the checker uses for it.
"""

import dataclasses
from pathlib import Path

import pytest

from hipipe.checker import CheckReport, check, check_or_raise
from hipipe.cli import main
from hipipe.errors import ScheduleError
from hipipe.planners import BASELINES, plan
from hipipe.schedule import Chunk, Op, Phase, Schedule
from hipipe.simulator import simulate_chunks
from hipipe.topology_io import load_topology

# dim 0: ring 2 @ 100 GB/s; dim 1: switch 4 @ 10 GB/s. N = 8, small enough to read.
TWO_DIMS = "ring:2:100GB/s:1us,switch:4:10GB/s:1us"
M = 2**24

TOPOLOGIES = (
    "rfs-3d",
    "hgx-h100-32",
    "tpu-2d",
    "ring:8:10GB/s:1us",
    "fc:4:50GB/s:100ns,switch:4:20GB/s:1us:halving_doubling,ring:3:5GB/s:0ns",
    "switch-3d-512",
)


def problems_text(report: CheckReport) -> str:
    return "\n".join(report.problems)


def replace_op(schedule: Schedule, index: int, **changes: object) -> Schedule:
    ops = list(schedule.ops)
    ops[index] = dataclasses.replace(ops[index], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(schedule, ops=tuple(ops))


def assert_rejected(report: CheckReport, *fragments: str) -> None:
    assert not report.ok
    text = problems_text(report)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"


@pytest.mark.parametrize("planner", BASELINES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_baseline_schedule_is_an_allreduce(planner: str, topology: str) -> None:
    topo = load_topology(topology)
    report = check(plan(topo, M, planner, num_chunks=8))
    assert report.problems == ()
    assert report.ok
    assert report.method == ("symbolic" if topo.num_npus <= 64 else "structural")
    assert report.summary().startswith(f"OK: {planner} schedule")


def test_symbolic_limit_is_configurable() -> None:
    schedule = plan(load_topology("tpu-2d"), M, "pipelined", num_chunks=4)
    assert check(schedule, symbolic_max_npus=8).method == "structural"
    assert check(schedule, symbolic_max_npus=32).method == "symbolic"


def test_missing_op_breaks_the_layout() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    broken = dataclasses.replace(schedule, ops=schedule.ops[:-1])
    assert_rejected(check(broken), "schedule has 3 ops, its chunks' chains need 4")


def test_op_missing_from_its_dim_sequence() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "pipelined", num_chunks=2)
    sequences = list(schedule.sequences)
    sequences[1] = tuple(i for i in sequences[1] if i != 5)
    broken = dataclasses.replace(schedule, sequences=tuple(sequences))
    assert_rejected(check(broken), "dim 1's sequence lacks chunk 1, op 5 (RS on dim 1)")


def test_sequence_out_of_start_order() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "pipelined", num_chunks=2)
    sequences = list(schedule.sequences)
    sequences[0] = tuple(reversed(sequences[0]))
    broken = dataclasses.replace(schedule, sequences=tuple(sequences))
    assert_rejected(check(broken), "dim 0's sequence runs", "but it starts earlier")


def test_allgather_before_reducescatter() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    broken = replace_op(replace_op(schedule, 0, phase=Phase.AG), 3, phase=Phase.RS)
    report = check(broken)
    assert_rejected(
        report,
        "chunk 0, op 0 (AG on dim 0) should be RS on dim 0",
        "its chain is RS 0 -> RS 1 -> AG 1 -> AG 0",
        # The symbolic run: an AG needs group members holding adjacent pieces, not the same one.
        "symbolic run: chunk 0, op 0 (AG on dim 0): the pieces of one group do not tile a larger piece",
    )
    with pytest.raises(ScheduleError, match=r"chunk 0, op 0 \(AG on dim 0\) should be RS") as caught:
        check_or_raise(broken)
    assert "\n" not in str(caught.value)


def test_chunk_that_skips_a_dimension() -> None:
    topo = load_topology(TWO_DIMS)
    broken = simulate_chunks(topo, M, [Chunk(index=0, size_bytes=float(M), order=((0,),))])
    assert_rejected(
        check(broken),
        "chunk 0's order (0) never visits dim 1",
        # Every rank ends with the sum over its own dim-0 pair only: rank 0 lacks ranks 2..7.
        "chunk 0: at the end rank 0 does not hold the full sum: [0, 1) lacks ranks 2, 3, 4, 5, 6, 7",
    )


def test_chunk_that_visits_a_dimension_twice() -> None:
    topo = load_topology(TWO_DIMS)
    order = ((0,), (0,), (1,))
    broken = simulate_chunks(topo, M, [Chunk(index=0, size_bytes=float(M), order=order)])
    assert_rejected(
        check(broken),
        "chunk 0's order (0, 0, 1) visits dim 0 2 times",
        "symbolic run: chunk 0, op 1 (RS on dim 0): ranks 0 and 1 of one group work on different pieces",
    )


def test_chunk_ops_on_the_wrong_dimension() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    broken = replace_op(schedule, 1, dims=(0,))
    assert_rejected(check(broken), "chunk 0, op 1 (RS on dim 0) should be RS on dim 1")


def test_two_ops_at_once_on_one_dimension() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "pipelined", num_chunks=2)
    first, second = schedule.ops[0], schedule.ops[4]  # RS on dim 0 of chunks 0 and 1
    assert second.start_s == pytest.approx(first.end_s)
    broken = replace_op(schedule, 4, start_s=first.start_s, end_s=first.end_s)
    report = check(broken)
    assert_rejected(
        report,
        "dim 0 runs two ops at once: chunk 0, op 0 (RS on dim 0) from 0.0 ns to",
        "and chunk 1, op 4 (RS on dim 0) from 0.0 ns to",
    )


def test_op_starting_before_its_predecessor_ends() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    first, second = schedule.ops[0], schedule.ops[1]
    early_s = first.end_s - first.duration_s / 2
    broken = replace_op(schedule, 1, start_s=early_s, end_s=early_s + second.duration_s)
    broken = dataclasses.replace(broken, ops=_shift_after(broken.ops, 2, early_s - first.end_s))
    broken = dataclasses.replace(broken, makespan_s=broken.ops[-1].end_s)
    report = check(broken)
    # op 0: 1 step x 1 us + 1/2 x 16,777,216 B / 100 GB/s = 84.89 us; op 1 now starts halfway.
    assert_rejected(
        report,
        "chunk 0, op 1 (RS on dim 1) starts at 42.44 us before its input exists (op 0 ends at 84.89 us)",
        "symbolic run: chunk 0, op 1 (RS on dim 1) starts at 42.44 us before its input exists"
        " (chunk 0, op 0 (RS on dim 0) is still running until 84.89 us)",
    )
    assert len(report.problems) == 2


def _shift_after(ops: tuple[Op, ...], first_index: int, delta_s: float) -> tuple[Op, ...]:
    return tuple(
        dataclasses.replace(op, start_s=op.start_s + delta_s, end_s=op.end_s + delta_s)
        if op.index >= first_index
        else op
        for op in ops
    )


def test_chunk_counted_twice() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "pipelined", num_chunks=2)
    copy = dataclasses.replace(schedule.chunks[1], index=2)
    # The copy's ops run after everything else, so only the byte count is wrong.
    copied_ops = tuple(
        dataclasses.replace(
            op,
            index=op.index + 4,
            chunk=2,
            start_s=op.start_s + schedule.makespan_s,
            end_s=op.end_s + schedule.makespan_s,
        )
        for op in schedule.chunk_ops(1)
    )
    sequences = tuple(
        (*seq, *(op.index for op in copied_ops if k in op.dims)) for k, seq in enumerate(schedule.sequences)
    )
    broken = dataclasses.replace(
        schedule,
        chunks=(*schedule.chunks, copy),
        ops=schedule.ops + copied_ops,
        sequences=sequences,
        makespan_s=copied_ops[-1].end_s,
    )
    report = check(broken)
    assert report.problems == (
        f"chunk sizes sum to {1.5 * M!r} bytes but the message is {M} bytes (3 chunks):"
        " every byte must be in exactly one chunk",
    )


def test_byte_reduced_twice() -> None:
    # RS 0, AG 0, RS 0, AG 0: after the first AG both ranks of a dim-0 pair hold the
    # pair's sum; reducing it again over the same pair counts each contribution twice.
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    broken = replace_op(schedule, 1, phase=Phase.AG, dims=(0,))
    broken = replace_op(broken, 2, phase=Phase.RS, dims=(0,))
    broken = dataclasses.replace(broken, sequences=((0, 1, 2, 3), ()))
    assert_rejected(
        check(broken),
        "symbolic run: chunk 0, op 2 (RS on dim 0): piece [0, 1/2) would be reduced twice:"
        " rank 1 brings the contribution of ranks 0, 1 again",
    )


def test_group_members_on_different_pieces() -> None:
    # RS 0 then RS 0 again: each pair member already holds a different half.
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    broken = replace_op(schedule, 1, dims=(0,))
    assert_rejected(
        check(broken),
        "symbolic run: chunk 0, op 1 (RS on dim 0): ranks 0 and 1 of one group work on different"
        " pieces ([0, 1/2) and [1/2, 1))",
    )


def test_op_faster_than_the_cost_model() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    last = schedule.ops[-1]
    broken = replace_op(schedule, last.index, end_s=last.start_s + last.duration_s / 2)
    broken = dataclasses.replace(broken, makespan_s=broken.ops[-1].end_s)
    assert_rejected(check(broken), "chunk 0, op 3 (AG on dim 0) lasts", "but the cost model needs at least")
    assert check(broken, check_durations=False).ok


def test_wrong_makespan_and_bad_times() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    assert_rejected(dataclasses_replace_makespan(schedule, 2 * schedule.makespan_s), "the makespan is")
    assert_rejected(check(replace_op(schedule, 2, start_s=float("nan"))), "has a non-finite time")
    op = schedule.ops[0]
    assert_rejected(
        check(replace_op(schedule, 0, start_s=op.end_s, end_s=op.start_s)), "ends at 0.0 ns, before it starts"
    )
    assert_rejected(
        check(replace_op(schedule, 0, start_s=-op.end_s)),
        "chunk 0, op 0 (RS on dim 0) starts at a negative time",
    )


def dataclasses_replace_makespan(schedule: Schedule, makespan_s: float) -> CheckReport:
    return check(dataclasses.replace(schedule, makespan_s=makespan_s))


def test_wrong_bytes_on_an_op() -> None:
    schedule = plan(load_topology(TWO_DIMS), M, "hierarchical")
    broken = replace_op(schedule, 1, input_bytes=float(M))
    assert_rejected(check(broken), f"chunk 0, op 1 (RS on dim 1) claims {float(M)!r} input bytes")


def test_flat_ring_group_op_checked_symbolically() -> None:
    schedule = plan(load_topology("rfs-3d"), M, "ring")
    assert schedule.ops[0].dims == (0, 1, 2)
    assert check(schedule).method == "symbolic"
    broken = replace_op(replace_op(schedule, 0, dims=(0, 1)), 1, dims=(0, 1))
    assert_rejected(
        check(broken, check_durations=False),
        "chunk 0, op 0 (RS on dims 0+1) should be RS on dims 0+1+2",
        "chunk 0: at the end rank 0 does not hold the full sum",
    )


def test_cli_check_accepts_and_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = plan(load_topology("tpu-2d"), M, "themis", num_chunks=4)
    good = tmp_path / "good.json"
    good.write_text(schedule.to_json())
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "OK: themis schedule, 4 chunks, 16 ops on tpu-2d: AllReduce proven (symbolic)"

    bad = tmp_path / "bad.json"
    bad.write_text(replace_op(schedule, 1, phase=Phase.AG).to_json())
    assert main(["check", str(bad)]) == 2
    captured = capsys.readouterr()
    assert "chunk 0, op 1 (AG on dim 1) should be RS on dim 1" in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("hipipe: error: themis schedule, 4 chunks, 16 ops on tpu-2d is not a valid")


def test_cli_check_unreadable_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hipipe: error: schedule is not valid JSON")
    assert "Traceback" not in err
