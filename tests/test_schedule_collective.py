"""The collective kind in the schedule: chains per kind and the versioned JSON."""

import json

import pytest

from hipipe.errors import ScheduleError
from hipipe.planners import plan
from hipipe.schedule import Chunk, Collective, Phase, Schedule, chain
from hipipe.simulator import Policy, simulate, simulate_chunks
from hipipe.topology_io import load_topology

TWO_DIMS = "ring:2:100GB/s:0ns,switch:4:10GB/s:1us"


def test_chains_per_collective() -> None:
    topo = load_topology(TWO_DIMS)
    chunk = Chunk(index=0, size_bytes=800.0, order=((1,), (0,)))
    # order (1, 0): RS on dim 1 shrinks 800 -> 200 (n=4), RS on dim 0 shrinks 200 -> 100 (n=2).
    rs = [(Phase.RS, (1,), 800.0, 200.0), (Phase.RS, (0,), 200.0, 100.0)]
    ag = [(Phase.AG, (0,), 100.0, 200.0), (Phase.AG, (1,), 200.0, 800.0)]
    assert chain(topo, chunk, Collective.ALL_REDUCE) == rs + ag
    assert chain(topo, chunk, Collective.REDUCE_SCATTER) == rs
    assert chain(topo, chunk, Collective.ALL_GATHER) == ag


@pytest.mark.parametrize("collective", list(Collective))
def test_simulated_schedule_carries_collective_and_round_trips(collective: Collective) -> None:
    topo = load_topology(TWO_DIMS)
    chunks = [Chunk(index=j, size_bytes=float(2**20), order=((j % 2,), ((j + 1) % 2,))) for j in range(3)]
    schedule = simulate_chunks(topo, 3 * 2**20, chunks, policy=Policy.FIFO, collective=collective)
    assert schedule.collective is collective
    assert len(schedule.ops) == 3 * 2 * collective.moves_per_byte
    assert [len(schedule.chunk_ops(j)) for j in range(3)] == [2 * collective.moves_per_byte] * 3
    text = schedule.to_json()
    assert json.loads(text)["collective"] == collective.value
    again = Schedule.from_json(text)
    assert again == schedule and again.to_json() == text
    assert simulate(again).makespan_s == pytest.approx(schedule.makespan_s, rel=1e-12)


def test_reduce_scatter_takes_half_of_allreduce_on_one_dimension() -> None:
    topo = load_topology("ring:4:1GB/s:1us")
    chunk = [Chunk(index=0, size_bytes=4e6, order=((0,),))]
    # RS alone: 3 steps x 1 us + 3/4 x 4e6 B / 1e9 B/s; the AllReduce pays it twice.
    rs = simulate_chunks(topo, 4 * 10**6, chunk, collective="reduce_scatter")
    assert rs.makespan_s == pytest.approx(3e-6 + 3e-3, rel=1e-12)
    ar = simulate_chunks(topo, 4 * 10**6, chunk)
    assert ar.makespan_s == pytest.approx(2 * rs.makespan_s, rel=1e-12)


def test_version_1_files_load_as_all_reduce() -> None:
    data = json.loads(plan(load_topology("tpu-2d"), 2**20, "pipelined", num_chunks=2).to_json())
    data["version"] = 1
    del data["collective"]
    assert Schedule.from_json(json.dumps(data)).collective is Collective.ALL_REDUCE


def test_version_2_needs_a_known_collective() -> None:
    data = json.loads(plan(load_topology("tpu-2d"), 2**20, "pipelined", num_chunks=2).to_json())
    data["collective"] = "all_to_all"
    with pytest.raises(ScheduleError, match="unknown collective 'all_to_all'"):
        Schedule.from_json(json.dumps(data))
    del data["collective"]
    with pytest.raises(ScheduleError, match='needs a "collective"'):
        Schedule.from_json(json.dumps(data))


@pytest.mark.parametrize("planner", ["ring", "hierarchical", "pipelined", "themis"])
@pytest.mark.parametrize("collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_baselines_plan_rs_and_ag(planner: str, collective: Collective) -> None:
    topo = load_topology(TWO_DIMS)
    schedule = plan(topo, 2**24, planner, num_chunks=4, collective=collective)
    allreduce = plan(topo, 2**24, planner, num_chunks=4)
    assert schedule.collective is collective
    assert {op.phase for op in schedule.ops} == {
        Phase.RS if collective is Collective.REDUCE_SCATTER else Phase.AG
    }
    assert schedule.makespan_s < allreduce.makespan_s
