"""Hand-computed times: the arithmetic is written out so a reader can redo it."""

import dataclasses

import pytest

from hipipe.cost import lower_bound_s, op_time_s, volume_per_byte
from hipipe.errors import ScheduleError
from hipipe.planners import BASELINES, plan
from hipipe.planners.baselines import themis_ideal_orders
from hipipe.schedule import Chunk, Phase
from hipipe.simulator import Policy, simulate, simulate_chunks
from hipipe.topology_io import load_topology

# dim 0: ring 2 @ 100 GB/s, no latency; dim 1: switch 4 @ 10 GB/s, 1 us per link.
TWO_DIMS = "ring:2:100GB/s:0ns,switch:4:10GB/s:1us"
M = 10**9


def test_single_dimension_ring_time() -> None:
    topo = load_topology("ring:4:1GB/s:1us")
    # RS: 3 steps x 1 us + 3/4 x 4e6 B / 1e9 B/s = 3e-6 + 3e-3; AG the same.
    assert plan(topo, 4 * 10**6, "hierarchical").makespan_s == pytest.approx(2 * (3e-6 + 3e-3), rel=1e-12)


def test_hierarchical_two_dims() -> None:
    topo = load_topology(TWO_DIMS)
    rs0 = 0.5 * 1e9 / 100e9  # 5 ms
    rs1 = 2 * 3 * 1e-6 + 0.75 * 5e8 / 10e9  # switch: 3 steps x 2 links x 1 us + 37.5 ms
    schedule = plan(topo, M, "hierarchical")
    assert schedule.makespan_s == pytest.approx(2 * rs0 + 2 * rs1, rel=1e-12)
    assert [(o.phase, o.dims) for o in schedule.ops] == [
        (Phase.RS, (0,)),
        (Phase.RS, (1,)),
        (Phase.AG, (1,)),
        (Phase.AG, (0,)),
    ]


def test_pipelined_two_chunks_fifo() -> None:
    topo = load_topology(TWO_DIMS)
    rs0 = 0.5 * 5e8 / 100e9  # 2.5 ms per chunk on dim 0
    rs1 = 6e-6 + 0.75 * 2.5e8 / 10e9  # 18.756 ms per chunk on dim 1
    # dim 0: RS(c0) [0, 2.5], RS(c1) [2.5, 5]
    # dim 1: RS(c0) [2.5, 2.5+rs1]; RS(c1) was queued at 5 ms, before AG(c0) arrives, so it goes
    #        next: [2.5+rs1, 2.5+2rs1]; then AG(c0) [.., 2.5+3rs1]; AG(c1) [.., 2.5+4rs1]
    # dim 0: AG(c0) at 2.5+3rs1, AG(c1) at 2.5+4rs1 -> makespan 2 rs0 ... + 4 rs1 + rs0
    expected = rs0 + 4 * rs1 + rs0
    schedule = plan(topo, M, "pipelined", num_chunks=2)
    assert schedule.makespan_s == pytest.approx(expected, rel=1e-12)
    assert schedule.sequences[1] == (1, 5, 2, 6)  # RS c0, RS c1, AG c0, AG c1 (ops chunk-major)


def test_flat_ring_is_bottlenecked_by_the_slowest_dimension() -> None:
    topo = load_topology(TWO_DIMS)
    # N = 8: 7 steps per phase; each moves M/8 = 1.25e8 B; slowest: switch, 2 links x 1 us + 12.5 ms.
    step = max(0 + 1.25e8 / 100e9, 2e-6 + 1.25e8 / 10e9)
    assert plan(topo, M, "ring").makespan_s == pytest.approx(2 * 7 * step, rel=1e-12)


def test_lower_bound_and_volumes() -> None:
    topo = load_topology(TWO_DIMS)
    assert lower_bound_s(topo, M) == pytest.approx(2 * 7 / 8 * 1e9 / 110e9, rel=1e-12)
    # order (0, 1): dim 0 carries 2 x 1/2 = 1 B per byte, dim 1: 2 x 3/4 / 2 = 0.75.
    assert volume_per_byte(topo, (0, 1)) == pytest.approx([1.0, 0.75])
    assert sum(volume_per_byte(topo, (1, 0))) == pytest.approx(2 * 7 / 8)


def test_themis_ideal_orders_start_on_the_least_loaded_dimension() -> None:
    topo = load_topology("ring:2:10GB/s:0ns,ring:4:100GB/s:0ns")
    # chunk 0 (4e8 B): no load yet -> ascending. It adds 1/2 x 4e8 / 1e10 = 20 ms to dim 0
    # and 3/4 x 2e8 / 1e11 = 1.5 ms to dim 1. Gap 18.5 ms x 100 GB/s = 1.85e9 B > 4e8/16,
    # so chunk 1 starts on dim 1.
    assert themis_ideal_orders(topo, 8 * 10**8, 2) == [((0,), (1,)), ((1,), (0,))]


def test_themis_ideal_keeps_ascending_below_the_threshold() -> None:
    # Two 2-NPU dims, B1 = r x B0. After chunk 0 (ascending) and chunk 1 (dim 1 first), the
    # loads are 0.75 c/B0 and 0.75 c/B1: dim 1 is less loaded by 0.75 c (1/B0 - 1/B1), i.e.
    # 0.75 c (r - 1) bytes at B1. r = 1.05: 0.0375 c < c/16 -> chunk 2 keeps the ascending order;
    # r = 1.2: 0.15 c > c/16 -> chunk 2 starts on dim 1.
    close = themis_ideal_orders(load_topology("ring:2:100GB/s:0ns,ring:2:105GB/s:0ns"), 2**20, 3)
    assert close == [((0,), (1,)), ((1,), (0,)), ((0,), (1,))]
    apart = themis_ideal_orders(load_topology("ring:2:100GB/s:0ns,ring:2:120GB/s:0ns"), 2**20, 3)
    assert apart == [((0,), (1,)), ((1,), (0,)), ((1,), (0,))]


def test_scf_runs_the_smallest_ready_op_first() -> None:
    topo = load_topology(TWO_DIMS)
    chunks = [
        Chunk(index=0, size_bytes=8e8, order=((0,), (1,))),
        Chunk(index=1, size_bytes=2e8, order=((0,), (1,))),
    ]
    fifo = simulate_chunks(topo, M, chunks, policy=Policy.FIFO)
    scf = simulate_chunks(topo, M, chunks, policy=Policy.SCF)
    assert fifo.sequences[0][0] == 0  # FIFO: both ready at 0, lower chunk first
    assert scf.sequences[0][0] == 4  # SCF: chunk 1's RS (smaller) first


def test_fixed_replay_reproduces_every_baseline() -> None:
    topo = load_topology("rfs-3d")
    for name in BASELINES:
        schedule = plan(topo, 2**26, name)
        replay = simulate(schedule)
        assert replay.makespan_s == pytest.approx(schedule.makespan_s, rel=1e-12)
        assert replay.ops == schedule.ops


def test_fixed_policy_rejects_a_deadlocking_sequence() -> None:
    topo = load_topology(TWO_DIMS)
    schedule = plan(topo, M, "pipelined", num_chunks=2)
    # dim 1 runs chunk 0's AG before its RS: impossible.
    broken = dataclasses.replace(schedule, sequences=(schedule.sequences[0], (2, 1, 5, 6)))
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(broken)


def test_op_durations_follow_the_cost_model() -> None:
    topo = load_topology("rfs-3d")
    schedule = plan(topo, 2**24, "themis", num_chunks=8)
    for op in schedule.ops:
        assert op.duration_s == pytest.approx(op_time_s(topo, op.dims, op.full_bytes), rel=1e-9)


def test_json_round_trip_is_byte_identical() -> None:
    from hipipe.schedule import Schedule

    schedule = plan(load_topology("libra-4d"), 3 * 2**20 + 7, "themis", num_chunks=5)
    text = schedule.to_json()
    again = Schedule.from_json(text)
    assert again.to_json() == text
    assert again == schedule


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="other"), "not a hipipe schedule"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d.pop("ops"), "malformed"),
        (lambda d: d["sequences"].pop(), "dimension sequences"),
    ],
)
def test_malformed_schedule_json(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    import json

    from hipipe.schedule import Schedule

    data = json.loads(plan(load_topology("tpu-2d"), 2**20, "pipelined", num_chunks=2).to_json())
    mutate(data)
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_json(json.dumps(data))
