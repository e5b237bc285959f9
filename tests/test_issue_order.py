"""The global issue order of the CUDA path: a pure function of the schedule (no torch).

For every planner and collective, on generated topologies and on random chunkings with
random policies: the order is a permutation of the ops, respects chain and sequence
order, is the same on every "rank" (each holding its own copy of the schedule, parsed
from JSON), and follows the plan's timeline (planned starts never go backwards).
Contradictory sequences are refused in one line instead of deadlocking.
"""

import dataclasses
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipipe.errors import ScheduleError
from hipipe.issue_order import issue_order, predecessors, violations
from hipipe.planners import PLANNERS, plan
from hipipe.schedule import Chunk, Collective, Schedule
from hipipe.simulator import Policy, simulate_chunks
from hipipe.topology import Dimension, Kind, Topology
from hipipe.topology_io import load_topology

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

topologies = st.lists(
    st.builds(
        lambda kind, size, bandwidth: Dimension.make(kind, size, bandwidth_gbps=bandwidth, latency_ns=1000.0),
        st.sampled_from(list(Kind)),
        st.integers(min_value=2, max_value=6),
        st.floats(min_value=1, max_value=400),
    ),
    min_size=1,
    max_size=4,
).map(lambda dims: Topology(dims=tuple(dims)))


def assert_valid_everywhere(schedule: Schedule, ranks: int = 3) -> tuple[int, ...]:
    """Each rank computes the order from its own parsed copy; all must agree and be valid."""
    orders = {issue_order(Schedule.from_json(schedule.to_json())) for _ in range(ranks)}
    assert len(orders) == 1, "ranks disagree on the issue order"
    order = orders.pop()
    assert order == issue_order(schedule)
    assert list(violations(schedule, order)) == []
    starts = [schedule.ops[i].start_s for i in order]
    assert all(a <= b for a, b in itertools.pairwise(starts)), "the order goes back in planned time"
    return order


def random_chunks(topology: Topology, message_bytes: int, seed: int) -> list[Chunk]:
    """Uneven chunks (some empty), random orders mixing single dims and groups of dims."""
    rng = random.Random(seed)
    chunks = []
    for j in range(rng.randint(1, 12)):
        dims = list(range(topology.num_dims))
        rng.shuffle(dims)
        cuts = sorted(rng.sample(range(1, len(dims)), rng.randint(0, len(dims) - 1))) if len(dims) > 1 else []
        groups = [tuple(sorted(dims[a:b])) for a, b in itertools.pairwise([0, *cuts, len(dims)])]
        size = 0.0 if rng.random() < 0.2 else rng.random() * message_bytes
        chunks.append(Chunk(index=j, size_bytes=size, order=tuple(groups)))
    return chunks


@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_every_planner_and_collective(planner: str, collective: Collective) -> None:
    for spec in ("ring:2:4GB/s:1us,ring:2:2GB/s:1us,switch:2:1GB/s:1us", "ring:2:4GB/s:1us,ring:4:1GB/s:1us"):
        schedule = plan(load_topology(spec), 3 << 20, planner, collective=collective)
        order = assert_valid_everywhere(schedule)
        assert len(order) == len(schedule.ops)


@SETTINGS
@given(
    topology=topologies,
    seed=st.integers(min_value=0, max_value=10**6),
    collective=st.sampled_from(list(Collective)),
    policy=st.sampled_from([Policy.FIFO, Policy.SCF]),
)
def test_random_schedules(topology: Topology, seed: int, collective: Collective, policy: Policy) -> None:
    message_bytes = 1 << 20
    schedule = simulate_chunks(
        topology,
        message_bytes,
        random_chunks(topology, message_bytes, seed),
        policy=policy,
        collective=collective,
    )
    assert_valid_everywhere(schedule)


def test_ties_in_planned_start_go_by_op_index() -> None:
    topology = load_topology("ring:2:1GB/s:1us,ring:2:1GB/s:1us")
    chunks = [Chunk(index=j, size_bytes=0.0, order=((0,), (1,))) for j in range(3)]
    schedule = simulate_chunks(topology, 1024, chunks)
    flat = dataclasses.replace(
        schedule, ops=tuple(dataclasses.replace(op, start_s=0.0) for op in schedule.ops)
    )
    order = issue_order(flat)
    assert list(violations(flat, order)) == []
    # Every op starts at 0: among the ready ops the lowest index goes first.
    assert order[0] == 0
    ready_first = [i for i in range(len(flat.ops)) if not predecessors(flat)[i]]
    assert order[: len(ready_first)] == tuple(sorted(ready_first))


def test_contradictory_sequences_are_refused() -> None:
    schedule = plan(load_topology("ring:2:1GB/s:1us,ring:2:1GB/s:1us"), 1 << 16, "pipelined", num_chunks=3)
    reversed_dim0 = dataclasses.replace(
        schedule, sequences=(schedule.sequences[0][::-1], *schedule.sequences[1:])
    )
    with pytest.raises(ScheduleError, match="would deadlock"):
        issue_order(reversed_dim0)


def test_violations_name_what_is_wrong() -> None:
    schedule = plan(load_topology("ring:2:1GB/s:1us,ring:2:1GB/s:1us"), 1 << 16, "pipelined", num_chunks=2)
    order = issue_order(schedule)
    assert list(violations(schedule, order[1:])) == ["the order is not a permutation of the ops"]
    swapped = (order[1], order[0], *order[2:])
    assert any("must precede it" in v for v in violations(schedule, swapped))
