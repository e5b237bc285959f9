"""Properties every planner must have, on generated topologies and message sizes.

The planners are read from the registry (``hipipe.planners.PLANNERS``), so a planner
registered later is covered without touching this file. For each generated case:

- the checker proves the schedule is an AllReduce (symbolically when N <= 64);
- its makespan is never below the physical limit ``T*`` (docs/MODEL.md section 4);
- the simulator replaying its sequences (fixed policy) reproduces the makespan;
- the simulator is deterministic, and its re-queued schedules are AllReduces too;
- the JSON form round-trips byte for byte, to an equal schedule.

And the checker is not a rubber stamp: breaking any op of any planner's schedule is caught.
"""

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from hipipe.checker import check
from hipipe.cost import lower_bound_s
from hipipe.errors import SolverError
from hipipe.planners import PLANNERS, plan
from hipipe.schedule import Schedule
from hipipe.simulator import Policy, simulate
from hipipe.topology import Algorithm, Dimension, Kind, Topology

REL_TOL = 1e-9
MAX_MESSAGE_BYTES = 64 * 2**30

PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def dimensions(draw: st.DrawFn) -> Dimension:
    kind = draw(st.sampled_from(list(Kind)))
    size = draw(st.integers(min_value=2, max_value=8))
    algorithms = [Algorithm.RING, Algorithm.DIRECT]
    if size & (size - 1) == 0:
        algorithms.append(Algorithm.HALVING_DOUBLING)
    return Dimension.make(
        kind,
        size,
        bandwidth_gbps=draw(st.floats(min_value=1, max_value=500)),
        latency_ns=draw(st.floats(min_value=0, max_value=5000)),
        algorithm=draw(st.sampled_from(algorithms)),
    )


topologies = st.lists(dimensions(), min_size=1, max_size=4).map(lambda dims: Topology(dims=tuple(dims)))

message_sizes = st.one_of(
    st.sampled_from([1, MAX_MESSAGE_BYTES]),
    st.floats(min_value=0, max_value=36).map(lambda exponent: max(1, round(2**exponent))),
)

chunk_counts = st.one_of(st.none(), st.integers(min_value=1, max_value=16))


def rel_close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def plan_or_reject(topology: Topology, message_bytes: int, planner: str, num_chunks: int | None) -> Schedule:
    """A plan for the tests of other components; a planner failure is the business of
    :func:`test_planner_properties`, which reports it under the planner's name."""
    try:
        return plan(topology, message_bytes, planner, num_chunks=num_chunks)
    except SolverError:
        assume(False)
        raise


def zero_latency_rings(*bandwidths_gbps: float) -> Topology:
    return Topology(dims=tuple(Dimension.make("ring", 2, gbps, 0) for gbps in bandwidths_gbps))


# Found by this test: the chunk-size LP of the hipipe planners ended with HiGHS status
# "Not Set" on these zero-latency networks (any message size).
ZERO_LATENCY_4D = zero_latency_rings(1, 1, 35, 1)
ZERO_LATENCY_2D = Topology(
    dims=(Dimension.make("ring", 3, 105, 0), Dimension.make("ring", 2, 1, 0)),
)


@pytest.mark.parametrize(
    "planner",
    # hipipe's draws take 30-110 s: marked slow so that make test starts it early
    [
        pytest.param(name, marks=[pytest.mark.slow, pytest.mark.one_process]) if name == "hipipe" else name
        for name in PLANNERS
    ],
)
@PROPERTY_SETTINGS
@given(topology=topologies, message_bytes=message_sizes, num_chunks=chunk_counts)
@example(topology=ZERO_LATENCY_4D, message_bytes=2**20, num_chunks=None)
@example(topology=ZERO_LATENCY_2D, message_bytes=1, num_chunks=None)
def test_planner_properties(
    planner: str, topology: Topology, message_bytes: int, num_chunks: int | None
) -> None:
    schedule = plan(topology, message_bytes, planner, num_chunks=num_chunks)

    report = check(schedule)
    assert report.problems == ()
    assert report.method == ("symbolic" if topology.num_npus <= 64 else "structural")

    floor_s = lower_bound_s(topology, message_bytes)
    assert schedule.makespan_s >= floor_s * (1 - REL_TOL), (
        f"{planner} claims {schedule.makespan_s!r} s, below the lower bound {floor_s!r} s"
    )

    replayed = simulate(schedule)
    assert rel_close(replayed.makespan_s, schedule.makespan_s), (
        f"fixed-policy replay gives {replayed.makespan_s!r} s, the planner said {schedule.makespan_s!r} s"
    )

    text = schedule.to_json()
    loaded = Schedule.from_json(text)
    assert loaded.to_json() == text
    assert loaded == schedule


@PROPERTY_SETTINGS
@given(
    topology=topologies,
    message_bytes=message_sizes,
    num_chunks=chunk_counts,
    planner=st.sampled_from(list(PLANNERS)),
    policy=st.sampled_from(list(Policy)),
)
def test_simulator_is_deterministic(
    topology: Topology, message_bytes: int, num_chunks: int | None, planner: str, policy: Policy
) -> None:
    schedule = plan_or_reject(topology, message_bytes, planner, num_chunks)
    first, second = simulate(schedule, policy=policy), simulate(schedule, policy=policy)
    assert first == second
    assert first.to_json() == second.to_json()
    # Re-queueing the chunks (fifo, scf) gives another schedule, which must be an AllReduce too.
    assert check(first).problems == ()


@PROPERTY_SETTINGS
@given(
    topology=topologies,
    message_bytes=message_sizes,
    planner=st.sampled_from(list(PLANNERS)),
    data=st.data(),
)
def test_checker_catches_an_op_started_early(
    topology: Topology, message_bytes: int, planner: str, data: st.DataObject
) -> None:
    schedule = plan_or_reject(topology, message_bytes, planner, 4)
    index = data.draw(st.integers(min_value=0, max_value=len(schedule.ops) - 1), label="op")
    op = schedule.ops[index]
    if op.step == 0:
        index, op = index + 1, schedule.ops[index + 1]
    before = schedule.ops[index - 1]
    assume(before.duration_s > REL_TOL * schedule.makespan_s)  # a zero-length op cannot be overtaken
    # Start the op together with its predecessor: it reads an input that does not exist yet.
    moved = dataclasses.replace(op, start_s=before.start_s, end_s=before.start_s + op.duration_s)
    ops = (*schedule.ops[:index], moved, *schedule.ops[index + 1 :])
    report = check(dataclasses.replace(schedule, ops=ops))
    assert not report.ok
    assert any(
        f"chunk {op.chunk}, op {op.index} " in problem and "before its input exists" in problem
        for problem in report.problems
    ), report.problems


@PROPERTY_SETTINGS
@given(
    topology=topologies,
    planner=st.sampled_from(list(PLANNERS)),
    data=st.data(),
)
def test_checker_catches_an_op_left_out_of_a_sequence(
    topology: Topology, planner: str, data: st.DataObject
) -> None:
    schedule = plan_or_reject(topology, 2**20, planner, 4)
    op = schedule.ops[data.draw(st.integers(min_value=0, max_value=len(schedule.ops) - 1), label="op")]
    dim = op.dims[0]
    sequences = list(schedule.sequences)
    sequences[dim] = tuple(i for i in sequences[dim] if i != op.index)
    report = check(dataclasses.replace(schedule, sequences=tuple(sequences)))
    assert any(
        problem.startswith(f"dim {dim}'s sequence lacks chunk {op.chunk}, op {op.index} ")
        for problem in report.problems
    ), report.problems
