"""The exact planner (MIP) and the pipeline bound ``T_pipe``.

Hand-computed optima on instances small enough to solve on paper; properties on
generated networks: the exact schedule is valid, never slower than any planner at the
same K, and never below any lower bound; ``T_pipe`` is never above any planner's makespan.
No timing assertions: solve times are measured by ``benchmarks/optimality.py``.
"""

import itertools
import json
import math
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipipe import Collective, Dimension, Topology, plan
from hipipe.bounds import best_bound_s, chunked_bound_s, latency_aware_bound_s, pipeline_bound_s
from hipipe.checker import check
from hipipe.cli import main
from hipipe.cost import lower_bound_s
from hipipe.errors import HipipeError, ScheduleError
from hipipe.planners import PLANNERS
from hipipe.planners.exact import plan_exact
from hipipe.presets import PRESETS
from hipipe.schedule import Chunk, Schedule, chain
from hipipe.simulator import Policy, simulate, simulate_chunks

MIB = 1024**2
REL_TOL = 1e-9


def assert_valid_exact(schedule: Schedule) -> None:
    """Checker proves it, the simulator replays it, JSON round-trips, it is above every floor."""
    assert check(schedule).problems == ()  # the checker proves all three collectives
    assert math.isclose(simulate(schedule).makespan_s, schedule.makespan_s, rel_tol=1e-12)
    assert math.isclose(sum(c.size_bytes for c in schedule.chunks), schedule.message_bytes, rel_tol=1e-9)
    text = schedule.to_json()
    assert Schedule.from_json(text).to_json() == text
    json.dumps(dict(schedule.info), allow_nan=False)
    if schedule.info["incumbent"] == "mip":
        assert math.isclose(schedule.info["mip_makespan_s"], schedule.makespan_s, rel_tol=1e-6)
    else:  # no MIP solution beat the best seed: the seed is returned, re-timed, and proven
        # optimal only where every first-dim MIP settled with nothing below it
        info = schedule.info
        assert not info["proven_optimal"] or (
            info["method"] == "first-dims"
            and info["first_dim_multisets_settled"] == info["first_dim_multisets"]
        )
        assert schedule.makespan_s == pytest.approx(
            schedule.info["seeds_makespan_s"][schedule.info["incumbent"]]
        )
    floor_s = pipeline_bound_s(schedule.topology, schedule.message_bytes, schedule.collective)
    assert schedule.makespan_s >= floor_s * (1 - REL_TOL)
    if schedule.info["proven_optimal"]:
        assert schedule.info["mip_dual_bound_s"] <= schedule.makespan_s * (1 + 1e-6)


def two_rings() -> Topology:
    """Ring 2 @ 1 GB/s and ring 4 @ 2 GB/s, 1 us per link: small enough to solve by hand."""
    return Topology(dims=(Dimension.make("ring", 2, 1, 1000), Dimension.make("ring", 4, 2, 1000)))


# -- hand-computed optima ----------------------------------------------------------------


def test_one_chunk_optimum_is_the_cheaper_order_by_hand() -> None:
    # M = 8e6 B. Ring 2: 1 step (1 us); ring 4: 3 steps (3 us).
    # Order (0, 1): RS0 = 1 us + 1/2 * 8e6 / 1e9 = 4.001 ms, RS1 = 3 us + 3/4 * 4e6 / 2e9 = 1.503 ms;
    #               AG mirrors RS: 2 * 5.504 = 11.008 ms.
    # Order (1, 0): RS1 = 3 us + 3/4 * 8e6 / 2e9 = 3.003 ms, RS0 = 1 us + 1/2 * 2e6 / 1e9 = 1.001 ms;
    #               2 * 4.004 = 8.008 ms  <- the optimum with one chunk.
    schedule = plan_exact(two_rings(), 8_000_000, num_chunks=1)
    assert schedule.makespan_s == pytest.approx(8.008e-3, rel=1e-9)
    assert [c.dims_order() for c in schedule.chunks] == [(1, 0)]
    assert schedule.info["proven_optimal"] is True
    assert_valid_exact(schedule)


def test_one_dim_gains_nothing_from_chunks_so_exact_keeps_one() -> None:
    # One ring of 4 @ 1 GB/s, 1 us per link (3 steps): every chunk adds 2 * 3 us of latency and
    # nothing overlaps, so the optimum is a single chunk: 2 * (3 us + 3/4 * 4e6 / 1e9) = 6.006 ms.
    topology = Topology(dims=(Dimension.make("ring", 4, 1, 1000),))
    schedule = plan_exact(topology, 4_000_000, num_chunks=3)
    assert schedule.num_chunks == 1
    assert schedule.makespan_s == pytest.approx(6.006e-3, rel=1e-9)
    assert schedule.info["proven_optimal"] is True
    assert_valid_exact(schedule)


@pytest.mark.parametrize("collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_half_collectives_by_hand(collective: Collective) -> None:
    # Half of the one-chunk AllReduce above: the best order is still (1, 0) for RS
    # (3.003 + 1.001 = 4.004 ms) and for AG (the same ops backwards).
    schedule = plan_exact(two_rings(), 8_000_000, num_chunks=1, collective=collective)
    assert schedule.collective is collective
    assert schedule.makespan_s == pytest.approx(4.004e-3, rel=1e-9)
    assert [c.dims_order() for c in schedule.chunks] == [(1, 0)]
    assert_valid_exact(schedule)


@pytest.mark.parametrize("collective", list(Collective))
def test_exact_pipelines_every_collective_and_beats_the_pipelined_baseline(collective: Collective) -> None:
    topology = PRESETS["rfs-3d"]()
    schedule = plan_exact(topology, 64 * MIB, num_chunks=3, collective=collective)
    baseline = plan(topology, 64 * MIB, "pipelined", num_chunks=3, collective=collective)
    assert schedule.info["proven_optimal"] is True
    assert schedule.makespan_s <= baseline.makespan_s * (1 + REL_TOL)
    # Two or more chunks run concurrently at some point: the plan really pipelines.
    assert schedule.num_chunks >= 2
    assert_valid_exact(schedule)


def test_exact_finds_what_hipipe_misses_on_rfs_3d() -> None:
    # benchmarks/optimality.py: at 256 MiB and K = 3 the MIP proves a schedule 2.2% faster than
    # hipipe's (orders (0,1,2), (0,2,1), (1,0,2) sequenced differently). Exact must never lose.
    topology = PRESETS["rfs-3d"]()
    exact = plan_exact(topology, 256 * MIB, num_chunks=3, seeds=("pipelined",))
    hipipe = plan(topology, 256 * MIB, "hipipe", num_chunks=3)
    assert exact.info["proven_optimal"] is True
    assert exact.makespan_s <= hipipe.makespan_s * (1 + 1e-6)
    assert_valid_exact(exact)


@pytest.mark.slow
@pytest.mark.one_process
def test_time_limit_returns_the_incumbent_with_its_gap() -> None:
    topology = PRESETS["libra-4d"]()
    schedule = plan_exact(topology, 256 * MIB, num_chunks=4, time_limit_s=0.5)
    assert schedule.info["proven_optimal"] is False
    assert schedule.info["mip_gap"] is None or schedule.info["mip_gap"] > 0
    assert schedule.info["incumbent"] == "mip" or schedule.info["incumbent"].split("@")[0] in (
        "pipelined",
        "hipipe",
    )
    seeds = schedule.info["seeds_makespan_s"]
    assert schedule.makespan_s <= min(seeds.values()) * (1 + 1e-6)
    assert_valid_exact(schedule)


def test_hipipe_seeds_the_mip_once_up_to_k_4_and_every_count_above() -> None:
    """hipipe's forced K is already its best with at most K chunks (K <= 4), and a forced K
    above 4 is never worse than a forced 4: fewer-chunk calls would only cost seed time."""
    topology = PRESETS["tpu-2d"]()
    three = plan_exact(topology, 16 * MIB, num_chunks=3, time_limit_s=20)
    assert sorted(three.info["seeds_makespan_s"]) == ["hipipe@3", "pipelined@1", "pipelined@2", "pipelined@3"]
    assert 0 < three.info["seed_time_s"] <= three.info["solve_time_s"]
    hipipe_at = {k: plan(topology, 16 * MIB, "hipipe", num_chunks=k).makespan_s for k in (1, 2, 3, 4, 5)}
    assert all(hipipe_at[3] <= hipipe_at[k] * (1 + 1e-9) for k in (1, 2))
    assert all(hipipe_at[5] <= hipipe_at[k] * (1 + 1e-9) for k in (1, 2, 3, 4))
    six = plan_exact(topology, 16 * MIB, num_chunks=6, time_limit_s=5)
    assert {name for name in six.info["seeds_makespan_s"] if name.startswith("hipipe")} == {
        "hipipe@5",
        "hipipe@6",
    }
    assert_valid_exact(six)


# -- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_chunks", "topology", "fragment"),
    [
        (None, "tpu-2d", "needs a number of chunks"),
        (7, "tpu-2d", "1..6 chunks"),
        (0, "tpu-2d", "chunks must be >= 1"),
        (2, "ring:2:1GB/s:1us," * 4 + "ring:2:1GB/s:1us", "up to 4 dimensions"),
    ],
)
def test_refuses_instances_beyond_its_size(num_chunks: int | None, topology: str, fragment: str) -> None:
    from hipipe.topology_io import load_topology

    with pytest.raises(HipipeError, match=fragment):
        plan(load_topology(topology), MIB, "exact", num_chunks=num_chunks)


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    out_file = tmp_path / "plan.json"
    for argv, fragment in (
        (["plan", "tpu-2d", "--size", "1MiB", "--planner", "exact", "--json", str(out_file)], "--chunks"),
        (["plan", "tpu-2d", "--size", "1MiB", "--time-limit", "5"], "exact only"),
        (
            ["plan", "tpu-2d", "--size", "1MiB", "--planner", "exact", "--chunks", "2", "--time-limit", "0"],
            "time limit",
        ),
    ):
        code = main(argv)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err
    assert not out_file.exists()


def test_cli_plan_exact_json_re_times_to_the_same_makespan(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["plan", "hgx-h100-32", "--size", "64MiB", "--planner", "exact", "--chunks", "2", "--json", "-"]
    )
    assert code == 0
    schedule = Schedule.from_json(capsys.readouterr().out)
    assert schedule.planner == "exact" and schedule.info["proven_optimal"] is True
    assert math.isclose(simulate(schedule).makespan_s, schedule.makespan_s, rel_tol=1e-12)
    hipipe = plan(schedule.topology, 64 * MIB, "hipipe", num_chunks=2)
    assert schedule.makespan_s <= hipipe.makespan_s * (1 + 1e-9)


def test_compare_reports_the_pipeline_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", "tpu-2d", "--sizes", "64MiB", "--planners", "pipelined,hipipe", "--json"])
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    bound = document["bounds"][0]
    assert bound["best_bound_s"] == max(bound["order_mix_bound_s"], bound["pipeline_bound_s"])
    for row in document["results"]:
        assert 0 < row["best_bound_utilization"] <= 1
    code = main(["plan", "tpu-2d", "--size", "64MiB", "--explain"])
    assert code == 0 and "T_pipe" in capsys.readouterr().out


# -- the pipeline bound ------------------------------------------------------------------


def test_pipeline_bound_of_tpu_2d_by_hand() -> None:
    # tpu-2d: ring 4 and ring 8, both 80 GB/s; 3 and 7 steps of 1 us. Equal bandwidths, so
    # the two dims' loads sum to 2 T* whatever the orders, T* = (31/32) M / B.
    # K >= 2, F = {0, 1}: dim 0 pays 2 * 2 * 3 us = 12 us of latency, dim 1 2 * 2 * 7 us = 28 us;
    # balancing 12 us + l0 = 28 us + l1 with l0 + l1 = 2 T* gives T = T* + 20 us. (F = {0} or {1}
    # forces one order, far from balanced; K = 1 pays the whole chain.)
    topology = PRESETS["tpu-2d"]()
    message = 64 * MIB
    t_star = 31 / 32 * message / 80e9
    assert lower_bound_s(topology, message) == pytest.approx(t_star, rel=1e-12)
    assert pipeline_bound_s(topology, message) == pytest.approx(t_star + 20e-6, rel=1e-9)
    # At least 3 chunks: 2 * 3 * 3 us = 18 us on dim 0, 2 * 3 * 7 us = 42 us on dim 1: T* + 30 us.
    assert pipeline_bound_s(topology, message, min_chunks=3) == pytest.approx(t_star + 30e-6, rel=1e-9)
    # ReduceScatter: half the load and half the latency: (T* + 20 us) / 2.
    assert pipeline_bound_s(topology, message, Collective.REDUCE_SCATTER) == pytest.approx(
        (t_star + 20e-6) / 2, rel=1e-9
    )


def test_pipeline_bound_is_the_one_chunk_chain_when_latency_dominates() -> None:
    # Dim 0: ring 2 @ 1 GB/s, no latency; dim 1: ring 2 @ 1 GB/s, 1 step of 1 us. M = 1 B.
    # K >= 2: dim 1 runs >= 2 chunks x 2 phases x 1 us = 4 us whatever the set of first dims.
    # K = 1: the chain, 2 x (0 + 1 us) of latency plus bytes 2 x (1/2 x 1 B + 1/2 x 1/2 B) / 1e9 B/s
    # in either order = 1.5 ns: the floor is 2 us + 1.5 ns, and exact at K = 2 reaches it with one chunk.
    topology = Topology(dims=(Dimension.make("ring", 2, 1, 0), Dimension.make("ring", 2, 1, 1000)))
    assert pipeline_bound_s(topology, 1) == pytest.approx(2e-6 + 1.5e-9, rel=1e-9)
    schedule = plan_exact(topology, 1, num_chunks=2)
    assert schedule.num_chunks == 1
    assert schedule.makespan_s == pytest.approx(2e-6 + 1.5e-9, rel=1e-9)


dims_strategy = st.builds(
    Dimension.make,
    st.sampled_from(["ring", "switch", "fully_connected"]),
    st.integers(min_value=2, max_value=8),
    st.floats(min_value=1, max_value=500),
    st.floats(min_value=0, max_value=5000),
)
small_topologies = st.lists(dims_strategy, min_size=1, max_size=3).map(lambda d: Topology(dims=tuple(d)))
sizes = st.floats(min_value=10, max_value=32).map(lambda e: round(2**e))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=small_topologies, message_bytes=sizes, num_chunks=st.integers(min_value=1, max_value=3))
def test_exact_is_valid_and_never_loses_at_its_k(
    topology: Topology, message_bytes: int, num_chunks: int
) -> None:
    schedule = plan_exact(topology, message_bytes, num_chunks=num_chunks, time_limit_s=10)
    assert_valid_exact(schedule)
    assert schedule.num_chunks <= num_chunks
    for name in ("pipelined", "hipipe"):
        other = plan(topology, message_bytes, name, num_chunks=num_chunks)
        assert schedule.makespan_s <= other.makespan_s * (1 + 1e-6), name
    # No schedule with K chunks beats the K-chunk floor of bounds.py.
    assert schedule.makespan_s >= chunked_bound_s(topology, message_bytes, schedule.num_chunks) * (1 - 1e-6)
    assert schedule.makespan_s >= best_bound_s(topology, message_bytes) * (1 - 1e-6)


@pytest.mark.slow
@pytest.mark.one_process
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topology=st.lists(dims_strategy, min_size=1, max_size=4).map(lambda d: Topology(dims=tuple(d))),
    message_bytes=st.floats(min_value=0, max_value=36).map(lambda e: max(1, round(2**e))),
    num_chunks=st.one_of(st.none(), st.integers(min_value=1, max_value=16)),
)
def test_pipeline_bound_is_below_every_planner(
    topology: Topology, message_bytes: int, num_chunks: int | None
) -> None:
    floor_s = pipeline_bound_s(topology, message_bytes)
    assert floor_s >= latency_aware_bound_s(topology, message_bytes) * (1 - 1e-9)
    for name in PLANNERS:
        schedule = plan(topology, message_bytes, name, num_chunks=num_chunks)
        assert schedule.makespan_s >= floor_s * (1 - 1e-9), name
    if num_chunks is not None:  # the pipelined baseline keeps all K of its chunks
        pipelined = plan(topology, message_bytes, "pipelined", num_chunks=num_chunks)
        assert pipelined.makespan_s >= pipeline_bound_s(topology, message_bytes, min_chunks=num_chunks) * (
            1 - 1e-9
        )
    # RS and AG need N equal shards: the nearest multiple of N at or above the size.
    shards_bytes = -(-message_bytes // topology.num_npus) * topology.num_npus
    for collective in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        floor_s = pipeline_bound_s(topology, shards_bytes, collective)
        for name in PLANNERS:
            schedule = plan(topology, shards_bytes, name, num_chunks=num_chunks, collective=collective)
            assert schedule.makespan_s >= floor_s * (1 - 1e-9), (name, collective)


def test_no_enumerated_two_chunk_schedule_beats_the_proven_optimum() -> None:
    # An independent check of "proven": on a 2-dim network, enumerate every pair of orders,
    # every per-dim sequence (all 4! orders of a dim's 4 ops; the simulator rejects those that
    # contradict the chains) and chunk sizes on a 1/8 grid. None may beat exact at K = 2.
    topology = Topology(dims=(Dimension.make("ring", 4, 100, 2000), Dimension.make("switch", 4, 25, 500)))
    message = 16 * MIB
    exact = plan_exact(topology, message, num_chunks=2)
    assert exact.info["proven_optimal"] is True
    best_s = math.inf
    orders = [((0,), (1,)), ((1,), (0,))]
    for first, second in itertools.product(orders, repeat=2):
        for eighths in range(1, 8):
            chunks = [
                Chunk(index=0, size_bytes=message * eighths / 8, order=first),
                Chunk(index=1, size_bytes=message * (8 - eighths) / 8, order=second),
            ]
            dims = [d for chunk in chunks for _, (d,), _, _ in chain(topology, chunk)]  # chunk-major op dims
            ops_on = [[op for op, d in enumerate(dims) if d == k] for k in range(2)]
            for seq0 in itertools.permutations(ops_on[0]):
                for seq1 in itertools.permutations(ops_on[1]):
                    try:
                        timed = simulate_chunks(
                            topology, message, chunks, policy=Policy.FIXED, sequences=[seq0, seq1]
                        )
                    except ScheduleError:
                        continue  # the sequences deadlock against the chains
                    best_s = min(best_s, timed.makespan_s)
    assert math.isfinite(best_s)
    assert exact.makespan_s <= best_s * (1 + 1e-9)


@pytest.mark.parametrize("symmetry", ["size", "sequence"])
@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("seed", range(6))
def test_every_schedule_satisfies_every_row_of_the_model(
    collective: Collective, seed: int, symmetry: str
) -> None:
    # The cuts and symmetry rows must only remove fractional points or duplicates: any real
    # schedule (random orders, sizes and sequences) written as MIP values satisfies every
    # row. A row that forbids a real schedule would let the MIP "prove" a makespan some
    # schedule beats (the symmetry row ordering sizes the wrong way round fails all 18).
    # Every third trial gives two chunks the same order, so both symmetries' rows bind.
    import random

    from hipipe.planners.exact.model import ExactModel

    rng = random.Random(seed)
    topology = Topology(
        dims=tuple(
            Dimension.make(rng.choice(["ring", "switch"]), rng.choice([2, 4]), rng.choice([25, 100]), 500)
            for _ in range(rng.choice([2, 3]))
        )
    )
    message = 64 * MIB
    num_chunks = rng.randint(2, 4)
    checked = 0
    for trial in range(8):
        weights = [rng.random() + 0.05 for _ in range(num_chunks)]
        chunks = []
        shared = list(range(topology.num_dims))
        rng.shuffle(shared)
        for j, weight in enumerate(weights):
            order = list(range(topology.num_dims))
            rng.shuffle(order)
            if trial % 3 == 0 and j < 2:
                order = list(shared)
            size = message * weight / sum(weights)
            chunks.append(Chunk(index=j, size_bytes=size, order=tuple((k,) for k in order)))
        policy = (Policy.FIFO, Policy.SCF)[trial % 2]
        schedule = simulate_chunks(topology, message, chunks, policy=policy, collective=collective)
        model = ExactModel(
            topology, message, num_chunks, collective, time_unit_s=schedule.makespan_s, symmetry=symmetry
        )
        values = model.values_of(schedule)
        assert values is not None
        rows = model.rows()
        ends = [*rows.starts[1:], len(rows.index)]
        for row, (start, end) in enumerate(zip(rows.starts, ends, strict=True)):
            activity = float(values[rows.index[start:end]] @ rows.value[start:end])
            assert rows.lower[row] - 1e-7 <= activity <= rows.upper[row] + 1e-7, (trial, row)
        checked += 1
    assert checked == 8


def test_optimality_benchmark_compares_the_collective_it_is_asked_for(
    optimality_benchmark: ModuleType,
) -> None:
    """``benchmarks/optimality.py --collective reduce_scatter`` plans, solves and bounds
    ReduceScatter throughout (on three small generated instances of seed 31)."""
    benchmark = optimality_benchmark
    collective = Collective.REDUCE_SCATTER
    entries = benchmark.run_generated(3, 31, 30.0, 30.0, collective)
    instances = benchmark.generated_instances(3, 31)
    assert len(entries) == 3
    for entry, (topology, message, k, _) in zip(entries, instances, strict=True):
        rs = plan(topology, message, "hipipe", num_chunks=k, collective=collective)
        ar = plan(topology, message, "hipipe", num_chunks=k)
        assert entry["hipipe_s"] == pytest.approx(rs.makespan_s, rel=REL_TOL)
        assert entry["hipipe_s"] < ar.makespan_s  # half the ops of an AllReduce
        assert entry["proven"] and entry["exact_s"] <= entry["hipipe_s"] * (1 + REL_TOL)
        assert entry["exact_s"] >= best_bound_s(topology, message, collective) * (1 - REL_TOL)


def test_the_optimality_benchmark_proves_a_larger_k_for_a_floor_where_k_4_misses_the_goal(
    optimality_benchmark: ModuleType,
) -> None:
    """hgx-h100-32 at 256 MiB (ReduceScatter): hipipe plans 8 chunks at 0.6746 ms; the floor
    from exact at K = 4 (min(its dual bound, T_pipe counting 5 chunks)) is 0.6378 ms, 5.8%
    below. Exact proves K = 5 in about a second, and min(its optimum, T_pipe counting 6
    chunks) is a floor for every K that hipipe is within 5% of. The floor proof (which
    reaches the same floor first, ``tests/test_exact_floor.py``) is turned off here."""
    benchmark = optimality_benchmark
    collective = Collective.REDUCE_SCATTER
    topology = PRESETS["hgx-h100-32"]()
    message = 256 * MIB
    cell = benchmark.run_cell("hgx-h100-32", message, 60.0, 40.0, collective, floor_time_limit_s=0.0)
    assert cell["floor_proof"] is None
    k4_floor_s = min(
        cell["per_k"][4]["dual_bound_s"], pipeline_bound_s(topology, message, collective, min_chunks=5)
    )
    assert cell["hipipe_s"] > k4_floor_s * 1.05  # the goal is missed with K <= 4 alone
    assert list(cell["deeper"]) == [5] and cell["deeper"][5]["proven"]
    floor_s = min(
        cell["deeper"][5]["dual_bound_s"], pipeline_bound_s(topology, message, collective, min_chunks=6)
    )
    assert cell["exact_backed_k"] == 5
    assert cell["exact_backed_bound_s"] == pytest.approx(floor_s, rel=REL_TOL)
    assert floor_s > k4_floor_s
    # A floor: no schedule below it, whatever its K (exact at every K run, hipipe at its own and at 2..4).
    schedules_s = [cell["hipipe_s"], cell["deeper"][5]["exact_s"]]
    schedules_s += [e[key] for e in cell["per_k"].values() for key in ("hipipe_s", "exact_s")]
    assert min(schedules_s) >= floor_s * (1 - REL_TOL)
    assert cell["bound_goal"] == "within 5% of the exact-backed bound (K <= 5)"
    assert cell["hipipe_vs_exact_backed_bound"] <= 0.05


# -- one MIP per multiset of first dims -------------------------------------------------


def test_first_dim_multisets_are_every_sorted_assignment_the_incumbents_first() -> None:
    from hipipe.planners.exact.first_dims import first_dim_multisets

    multisets = first_dim_multisets(3, 4, first=[2, 0])
    assert len(multisets) == len(set(multisets)) == math.comb(4 + 3 - 1, 3 - 1)
    assert all(list(m) == sorted(m) and set(m) <= {0, 1, 2} for m in multisets)
    # Two chunks used of four: the unused two take the last dim, which any order fits.
    assert multisets[0] == (0, 2, 2, 2)
    assert sorted(multisets) == list(itertools.combinations_with_replacement(range(3), 4))


@pytest.mark.parametrize(("num_dims", "num_chunks"), [(3, 3), (3, 5), (4, 3)])
def test_refining_first_dims_by_the_next_dim_reaches_every_sorted_tuple_of_orders_once(
    num_dims: int, num_chunks: int
) -> None:
    """Split every first-dim multiset down to full orders: the leaves are exactly the sorted
    K-tuples of orders (what the symmetry rows leave of every schedule, unused chunks taking
    the last order), each reached once, and every level stays sorted."""
    from hipipe.planners.exact.first_dims import first_dim_multisets, refinements

    leaves: list[tuple[tuple[int, ...], ...]] = []

    def descend(prefixes: tuple[tuple[int, ...], ...]) -> None:
        assert list(prefixes) == sorted(prefixes)
        if len(prefixes[0]) == num_dims - 1:
            leaves.append(prefixes)
            return
        children = refinements(prefixes, num_dims)
        assert len(children) == len(set(children))
        for child in children:
            assert all(c[: len(p)] == p for c, p in zip(child, prefixes, strict=True))
            descend(child)

    for multiset in first_dim_multisets(num_dims, num_chunks):
        descend(tuple((dim,) for dim in multiset))
    orders = list(itertools.permutations(range(num_dims)))
    expected = {
        tuple(order[:-1] for order in combo)
        for combo in itertools.combinations_with_replacement(orders, num_chunks)
    }
    assert (
        len(leaves)
        == len(set(leaves))
        == len(expected)
        == math.comb(len(orders) + num_chunks - 1, num_chunks)
    )
    assert set(leaves) == expected


@pytest.mark.parametrize(
    ("topology", "message", "num_chunks", "collective"),
    [
        (PRESETS["rfs-3d"](), 256 * MIB, 3, Collective.ALL_REDUCE),
        (two_rings(), 4 * MIB, 3, Collective.REDUCE_SCATTER),
        (PRESETS["libra-3d"](), 256 * MIB, 3, Collective.ALL_GATHER),
    ],
)
def test_one_mip_per_first_dim_multiset_proves_the_whole_mips_optimum(
    topology: Topology, message: int, num_chunks: int, collective: Collective
) -> None:
    """Seeded by the pipelined baseline alone, so the optimum must come from the MIPs: on
    rfs-3d at 256 MiB it is 2.2% below hipipe's K = 3 plan (see above)."""
    kwargs = {"num_chunks": num_chunks, "collective": collective, "seeds": ("pipelined",)}
    whole = plan_exact(topology, message, method="whole", **kwargs)
    split = plan_exact(topology, message, method="first-dims", **kwargs)
    assert whole.info["proven_optimal"] and split.info["proven_optimal"]
    assert split.info["method"] == "first-dims" and whole.info["method"] == "whole"
    assert split.info["first_dim_multisets"] == math.comb(num_chunks + topology.num_dims - 1, num_chunks)
    assert split.info["first_dim_multisets_settled"] == split.info["first_dim_multisets"]
    assert split.makespan_s == pytest.approx(whole.makespan_s, rel=1e-6)
    assert split.info["mip_dual_bound_s"] <= split.makespan_s
    assert_valid_exact(split)


def test_first_dims_in_two_worker_processes_prove_the_same_optimum_from_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--mip-jobs 2``: the multisets of rfs-3d at 256 MiB, K = 3, solved two at a time,
    prove the optimum the in-process split proves (the answer does not depend on jobs)."""
    topology = PRESETS["rfs-3d"]()
    alone = plan_exact(topology, 256 * MIB, num_chunks=3, method="first-dims")
    argv = ["plan", "rfs-3d", "--size", "256MiB", "--planner", "exact", "--chunks", "3"]
    assert main([*argv, "--method", "first-dims", "--mip-jobs", "2", "--json", "-"]) == 0
    both = Schedule.from_json(capsys.readouterr().out)
    assert both.info["proven_optimal"] and alone.info["proven_optimal"]
    assert both.info["first_dim_multisets_settled"] == both.info["first_dim_multisets"] == math.comb(5, 2)
    assert both.makespan_s == pytest.approx(alone.makespan_s, rel=1e-6)
    assert_valid_exact(both)
    code = main(["plan", "tpu-2d", "--size", "1MiB", "--mip-jobs", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--mip-jobs applies to --planner exact only" in err and "Traceback" not in err
    code = main([*argv, "--mip-jobs", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "jobs must be a whole number of processes, 1 or more, got 0" in err
    assert "Traceback" not in err


def test_first_dims_on_a_time_limit_keeps_a_valid_floor_and_its_gap() -> None:
    topology = PRESETS["libra-4d"]()
    schedule = plan_exact(
        topology, 256 * MIB, num_chunks=5, time_limit_s=1.0, seeds=("pipelined",), method="first-dims"
    )
    assert schedule.info["method"] == "first-dims"
    assert schedule.info["proven_optimal"] is False
    assert schedule.info["first_dim_multisets_settled"] < schedule.info["first_dim_multisets"] == 56
    assert schedule.info["mip_gap"] > 0
    floor_s = best_bound_s(topology, 256 * MIB, Collective.ALL_REDUCE)
    assert floor_s * (1 - REL_TOL) <= schedule.info["mip_dual_bound_s"] < schedule.makespan_s
    assert schedule.makespan_s <= min(schedule.info["seeds_makespan_s"].values()) * (1 + 1e-6)
    assert_valid_exact(schedule)


def test_auto_splits_by_first_dims_from_five_chunks_on_three_dims() -> None:
    three_dims = PRESETS["rfs-3d"]()
    small = plan_exact(three_dims, 64 * MIB, num_chunks=2, seeds=("pipelined",))
    assert small.info["method"] == "whole" and "first_dim_multisets" not in small.info
    many = plan_exact(three_dims, 64 * MIB, num_chunks=5, seeds=("pipelined",), time_limit_s=2)
    assert many.info["method"] == "first-dims" and many.info["first_dim_multisets"] == math.comb(7, 2)
    assert_valid_exact(many)
    five = plan_exact(PRESETS["tpu-2d"](), 16 * MIB, num_chunks=5, seeds=("pipelined",), time_limit_s=5)
    assert five.info["method"] == "whole"  # two dims: a first dim fixes the order already


def test_method_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HipipeError, match="method is one of auto, whole, first-dims"):
        plan_exact(two_rings(), MIB, num_chunks=2, method="split")
    code = main(["plan", "tpu-2d", "--size", "1MiB", "--method", "whole"])
    err = capsys.readouterr().err
    assert code == 2 and "--method applies to --planner exact only" in err and "Traceback" not in err
    argv = ["plan", "rfs-3d", "--size", "64MiB", "--planner", "exact", "--chunks", "2"]
    code = main([*argv, "--method", "first-dims", "--json", "-"])
    assert code == 0
    schedule = Schedule.from_json(capsys.readouterr().out)
    assert schedule.info["method"] == "first-dims" and schedule.info["proven_optimal"] is True


@pytest.mark.slow
@pytest.mark.one_process
def test_first_dims_prove_hipipes_five_chunk_plan_on_libra_4d() -> None:
    """libra-4d at 256 MiB (ReduceScatter): hipipe's own K is 5, where the whole MIP stopped
    at a 24.6% gap after 48 s; the 56 first-dim MIPs prove the optimum (about 100 s on a
    2-core host), and it is hipipe's makespan."""
    topology = PRESETS["libra-4d"]()
    collective = Collective.REDUCE_SCATTER
    free = plan(topology, 256 * MIB, "hipipe", collective=collective)
    assert free.num_chunks == 5
    exact = plan_exact(topology, 256 * MIB, num_chunks=5, collective=collective, time_limit_s=900)
    assert exact.info["method"] == "first-dims" and exact.info["proven_optimal"] is True
    assert exact.info["first_dim_multisets_settled"] == 56
    assert exact.makespan_s == pytest.approx(free.makespan_s, rel=1e-6)
    assert_valid_exact(exact)
