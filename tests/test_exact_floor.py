"""Proven floors: the exact MIPs asked whether any schedule with at most K chunks beats a time.

Both answers are checked against schedules: just below a proven optimum the floor is
proven; just above it, the MIPs find a schedule below the floor, and the simulator's
re-timing agrees. No timing assertions (``benchmarks/optimality.py`` measures them).
"""

import functools
import json
import math
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from hipipe import Collective, Dimension, Topology, plan
from hipipe.bounds import pipeline_bound_s
from hipipe.errors import HipipeError
from hipipe.overheads import Overheads
from hipipe.planners.exact import MAX_FLOOR_CHUNKS, plan_exact, prove_floor
from hipipe.presets import PRESETS

MIB = 1024**2


def two_rings() -> Topology:
    """Ring 2 @ 1 GB/s and ring 4 @ 2 GB/s, 1 us per link."""
    return Topology(dims=(Dimension.make("ring", 2, 1, 1000), Dimension.make("ring", 4, 2, 1000)))


@pytest.mark.parametrize(
    ("topology", "message", "num_chunks", "collective"),
    [
        (two_rings(), 4 * MIB, 3, Collective.ALL_REDUCE),
        (PRESETS["tpu-2d"](), 16 * MIB, 2, Collective.REDUCE_SCATTER),
        (PRESETS["rfs-3d"](), 64 * MIB, 2, Collective.ALL_REDUCE),
    ],
)
def test_a_floor_just_below_the_proven_optimum_holds_and_just_above_it_falls(
    topology: Topology, message: int, num_chunks: int, collective: Collective
) -> None:
    optimum = plan_exact(topology, message, num_chunks=num_chunks, collective=collective)
    assert optimum.info["proven_optimal"]
    below = prove_floor(
        topology, message, optimum.makespan_s * (1 - 1e-3), max_chunks=num_chunks, collective=collective
    )
    assert below.proven and below.faster_s is None and below.method == "whole"
    assert below.proven_floor_s is not None and below.proven_floor_s < optimum.makespan_s
    assert below.settled == below.subproblems == 1
    above = prove_floor(
        topology, message, optimum.makespan_s * (1 + 1e-3), max_chunks=num_chunks, collective=collective
    )
    assert not above.proven and above.proven_floor_s is None
    # The schedule it found is below the floor asked about and no faster than the optimum.
    assert above.faster_s is not None
    assert optimum.makespan_s * (1 - 1e-6) <= above.faster_s < above.floor_s


def test_first_dims_prove_a_five_chunk_floor_on_rfs_3d_that_the_optimum_leaves_open() -> None:
    """rfs-3d at 256 MiB (AllReduce): no schedule with at most 5 chunks is below T_pipe
    counting 6 chunks, so that T_pipe is a floor for every K; every first-dim MIP settles."""
    topology = PRESETS["rfs-3d"]()
    floor_s = pipeline_bound_s(topology, 256 * MIB, min_chunks=6)
    proof = prove_floor(topology, 256 * MIB, floor_s, max_chunks=5, time_limit_s=300)
    assert proof.method == "first-dims"
    assert proof.proven and proof.faster_s is None
    assert proof.settled == proof.subproblems == math.comb(5 + 3 - 1, 3 - 1)
    # The floor is below every schedule the planners make there, whatever their K.
    for planner, k in (("hipipe", None), ("pipelined", 5), ("pipelined", 32), ("themis", None)):
        assert plan(topology, 256 * MIB, planner, num_chunks=k).makespan_s >= floor_s


def test_first_dims_split_further_by_the_next_dim_prove_the_same_floor() -> None:
    """The rfs-3d proof above with every first-dim MIP cut short (50 ms): the ones left open
    are split by their chunks' second dims (full orders on 3 dims) and the floor is still
    proven; a region counts once, as settled or as split."""
    topology = PRESETS["rfs-3d"]()
    floor_s = pipeline_bound_s(topology, 256 * MIB, min_chunks=6)
    proof = prove_floor(topology, 256 * MIB, floor_s, max_chunks=5, time_limit_s=300, refine_after_s=0.05)
    assert proof.proven and proof.faster_s is None
    assert proof.refined > 0 and proof.settled + proof.refined == proof.subproblems
    assert proof.subproblems > math.comb(5 + 3 - 1, 3 - 1)


def test_first_dims_find_a_schedule_below_a_floor_above_a_known_one_and_stop() -> None:
    """A floor 1% above the pipelined baseline's 5-chunk plan (rfs-3d at 16 MiB) is false;
    the first-dim MIPs find a schedule below it, re-timed below it, and stop there."""
    topology = PRESETS["rfs-3d"]()
    known = plan(topology, 16 * MIB, "pipelined", num_chunks=5)
    proof = prove_floor(topology, 16 * MIB, known.makespan_s * 1.01, max_chunks=5, time_limit_s=120)
    assert proof.method == "first-dims" and not proof.proven
    assert proof.faster_s is not None and proof.faster_s < proof.floor_s
    assert proof.settled < proof.subproblems  # it stopped at the first schedule found
    # Split further, the same: a schedule below the floor, found in a second-dim MIP or before.
    refined = prove_floor(
        topology, 16 * MIB, known.makespan_s * 1.01, max_chunks=5, time_limit_s=120, refine_after_s=0.05
    )
    assert not refined.proven and refined.faster_s is not None and refined.faster_s < refined.floor_s


def test_two_worker_processes_prove_and_disprove_as_one_does() -> None:
    """The rfs-3d proof and disproof above with two regions solved at once: the same
    answers, the same regions settled (the answers do not depend on the workers)."""
    topology = PRESETS["rfs-3d"]()
    floor_s = pipeline_bound_s(topology, 256 * MIB, min_chunks=6)
    proof = prove_floor(topology, 256 * MIB, floor_s, max_chunks=5, time_limit_s=300, jobs=2)
    assert proof.proven and proof.faster_s is None
    assert proof.settled == proof.subproblems == math.comb(5 + 3 - 1, 3 - 1)
    known = plan(topology, 16 * MIB, "pipelined", num_chunks=5)
    disproof = prove_floor(
        topology,
        16 * MIB,
        known.makespan_s * 1.01,
        max_chunks=5,
        time_limit_s=120,
        jobs=2,
        refine_after_s=0.05,
    )
    assert not disproof.proven and disproof.faster_s is not None and disproof.faster_s < disproof.floor_s


def test_a_leaf_time_limit_leaves_the_proof_open_and_the_search_goes_on() -> None:
    """Fixed-order regions given a microsecond each time out (no MIP settles that fast
    unless presolve prunes it); the search still reaches every region, counts each once
    (settled, split or timed out) and does not call the floor proven."""
    topology = PRESETS["rfs-3d"]()
    floor_s = pipeline_bound_s(topology, 256 * MIB, min_chunks=6)
    proof = prove_floor(
        topology,
        256 * MIB,
        floor_s,
        max_chunks=5,
        time_limit_s=300,
        refine_after_s=1e-6,
        leaf_time_limit_s=1e-6,
    )
    assert proof.refined > 0 and proof.timed_out > 0
    assert proof.settled + proof.refined + proof.timed_out == proof.subproblems
    assert not proof.proven and proof.proven_floor_s is None and proof.faster_s is None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"floor_s": 0.0}, "floor to prove must be a positive number"),
        ({"floor_s": math.nan}, "floor to prove must be a positive number"),
        ({"max_chunks": MAX_FLOOR_CHUNKS + 1}, f"handles 1..{MAX_FLOOR_CHUNKS} chunks"),
        ({"method": "split"}, "method is one of auto, whole, first-dims"),
        ({"refine_after_s": 0.0}, "refine_after_s must be a positive number of seconds or None"),
        ({"leaf_time_limit_s": math.inf}, "leaf_time_limit_s must be a positive number of seconds or None"),
        ({"jobs": 0}, "jobs must be a whole number of processes, 1 or more"),
        ({"jobs": 1.5}, "jobs must be a whole number of processes, 1 or more"),
        ({"time_limit_s": -1.0}, "time limit must be a positive number"),
    ],
)
def test_floor_errors_are_one_line(kwargs: dict[str, object], fragment: str) -> None:
    arguments: dict[str, object] = {"floor_s": 1e-3, "max_chunks": 2, **kwargs}
    floor_s = arguments.pop("floor_s")
    with pytest.raises(HipipeError, match=fragment) as raised:
        prove_floor(two_rings(), MIB, floor_s, **arguments)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_a_floor_is_refused_on_a_topology_with_calibrated_overheads() -> None:
    calibrated = replace(two_rings(), overheads=Overheads(handoff_s=1e-5))
    with pytest.raises(HipipeError, match="calibrated overheads"):
        prove_floor(calibrated, MIB, 1e-3, max_chunks=2)


@pytest.mark.slow
@pytest.mark.one_process
def test_the_optimality_benchmark_meets_the_goal_on_rfs_3d_256_mib_with_a_proven_floor(
    optimality_benchmark: ModuleType,
) -> None:
    """The cell missed the goal with K <= 4 (hipipe 1.874 ms, K = 13; floor 1.777 ms, +5.4%);
    the floor proof at k = 5 makes T_pipe counting 6 chunks a floor for every K."""
    benchmark = optimality_benchmark
    topology = PRESETS["rfs-3d"]()
    cell = benchmark.run_cell("rfs-3d", 256 * MIB, 60.0, 40.0, Collective.ALL_REDUCE)
    k4_floor_s = min(cell["per_k"][4]["dual_bound_s"], pipeline_bound_s(topology, 256 * MIB, min_chunks=5))
    assert cell["hipipe_s"] > k4_floor_s * 1.05  # missed with K <= 4 alone
    proof = cell["floor_proof"]
    assert proof["max_chunks"] == 5 and proof["proven"]
    # The floor the goal needs (hipipe less 5%) is the lower one here: 1.7848 ms vs 1.7861 ms.
    assert proof["asked"] == "goal" and proof["floor_s"] == pytest.approx(cell["hipipe_s"] / 1.05, rel=2e-5)
    assert proof["many_s"] == pytest.approx(pipeline_bound_s(topology, 256 * MIB, min_chunks=6), rel=1e-12)
    assert cell["exact_backed_k"] == 5
    assert cell["exact_backed_bound_s"] == pytest.approx(proof["floor_s"], rel=1e-5)
    assert cell["bound_goal"] == "within 5% of the exact-backed bound (K <= 5)"
    assert cell["deeper"] == {}  # met before the deeper exact runs
    schedules_s = [cell["hipipe_s"]] + [
        e[key] for e in cell["per_k"].values() for key in ("hipipe_s", "exact_s")
    ]
    assert min(schedules_s) >= cell["exact_backed_bound_s"]


def test_the_optimality_benchmark_proves_the_floor_before_running_exact_past_k_4(
    optimality_benchmark: ModuleType,
) -> None:
    """hgx-h100-32 at 256 MiB (ReduceScatter) misses the goal with K <= 4; the floor proof
    at k = 5 settles it, so the exact planner never runs at K = 5 or 6 there."""
    benchmark = optimality_benchmark
    topology = PRESETS["hgx-h100-32"]()
    collective = Collective.REDUCE_SCATTER
    cell = benchmark.run_cell("hgx-h100-32", 256 * MIB, 60.0, 40.0, collective)
    proof = cell["floor_proof"]
    assert proof["max_chunks"] == 5 and proof["proven"] and proof["method"] == "whole"
    many_s = pipeline_bound_s(topology, 256 * MIB, collective, min_chunks=6)
    assert proof["many_s"] == pytest.approx(many_s, rel=1e-12)
    assert proof["floor_s"] == pytest.approx(min(many_s, cell["hipipe_s"] / 1.05 * (1 + 1e-5)), rel=1e-12)
    assert cell["deeper"] == {}
    assert (
        cell["exact_backed_k"] == 5 and cell["bound_goal"] == "within 5% of the exact-backed bound (K <= 5)"
    )
    assert cell["hipipe_s"] >= cell["exact_backed_bound_s"] and cell["hipipe_vs_exact_backed_bound"] <= 0.05


def test_the_optimality_benchmark_asks_the_floor_the_goal_needs(optimality_benchmark: ModuleType) -> None:
    """rfs-3d at 16 MiB: hipipe's plan (5 chunks) less the 5% goal is below T_pipe counting 6
    chunks (0.1755 ms, above hipipe itself), so the proof asks that lower floor, at k = 5:
    "does any schedule with at most 5 chunks beat hipipe by more than 5%?"."""
    benchmark = optimality_benchmark
    topology = PRESETS["rfs-3d"]()
    hipipe = plan(topology, 16 * MIB, "hipipe")
    many_s = pipeline_bound_s(topology, 16 * MIB, min_chunks=6)
    assert hipipe.num_chunks == 5 and hipipe.makespan_s < many_s
    proof = benchmark._prove(topology, 16 * MIB, Collective.ALL_REDUCE, hipipe, 1.0, question="floor")
    assert proof is not None and proof["max_chunks"] == 5 and proof["asked"] == "goal"
    assert proof["floor_s"] == pytest.approx(hipipe.makespan_s / 1.05 * (1 + 1e-5), rel=1e-12)
    assert proof["floor_s"] < hipipe.makespan_s and proof["many_s"] == pytest.approx(many_s, rel=1e-12)
    assert proof["time_limit_s"] == 1.0 and proof["faster_s"] is None


def test_the_optimality_benchmark_runs_the_cells_asked_for(
    optimality_benchmark: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--preset`` and ``--size`` pick cells (how one open cell is re-run with a long
    floor proof); a size that does not parse, or either beside ``--quick``, is refused."""
    argv = ["--preset", "tpu-2d", "--size", "16MiB", "--generated", "0", "--floor-jobs", "2"]
    assert optimality_benchmark.main(argv) == 0
    document = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(c["preset"], c["message_bytes"]) for c in document["cells"]] == [("tpu-2d", 16 * MIB)]
    for bad in (
        ["--size", "12XB"],
        ["--quick", "--preset", "tpu-2d"],
        ["--floor-jobs", "0"],
        ["--optimum-time-limit", "-1"],
        ["--floor-time-limit", "nan"],
    ):
        with pytest.raises(SystemExit) as raised:
            optimality_benchmark.main(bad)
        assert raised.value.code == 2


def _missed_cell(own_k: int) -> dict[str, object]:
    """A cell as ``run_cell`` keeps it, 12% above its best bound, with no exact run at ``own_k``."""
    return {
        "hipipe_s": 1.12e-3,
        "hipipe_num_chunks": own_k,
        "hipipe_vs_bound": 0.12,
        "per_k": {},
        "deeper": {},
    }


@pytest.mark.parametrize(
    ("proof", "goal"),
    [
        ({"proven": True, "max_chunks": 5}, "proven optimal at K=5"),
        ({"proven": False, "max_chunks": 5}, "missed"),
        ({"proven": True, "max_chunks": 6}, "missed"),  # a proof about another K says nothing
        (None, "missed"),
    ],
)
def test_the_optimum_proof_meets_the_goal_only_at_hipipes_own_k(
    optimality_benchmark: ModuleType, proof: dict[str, object] | None, goal: str
) -> None:
    cell = {**_missed_cell(5), "optimum_proof": proof}
    optimality_benchmark._judge(cell, 1e-3, {4: 1.01e-3})
    assert cell["bound_goal"] == goal
    assert cell["exact_backed_bound_s"] == 1.01e-3 and cell["exact_backed_k"] == 4


def test_the_optimum_proof_proves_hipipe_optimal_at_its_k(optimality_benchmark: ModuleType) -> None:
    """hgx-h100-32 at 16 MiB: hipipe plans 2 chunks (0.1378 ms), which the exact planner
    proves optimal at K = 2; asked about hipipe's makespan less 1e-6, the MIPs prune every
    schedule with at most 2 chunks below it."""
    topology = PRESETS["hgx-h100-32"]()
    hipipe = plan(topology, 16 * MIB, "hipipe")
    assert hipipe.num_chunks == 2
    exact = plan_exact(topology, 16 * MIB, num_chunks=2)
    assert exact.info["proven_optimal"] and exact.makespan_s >= hipipe.makespan_s * (1 - 1e-6)
    proof = optimality_benchmark._prove(
        topology, 16 * MIB, Collective.ALL_REDUCE, hipipe, 60.0, question="optimum"
    )
    assert proof is not None and proof["proven"] and proof["faster_s"] is None
    assert proof["asked"] == "hipipe" and proof["max_chunks"] == 2
    assert proof["floor_s"] == pytest.approx(hipipe.makespan_s * (1 - 1e-6), rel=1e-12)
    assert proof["proven_floor_s"] < hipipe.makespan_s
    cell = {**_missed_cell(2), "optimum_proof": proof}
    optimality_benchmark._judge(cell, 1e-3, {})
    assert cell["bound_goal"] == "proven optimal at K=2"


def test_the_optimum_proof_finds_a_schedule_faster_than_hipipe_at_its_k(
    optimality_benchmark: ModuleType,
) -> None:
    """rfs-3d at 16 MiB: hipipe plans 5 chunks (0.1597 ms) and the exact planner proves a
    5-chunk optimum 0.06% faster (0.1596 ms); the optimum proof finds such a schedule, so the
    cell is not called proven."""
    topology = PRESETS["rfs-3d"]()
    hipipe = plan(topology, 16 * MIB, "hipipe")
    assert hipipe.num_chunks == 5
    proof = optimality_benchmark._prove(
        topology, 16 * MIB, Collective.ALL_REDUCE, hipipe, 300.0, jobs=2, question="optimum"
    )
    assert proof is not None and not proof["proven"] and proof["max_chunks"] == 5
    assert proof["faster_s"] is not None and proof["faster_s"] < hipipe.makespan_s * (1 - 1e-6)
    cell = {**_missed_cell(5), "optimum_proof": proof}
    optimality_benchmark._judge(cell, 1e-3, {})
    assert cell["bound_goal"] == "missed"


def test_the_optimum_proof_is_skipped_past_the_floor_proofs_chunks(optimality_benchmark: ModuleType) -> None:
    """hipipe's K beyond ``MAX_FLOOR_CHUNKS`` is out of the floor MIPs' reach: no proof is tried
    (rfs-3d at 1 GiB: hipipe plans 23 chunks)."""
    topology = PRESETS["rfs-3d"]()
    hipipe = plan(topology, 1024 * MIB, "hipipe")
    assert hipipe.num_chunks > MAX_FLOOR_CHUNKS
    assert (
        optimality_benchmark._prove(
            topology, 1024 * MIB, Collective.ALL_REDUCE, hipipe, 1.0, question="optimum"
        )
        is None
    )


def test_the_optimality_benchmarks_proofs_resume_from_their_journals(
    optimality_benchmark: ModuleType, tmp_path: Path
) -> None:
    """With a journal directory, a proof keeps its answers in a file named by the cell and
    the most chunks; asked again, it is answered from there and the report says so. A lower
    floor of the same cell reads the same file; another k gets a file of its own."""
    topology = PRESETS["hgx-h100-32"]()
    hipipe = plan(topology, 16 * MIB, "hipipe")
    prove = functools.partial(
        optimality_benchmark._prove,
        topology,
        16 * MIB,
        Collective.ALL_REDUCE,
        hipipe,
        60.0,
        question="optimum",
        journal_dir=tmp_path,
    )
    first = prove()
    assert first is not None and first["proven"] and first["resumed"] == 0
    journal = Path(first["journal"])
    assert journal.parent == tmp_path and journal.name.startswith("hgx-h100-32-all_reduce-16MiB-k2-")
    again = prove()
    assert again is not None and again["proven"] and again["resumed"] == 1 and again["nodes"] == 0
    assert again["journal"] == first["journal"]
    cell = {"preset": "hgx-h100-32", "message_bytes": 16 * MIB, "hipipe_s": hipipe.makespan_s}
    text = optimality_benchmark.floor_proof_text(
        [{**cell, "hipipe_num_chunks": 2, "optimum_proof": again}], "optimum_proof"
    )
    assert f"1 of the regions answered by earlier runs, journal {journal.name}" in text[0]
    # A lower floor of the same cell and k (the floor question's kind) reads the same file.
    lower = prove_floor(topology, 16 * MIB, first["floor_s"] * 0.99, max_chunks=2, journal_path=journal)
    assert lower.proven and lower.resumed == 1
    other = optimality_benchmark.journal_path(tmp_path, topology, 16 * MIB, 3, Collective.ALL_REDUCE)
    assert other != journal and not other.exists()


def test_the_optimality_benchmark_refuses_a_journal_directory_it_cannot_make(
    optimality_benchmark: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as caught:
        optimality_benchmark.main(["--proof-journals", str(blocker / "journals"), "--quick"])
    assert caught.value.code == 2
    assert "--proof-journals: cannot use" in capsys.readouterr().err
