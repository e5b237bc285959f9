"""A floor proof's journal: answers kept on disk, a later run resuming from them.

The proofs are the small ones of ``test_exact_floor`` (rfs-3d at 256 MiB, five chunks: 21
first-dim regions, a few seconds). A journal cut short as a killed run would leave it must
give the same answer with fewer regions solved; a region settled at a floor answers every
lower floor and no higher one; a journal for another instance, or one damaged before its
last line, is refused with one line.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from hipipe import Collective, plan
from hipipe.bounds import pipeline_bound_s
from hipipe.errors import HipipeError
from hipipe.planners.exact import prove_floor
from hipipe.planners.exact.first_dims import SplitProgress, solve_by_first_dims
from hipipe.planners.exact.journal import ProofJournal
from hipipe.planners.exact.model import ExactModel
from hipipe.presets import PRESETS

MIB = 1024**2
FIVE_CHUNK_REGIONS = 21
"""Multisets of five first dims on three dims."""


def rfs_floor_s() -> float:
    """T_pipe counting six chunks at 256 MiB on rfs-3d: proven for at most five."""
    return pipeline_bound_s(PRESETS["rfs-3d"](), 256 * MIB, min_chunks=6)


def journal_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_proof_resumed_from_a_cut_journal_solves_only_the_regions_left(tmp_path: Path) -> None:
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    full = prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    assert full.proven and full.resumed == 0 and full.settled == FIVE_CHUNK_REGIONS
    lines = journal_lines(journal)
    # The question, one line per settled region, then the whole question settled.
    assert lines[0]["question"]["max_chunks"] == 5  # type: ignore[index]
    assert [line["outcome"] for line in lines[1:]] == ["settled"] * (FIVE_CHUNK_REGIONS + 1)
    assert lines[-1]["prefixes"] == []
    # A run killed after eight regions leaves the question and their eight lines.
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines[:9]))
    resumed = prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    assert resumed.proven and resumed.faster_s is None
    assert resumed.resumed == 8 and resumed.settled == FIVE_CHUNK_REGIONS
    assert resumed.nodes <= full.nodes
    # Proven now: a third call answers from the journal alone.
    again = prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    assert again.proven and again.resumed == 1 and again.nodes == 0


def test_split_regions_are_resumed_split_and_their_children_settled(tmp_path: Path) -> None:
    """Every first-dim MIP cut short (50 ms) is split; a resumed run splits the ones the
    journal names at once and reaches the same proof, counting each region once."""
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    first = prove_floor(
        topology, 256 * MIB, rfs_floor_s(), max_chunks=5, refine_after_s=0.05, journal_path=journal
    )
    assert first.proven and first.refined > 0
    lines = journal_lines(journal)
    assert sum(line.get("outcome") == "refined" for line in lines) == first.refined
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines[:-1]))  # not yet whole
    resumed = prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    assert resumed.proven and resumed.resumed == first.subproblems
    assert resumed.settled + resumed.refined == resumed.subproblems == first.subproblems


def test_a_proof_killed_mid_run_resumes_from_what_it_wrote(tmp_path: Path) -> None:
    """A real kill (SIGKILL) of a process proving the floor, once its journal holds a
    region or two: the file is whole up to its last line and the proof resumes from it."""
    journal = tmp_path / "proof.jsonl"
    script = (
        "from hipipe.planners.exact import prove_floor\n"
        "from hipipe.presets import PRESETS\n"
        f"prove_floor(PRESETS['rfs-3d'](), {256 * MIB}, {rfs_floor_s()!r}, max_chunks=5,"
        f" journal_path={str(journal)!r})\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if journal.exists() and len(journal.read_text().splitlines()) >= 3:
                break
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    written = len(journal_lines(journal)) - 1
    assert 2 <= written < FIVE_CHUNK_REGIONS  # killed mid-run, not after the proof
    resumed = prove_floor(PRESETS["rfs-3d"](), 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    assert resumed.proven and resumed.faster_s is None
    assert resumed.resumed == written and resumed.settled == FIVE_CHUNK_REGIONS


def test_a_torn_last_line_is_dropped_and_the_journal_repaired(tmp_path: Path) -> None:
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:4]) + lines[4][:7])  # killed in the middle of a write
    resumed = prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal)
    assert resumed.proven and resumed.resumed == 3
    assert all(json.loads(line) for line in journal.read_text().splitlines())


def test_a_disproof_writes_no_region_that_held_the_faster_schedule(tmp_path: Path) -> None:
    """A floor above a known schedule is false; the journal never calls the region that
    held the schedule settled, so a resumed run finds it again."""
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    known = plan(topology, 16 * MIB, "pipelined", num_chunks=5)
    floor_s = known.makespan_s * 1.01
    first = prove_floor(topology, 16 * MIB, floor_s, max_chunks=5, journal_path=journal)
    assert not first.proven and first.faster_s is not None
    assert sum(1 for _ in journal.read_text().splitlines()) - 1 == first.settled
    again = prove_floor(topology, 16 * MIB, floor_s, max_chunks=5, journal_path=journal)
    assert not again.proven and again.faster_s is not None and again.faster_s < floor_s


def test_the_whole_method_keeps_its_answer_too(tmp_path: Path) -> None:
    topology, journal = PRESETS["tpu-2d"](), tmp_path / "proof.jsonl"
    optimum = plan(topology, 16 * MIB, "exact", num_chunks=2)
    floor_s = optimum.makespan_s * (1 - 1e-3)
    first = prove_floor(topology, 16 * MIB, floor_s, max_chunks=2, journal_path=journal)
    assert first.proven and first.method == "whole" and first.resumed == 0
    again = prove_floor(topology, 16 * MIB, floor_s, max_chunks=2, journal_path=journal)
    assert again.proven and again.resumed == 1 and again.nodes == 0


def test_a_leaf_left_open_is_not_tried_again_with_the_same_limit(tmp_path: Path) -> None:
    """Leaves given 1 ms stay open and are written so; a resumed run with the same limit
    counts them open without a MIP, and one with a longer limit solves them and proves the
    floor (an open leaf held 900 s in each sitting of the libra-4d 1 GiB proof)."""
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    floor_s = rfs_floor_s()
    short = {"max_chunks": 5, "refine_after_s": 0.05, "leaf_time_limit_s": 0.001, "journal_path": journal}
    first = prove_floor(topology, 256 * MIB, floor_s, **short)  # type: ignore[arg-type]
    assert not first.proven and first.timed_out > 0
    opened = [line for line in journal_lines(journal)[1:] if line["outcome"] == "open"]
    assert len(opened) == first.timed_out
    assert all(line["limit_s"] == 0.001 and line["bound_s"] > 0 for line in opened)  # type: ignore[operator]
    again = prove_floor(topology, 256 * MIB, floor_s, **short)  # type: ignore[arg-type]
    assert not again.proven and again.timed_out == first.timed_out
    assert again.resumed == again.subproblems == first.subproblems and again.nodes == 0
    longer = prove_floor(
        topology,
        256 * MIB,
        floor_s,
        max_chunks=5,
        refine_after_s=0.05,
        leaf_time_limit_s=60,
        journal_path=journal,
    )
    assert longer.proven and longer.timed_out == 0
    assert longer.resumed == longer.subproblems - first.timed_out  # the open leaves were solved


def test_an_open_leaf_answers_higher_floors_and_no_longer_limits_only(tmp_path: Path) -> None:
    """Open at a floor after a limit: a higher floor is a harder question and a shorter
    limit less time, so both would stay open; a lower floor or a longer limit may not."""
    path, leaf = tmp_path / "proof.jsonl", ((0, 1), (1, 0))
    ProofJournal(path, {"max_chunks": 2}).record_open(leaf, 2.0, 900.0, 1.5)
    journal = ProofJournal(path, {"max_chunks": 2})  # as a later run reads it
    assert journal.open_bound_s(leaf, 2.0, 900.0) == 1.5
    assert journal.open_bound_s(leaf, 2.5, 600.0) == 1.5
    assert journal.open_bound_s(leaf, 1.9, 900.0) is None
    assert journal.open_bound_s(leaf, 2.0, 1800.0) is None
    assert journal.open_bound_s(((1, 0), (0, 1)), 2.0, 900.0) is None
    assert journal.outcome(leaf, 2.0) is None  # left open is no answer to the floor


def test_a_region_settled_at_a_floor_answers_lower_floors_only(tmp_path: Path) -> None:
    """Proven at the rfs floor, the regions answer a floor 1% lower from the journal; a
    floor 1% higher is asked afresh (the journal answers nothing there) and adds lines of
    its own, at its floor."""
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    floor_s = rfs_floor_s()
    prove_floor(topology, 256 * MIB, floor_s, max_chunks=5, journal_path=journal)
    lower = prove_floor(topology, 256 * MIB, floor_s * 0.99, max_chunks=5, journal_path=journal)
    assert lower.proven and lower.resumed == 1 and lower.nodes == 0
    written = len(journal_lines(journal))
    higher = prove_floor(topology, 256 * MIB, floor_s * 1.01, max_chunks=5, journal_path=journal)
    assert higher.resumed == 0 and higher.nodes > 0
    added = journal_lines(journal)[written:]
    assert added and all(line["floor_s"] == floor_s * 1.01 for line in added)
    assert sum(line["outcome"] == "settled" for line in added) == higher.settled + higher.proven


@pytest.mark.parametrize(
    "change",
    [{"max_chunks": 4}, {"message_bytes": 128 * MIB}],
)
def test_a_journal_for_another_instance_is_refused(tmp_path: Path, change: dict[str, object]) -> None:
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    arguments: dict[str, object] = {"message_bytes": 256 * MIB, "floor_s": rfs_floor_s(), "max_chunks": 5}
    prove_floor(topology, journal_path=journal, **arguments)  # type: ignore[arg-type]
    before = journal.read_text()
    with pytest.raises(HipipeError, match="was written for another instance") as caught:
        prove_floor(topology, journal_path=journal, **{**arguments, **change})  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    assert journal.read_text() == before  # nothing written to a journal of another instance


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "no question line"),
        ("not json\n", "does not start with a question line"),
        (
            '{"question": null}\n{"prefixes": [[0]], "outcome": "settled", "floor_s": 1.0}\n',
            "another instance",
        ),
    ],
)
def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path, text: str, fragment: str) -> None:
    journal = tmp_path / "proof.jsonl"
    journal.write_text(text)
    with pytest.raises(HipipeError, match=fragment):
        ProofJournal(journal, {"max_chunks": 1})


@pytest.mark.parametrize(
    "line",
    [
        '{"prefixes": [[0]], "floor_s": 1.0}',
        '{"prefixes": [["x"]], "outcome": "settled", "floor_s": 1.0}',
        '{"prefixes": [[0]], "outcome": "open", "floor_s": 1.0}',
        '{"prefixes": [[0]], "outcome": "open", "floor_s": 1.0, "limit_s": 9.0, "bound_s": -1.0}',
        '{"prefixes": [[0]], "outcome": "settled"}',
        '{"prefixes": [[0]], "outcome": "settled", "floor_s": -1.0}',
    ],
)
def test_a_damaged_line_before_the_last_is_refused(tmp_path: Path, line: str) -> None:
    journal = tmp_path / "proof.jsonl"
    question = {"max_chunks": 1}
    ProofJournal(journal, question).record(((0,),), "settled", 1.0)
    good = '{"prefixes": [[1]], "outcome": "settled", "floor_s": 1.0}'
    journal.write_text(journal.read_text() + line + "\n" + good + "\n")
    with pytest.raises(HipipeError, match="line 3"):
        ProofJournal(journal, question)


def test_a_journal_in_a_missing_directory_is_a_one_line_error_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(HipipeError, match="cannot start the proof journal"):
        ProofJournal(tmp_path / "missing" / "proof.jsonl", {"max_chunks": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_journal_needs_a_fixed_cutoff(tmp_path: Path) -> None:
    """The exact planner's split search lowers its cutoff as it improves: a region pruned
    below one cutoff says nothing below a higher one, so no journal is taken there."""
    model = ExactModel(PRESETS["rfs-3d"](), 16 * MIB, 5, Collective.ALL_REDUCE, time_unit_s=1e-3)
    with pytest.raises(ValueError, match="fixed cutoff"):
        solve_by_first_dims(
            model,
            {},
            incumbent=1.0,
            incumbent_first_dims=(),
            floor=0.0,
            relative_gap=0.0,
            time_limit_s=1.0,
            journal=ProofJournal(tmp_path / "proof.jsonl", {"max_chunks": 5}),
        )
    assert journal_lines(tmp_path / "proof.jsonl") == [{"question": {"max_chunks": 5}}]


def test_a_proof_reports_its_progress_region_by_region(tmp_path: Path) -> None:
    """Every region answered is reported once, the counts only grow, and at the end every
    first-dim multiset is searched and the counts are the proof's; a resumed run reports
    the regions the journal answered as such."""
    topology, journal = PRESETS["rfs-3d"](), tmp_path / "proof.jsonl"
    reports: list[SplitProgress] = []
    proof = prove_floor(
        topology,
        256 * MIB,
        rfs_floor_s(),
        max_chunks=5,
        refine_after_s=0.05,
        journal_path=journal,
        progress=reports.append,
    )
    assert proof.proven and len(reports) == proof.settled + proof.refined
    assert [r.answered for r in reports] == list(range(1, len(reports) + 1))
    assert all(r.multisets == FIVE_CHUNK_REGIONS for r in reports)
    searched = [r.multisets_searched for r in reports]
    assert searched == sorted(searched) and searched[-1] == FIVE_CHUNK_REGIONS and searched[0] < searched[-1]
    last = reports[-1]
    assert (last.settled, last.refined, last.timed_out, last.resumed) == (proof.settled, proof.refined, 0, 0)
    # Resumed from the journal without its last (whole-question) line: the same regions, all resumed.
    journal.write_text("".join(line + "\n" for line in journal.read_text().splitlines()[:-1]))
    again: list[SplitProgress] = []
    prove_floor(topology, 256 * MIB, rfs_floor_s(), max_chunks=5, journal_path=journal, progress=again.append)
    assert len(again) == len(reports) and again[-1].resumed == len(reports)


def test_the_benchmarks_progress_line_waits_its_interval(
    optimality_benchmark: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    line = optimality_benchmark.ProgressLine("rfs-3d 256 MiB floor proof (k = 5)", every_s=60.0)
    counts = {"settled": 3, "refined": 1, "timed_out": 0, "resumed": 2, "multisets": 21}
    for elapsed_s, answered in ((10.0, 4), (61.0, 5), (90.0, 6), (125.0, 7)):
        line(SplitProgress(answered=answered, multisets_searched=answered - 1, elapsed_s=elapsed_s, **counts))
    printed = capsys.readouterr().err.splitlines()
    assert printed == [
        "  rfs-3d 256 MiB floor proof (k = 5): 4 of 21 first-dim multisets searched, 5 regions"
        " answered (3 settled, 1 split, 0 at their limit, 2 from the journal) in 61 s",
        "  rfs-3d 256 MiB floor proof (k = 5): 6 of 21 first-dim multisets searched, 7 regions"
        " answered (3 settled, 1 split, 0 at their limit, 2 from the journal) in 125 s",
    ]
