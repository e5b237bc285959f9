"""ReduceScatter and AllGather: formulas, every planner, the checker's proof, the CLI.

Numbers are worked by hand in the comments; the property test runs the planners on
generated networks as ``test_hipipe_planner.py`` does for AllReduce.
"""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipipe.bounds import chunked_bound_s, latency_aware_bound_s, order_mix, order_mix_bound_s
from hipipe.checker import CheckReport, check
from hipipe.cli import main
from hipipe.cost import busbw_bytes_per_s, lower_bound_s, op_time_s, utilization, volume_per_byte
from hipipe.errors import HipipeError
from hipipe.planners import BASELINES, PLANNERS, plan
from hipipe.planners.hipipe.families import families
from hipipe.planners.hipipe.sequencing import Deadlock, longest_path_s
from hipipe.planners.hipipe.structure import op_table
from hipipe.schedule import Chunk, Collective, Phase, Schedule
from hipipe.simulator import simulate, simulate_chunks
from hipipe.topology import Dimension, Topology
from hipipe.topology_io import load_topology

RS = Collective.REDUCE_SCATTER
AG = Collective.ALL_GATHER
HALVES = (RS, AG)
MIB = 2**20

# N = 4: two 2-NPU rings, small enough to follow every shard by hand.
SQUARE = "ring:2:1GB/s:1us,ring:2:1GB/s:1us"


def problems_text(report: CheckReport) -> str:
    return "\n".join(report.problems)


# -- formulas ---------------------------------------------------------------------------


def test_lower_bound_and_mix_bound_of_rs_and_ag_are_half_of_allreduce() -> None:
    topology = load_topology("tpu-2d")  # ring 4 @ 80 GB/s, ring 8 @ 80 GB/s: N = 32
    message = 2**30
    # T* = (N-1)/N * M / sum B = 31/32 * 2^30 / 160e9 for RS and AG; AllReduce moves twice.
    expected = 31 / 32 * 2**30 / 160e9
    for kind in HALVES:
        assert lower_bound_s(topology, message, kind) == pytest.approx(expected, rel=1e-12)
        assert order_mix_bound_s(topology, message, kind) == pytest.approx(
            order_mix_bound_s(topology, message) / 2, rel=1e-12
        )
        assert utilization(topology, message, 2 * expected, kind) == pytest.approx(0.5, rel=1e-12)
    assert lower_bound_s(topology, message) == pytest.approx(2 * expected, rel=1e-12)


def test_volume_per_byte_of_rs_sums_to_n_minus_one_over_n() -> None:
    topology = load_topology("tpu-2d")
    # Order (1, 0): dim 1 (n=8) first carries 7/8, dim 0 (n=4) then carries 3/4 of 1/8.
    assert volume_per_byte(topology, (1, 0), RS) == pytest.approx([3 / 4 / 8, 7 / 8])
    assert sum(volume_per_byte(topology, (0, 1), AG)) == pytest.approx(31 / 32)


def test_busbw_follows_nccl_tests_for_every_collective() -> None:
    # 1 GB in 1 s on 4 ranks: algbw 1 GB/s; busbw x 2*3/4 for AllReduce, x 3/4 for RS and AG.
    assert busbw_bytes_per_s(1e9, 1.0, 4) == pytest.approx(1.5e9)
    for kind in HALVES:
        assert busbw_bytes_per_s(1e9, 1.0, 4, kind) == pytest.approx(0.75e9)


def test_chunked_bound_of_one_chunk_on_one_ring_is_one_op() -> None:
    topology = load_topology("ring:4:1GB/s:1us")
    # One RS: 3 steps x 1 us + 3/4 x 4e6 B / 1e9 B/s = 3 us + 3 ms (the AllReduce pays both halves).
    for kind in HALVES:
        assert chunked_bound_s(topology, 4e6, 1, collective=kind) == pytest.approx(3e-6 + 3e-3, rel=1e-9)
        assert latency_aware_bound_s(topology, 4e6, kind) == pytest.approx(3e-6 + 3e-3, rel=1e-9)
    assert chunked_bound_s(topology, 4e6, 1) == pytest.approx(2 * (3e-6 + 3e-3), rel=1e-9)


# -- planners ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", HALVES)
def test_one_dim_network_plans_one_op(kind: Collective) -> None:
    topology = Topology(dims=(Dimension.make("ring", 8, 100, 1000),))
    schedule = plan(topology, 64 * MIB, "hipipe", collective=kind)
    # One dim overlaps nothing: one chunk, one op, the hierarchical time.
    assert schedule.num_chunks == 1
    assert [op.phase for op in schedule.ops] == [Phase.RS if kind is RS else Phase.AG]
    assert schedule.makespan_s == pytest.approx(op_time_s(topology, (0,), 64 * MIB), rel=1e-12)
    assert schedule.makespan_s == pytest.approx(
        plan(topology, 64 * MIB, "hierarchical", collective=kind).makespan_s, rel=1e-12
    )


@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize("kind", HALVES)
@pytest.mark.parametrize(
    "topology",
    [SQUARE, "tpu-2d", "fc:4:50GB/s:100ns,switch:4:20GB/s:1us:halving_doubling,ring:3:5GB/s:0ns"],
)
def test_every_planner_plans_rs_and_ag_and_the_checker_proves_them(
    planner: str, kind: Collective, topology: str
) -> None:
    topo = load_topology(topology)
    message = topo.num_npus * MIB
    schedule = plan(topo, message, planner, collective=kind)
    assert schedule.collective is kind
    assert {op.phase for op in schedule.ops} == {Phase.RS if kind is RS else Phase.AG}
    assert all(len(schedule.chunk_ops(j)) == len(c.order) for j, c in enumerate(schedule.chunks))
    report = check(schedule)
    assert report.problems == ()
    assert report.method == "symbolic"
    name = "ReduceScatter" if kind is RS else "AllGather"
    assert report.summary().endswith(f"{name} proven (symbolic)")
    assert simulate(schedule).makespan_s == pytest.approx(schedule.makespan_s, rel=1e-12)
    assert Schedule.from_json(schedule.to_json()) == schedule


dimensions = st.builds(
    Dimension.make,
    kind=st.sampled_from(["ring", "switch", "fully_connected"]),
    size=st.integers(2, 8),
    bandwidth_gbps=st.floats(1, 500),
    latency_ns=st.one_of(st.just(0.0), st.floats(0, 5000)),
)
topologies = st.lists(dimensions, min_size=1, max_size=4).map(lambda dims: Topology(dims=tuple(dims)))


@pytest.mark.slow
@pytest.mark.one_process
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies, exponent=st.integers(10, 36), kind=st.sampled_from(HALVES))
def test_hipipe_never_loses_to_a_baseline_for_rs_and_ag(
    topology: Topology, exponent: int, kind: Collective
) -> None:
    n = topology.num_npus
    message = max(n, 2**exponent // n * n)  # RS and AG need whole shards
    schedule = plan(topology, message, "hipipe", collective=kind)
    sizes = np.array([c.size_bytes for c in schedule.chunks])
    assert np.all(sizes > 0) and math.isclose(sizes.sum(), message, rel_tol=1e-9)
    lp_s = schedule.info["lp_makespan_s"]
    if lp_s is not None:  # the sizing LP agrees with the simulator for every collective
        assert lp_s == pytest.approx(schedule.makespan_s, rel=1e-6)
    assert schedule.makespan_s >= lower_bound_s(topology, message, kind) * (1 - 1e-9)
    if n <= 64:
        assert check(schedule).problems == ()
    for name in BASELINES:
        baseline = plan(topology, message, name, collective=kind)
        assert schedule.makespan_s <= baseline.makespan_s * (1 + 1e-9), name


@pytest.mark.parametrize("kind", HALVES)
def test_one_end_families_are_tried_for_rs_and_ag_only(kind: Collective) -> None:
    """hgx-h100-32's mix is (0 1) 97.9%, (1 0) 2.1%: at K = 4 the light order gets a chunk
    of its own only at one end for RS and AG, at both ends for AllReduce."""
    topology = load_topology("hgx-h100-32")
    mix = order_mix(topology)
    assert mix.orders == ((0, 1), (1, 0))
    found = dict(families(topology, 2**30, mix, 4, ascending_only=False, collective=kind))
    assert found["mix-front"] == ((1, 0), (0, 1), (0, 1), (0, 1))
    assert found["mix-back"] == ((0, 1), (0, 1), (0, 1), (1, 0))
    assert "mix-bookends" not in found
    allreduce = dict(families(topology, 2**30, mix, 4, ascending_only=False))
    assert allreduce["mix-bookends"] == ((1, 0), (0, 1), (0, 1), (1, 0))
    assert "mix-front" not in allreduce


@pytest.mark.parametrize("kind", HALVES)
def test_a_message_that_does_not_split_into_shards_is_refused(kind: Collective) -> None:
    topology = load_topology("tpu-2d")  # N = 32
    with pytest.raises(HipipeError, match="not a multiple of 32"):
        plan(topology, 32 * MIB + 1, "hipipe", collective=kind)
    plan(topology, 32 * MIB + 1, "ring")  # AllReduce takes any size


def test_sequences_that_contradict_the_chains_raise_deadlock() -> None:
    topology = load_topology(SQUARE)
    # Chunk 0 in order (0, 1): op 0 RS dim 0, op 1 RS dim 1; chunk 1 in (1, 0): op 2 RS
    # dim 1, op 3 RS dim 0. Each chain is one RS per dim: no AG tail.
    table = op_table(topology, ((0, 1), (1, 0)), RS)
    assert table.chain_length == 2 and not table.gathers.any()
    durations = table.durations_s(np.array([1.0, 1.0]))
    assert longest_path_s(table, durations, ((0, 3), (2, 1))) > 0
    # Dim 0 starts with op 3 (waits for op 2, second on dim 1), dim 1 with op 1 (waits
    # for op 0, second on dim 0): neither can start.
    with pytest.raises(Deadlock):
        longest_path_s(table, durations, ((3, 0), (1, 2)))


# -- the checker ------------------------------------------------------------------------


def _misordered(kind: Collective) -> Schedule:
    """Ops that run RS over dim 1 first (AG: over dim 0 first), with the chunk's order
    saying (0, 1): the layout the order stands for is not the one the ops produce."""
    topology = load_topology(SQUARE)
    real = simulate_chunks(
        topology, 4096, [Chunk(index=0, size_bytes=4096.0, order=((1,), (0,)))], collective=kind
    )
    return dataclasses.replace(real, chunks=(Chunk(index=0, size_bytes=4096.0, order=((0,), (1,))),))


def test_reduce_scatter_that_leaves_shards_permuted_is_rejected_naming_who_holds_what() -> None:
    # Staged by the order (0, 1), rank r = c0 + 2 c1 sits at slot 2 c0 + c1. RS over dim 1
    # first hands member c1 the slots 2 c1 .. 2 c1 + 1, then RS over dim 0 leaves slot
    # 2 c1 + c0 on rank (c0, c1): rank 1 (c0=1, c1=0) gets slot 1, which stages shard 2
    # (c0=0, c1=1), and rank 2 gets shard 1. Ranks 0 and 3 end on their own shards.
    report = check(_misordered(RS))
    text = problems_text(report)
    assert "rank 1 holds shard 2; rank 2 holds shard 1" in text
    assert "rank r must hold exactly shard r" in text
    assert "rank 0 holds" not in text and "rank 3 holds" not in text


def test_all_gather_whose_ops_run_in_the_wrong_order_is_rejected() -> None:
    # AG must start on order[-1] = dim 1 (slots 2 c0 + c1 and 2 c0 + 1 - c1 are adjacent);
    # starting on dim 0 pairs slots c1 and 2 + c1, which do not tile a larger piece.
    report = check(_misordered(AG))
    text = problems_text(report)
    assert "should be AG on dim 1" in text
    assert "symbolic run: chunk 0, op 0 (AG on dim 0): the pieces of one group do not tile" in text


def test_all_gather_op_claiming_a_reduce_scatter_is_rejected() -> None:
    schedule = plan(load_topology(SQUARE), 4 * MIB, "hierarchical", collective=AG)
    ops = list(schedule.ops)
    ops[0] = dataclasses.replace(ops[0], phase=Phase.RS)
    report = check(dataclasses.replace(schedule, ops=tuple(ops)))
    text = problems_text(report)
    assert "should be AG on dim 1" in text
    # Each rank holds only its own shard: the members of a group work on different pieces.
    assert "work on different pieces" in text


def test_rs_whose_message_does_not_split_into_shards_is_rejected() -> None:
    topology = load_topology(SQUARE)
    chunk = Chunk(index=0, size_bytes=4098.0, order=((0,), (1,)))
    schedule = simulate_chunks(topology, 4098, [chunk], collective=RS)
    assert "cannot be cut into 4 equal shards" in problems_text(check(schedule))


def test_rs_schedule_relabelled_as_allreduce_is_rejected() -> None:
    schedule = plan(load_topology(SQUARE), 4 * MIB, "pipelined", num_chunks=2, collective=RS)
    report = check(dataclasses.replace(schedule, collective=Collective.ALL_REDUCE))
    assert "its chunks' chains need 8" in problems_text(report)


def test_checker_knows_nothing_of_planners() -> None:
    source = Path(__file__).parents[1] / "src" / "hipipe" / "checker.py"
    text = source.read_text()
    assert "hipipe.planners" not in text  # it derives chains and shard layout itself


# -- CLI --------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_plans_checks_and_simulates_rs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rs.json"
    code, out, _ = run_cli(
        capsys, "plan", "tpu-2d", "--size", "1MiB", "--collective", "reduce_scatter", "--json", str(path)
    )
    assert code == 0 and "reduce_scatter" in out
    document = json.loads(path.read_text())
    assert document["version"] == 2 and document["collective"] == "reduce_scatter"
    code, out, _ = run_cli(capsys, "check", str(path))
    assert code == 0 and "ReduceScatter proven" in out
    code, out, _ = run_cli(capsys, "simulate", str(path))
    assert code == 0 and "reduce_scatter" in out and "+0.00e+00 relative" in out


def test_compare_json_rows_carry_the_collective(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "compare", "tpu-2d", "--sizes", "1MiB", "--planners", "ring,hierarchical",
        "--collective", "all_gather", "--json",
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["collective"] == "all_gather"
    assert {row["collective"] for row in document["results"]} == {"all_gather"}
    # T* of a 1 MiB AllGather on tpu-2d: 31/32 * 2^20 / 160e9.
    assert document["bounds"][0]["lower_bound_s"] == pytest.approx(31 / 32 * 2**20 / 160e9)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--collective", "all_to_all"), "unknown collective 'all_to_all' (use all_reduce"),
        (("--collective", "reduce_scatter", "--size", "1000001"), "not a multiple of 32"),
    ],
)
def test_bad_collective_input_is_one_line_and_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    path = tmp_path / "s.json"
    size = () if "--size" in argv else ("--size", "1MiB")
    code, _, err = run_cli(capsys, "plan", "tpu-2d", *size, *argv, "--json", str(path))
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hipipe: error:") and fragment in lines[0]
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
    code, _, err = run_cli(
        capsys, "compare", "tpu-2d", "--sizes", "1000001B", "--planners", "ring", *argv[:2]
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
