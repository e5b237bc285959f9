"""Hand-off delays (``Dimension.handoff_s``): simulator, LP, checker, YAML, and 0 = unchanged."""

import dataclasses
import hashlib

import pytest
import yaml

from hipipe.checker import check
from hipipe.errors import TopologyError
from hipipe.planners import plan
from hipipe.schedule import Chunk
from hipipe.simulator import Policy, simulate, simulate_chunks
from hipipe.topology import Algorithm, Dimension, Kind, Topology
from hipipe.topology_io import load_topology, topology_from_dict, topology_to_dict, topology_to_yaml


def _dim(handoff_s: float) -> Dimension:
    # fully connected, direct: op time = 1 * 0 + (2-1)/2 * S / 1e9 = S / 2e9 seconds.
    return Dimension(
        kind=Kind.FULLY_CONNECTED,
        size=2,
        bandwidth_bytes_per_s=1e9,
        latency_s=0.0,
        algorithm=Algorithm.DIRECT,
        handoff_s=handoff_s,
    )


TOPO = Topology(dims=(_dim(0.5), _dim(0.25)))
CHUNKS = (
    Chunk(index=0, size_bytes=4e9, order=((0,), (1,))),
    Chunk(index=1, size_bytes=4e9, order=((0,), (1,))),
)


def test_simulator_with_handoffs_by_hand() -> None:
    # Op times: RS/AG on dim 0 of 4e9 B: 2 s; RS/AG on dim 1 of 2e9 B: 1 s. h0 = 0.5, h1 = 0.25.
    # A = chunk 0, B = chunk 1, FIFO:
    #   dim 0: A.RS0 [0, 2]; B.RS0 [2, 4] at once (the hand-off does not hold dim 0)
    #   dim 1: A.RS1 ready 2 + 0.5 = 2.5 -> [2.5, 3.5]; A.AG1 ready 3.5 + 0.25 -> [3.75, 4.75]
    #   dim 1: B.RS1 ready 4 + 0.5 = 4.5, dim 1 busy until 4.75 -> [4.75, 5.75]
    #   dim 0: A.AG0 ready 4.75 + 0.25 = 5.0 -> [5, 7]
    #   dim 1: B.AG1 ready 5.75 + 0.25 = 6.0 -> [6, 7]
    #   dim 0: B.AG0 ready 7 + 0.25 = 7.25 -> [7.25, 9.25]; makespan 9.25 s
    schedule = simulate_chunks(TOPO, 8 * 10**9, CHUNKS, policy=Policy.FIFO)
    times = [(op.start_s, op.end_s) for op in schedule.ops]
    assert times == [
        (0.0, 2.0),
        (2.5, 3.5),
        (3.75, 4.75),
        (5.0, 7.0),
        (2.0, 4.0),
        (4.75, 5.75),
        (6.0, 7.0),
        (7.25, 9.25),
    ]
    assert schedule.makespan_s == 9.25
    assert simulate(schedule, policy=Policy.FIXED).makespan_s == 9.25
    assert simulate(schedule, policy=Policy.SCF).makespan_s == 9.25
    assert check(schedule).ok


def test_zero_handoff_is_the_plain_model() -> None:
    plain = Topology(dims=(_dim(0.0), _dim(0.0)))
    # Same chain without hand-offs: A.RS0 [0,2], A.RS1 [2,3], A.AG1 [3,4], B.RS0 [2,4],
    # B.RS1 [4,5], A.AG0 [4,6], B.AG1 [5,6], B.AG0 [6,8].
    assert simulate_chunks(plain, 8 * 10**9, CHUNKS).makespan_s == 8.0


def test_checker_rejects_a_successor_that_ignores_the_handoff() -> None:
    plain = Topology(dims=(_dim(0.0), _dim(0.0)))
    schedule = simulate_chunks(plain, 8 * 10**9, CHUNKS)
    assert check(schedule).ok
    report = check(dataclasses.replace(schedule, topology=TOPO))
    assert not report.ok
    assert any("hand-off" in problem for problem in report.problems)
    # Without the cost-model checks only the data dependency counts.
    assert check(dataclasses.replace(schedule, topology=TOPO), check_durations=False).ok


@pytest.mark.parametrize("preset", ["hgx-h100-32", "rfs-3d", "libra-4d"])
def test_lp_equals_simulator_with_handoffs(preset: str) -> None:
    base = load_topology(preset)
    topo = dataclasses.replace(
        base,
        dims=tuple(dataclasses.replace(d, handoff_s=(k + 1) * 3e-6) for k, d in enumerate(base.dims)),
    )
    message = 64 * 2**20
    schedule = plan(topo, message, "hipipe")  # raises if LP and simulator disagree
    lp_s = schedule.info["lp_makespan_s"]
    replay = simulate(schedule, policy=Policy.FIXED)
    assert replay.makespan_s == pytest.approx(lp_s, rel=1e-6)
    assert check(schedule).ok
    assert schedule.makespan_s > plan(base, message, "hipipe").makespan_s


def test_yaml_round_trip_and_validation() -> None:
    text = topology_to_yaml(TOPO)
    assert "handoff_s: 0.5" in text
    again = topology_from_dict(yaml.safe_load(text))
    assert again == TOPO
    entry = {"kind": "switch", "size": 4, "bandwidth": "10GB/s", "latency": "1us", "handoff": "1.5ms"}
    assert topology_from_dict({"dims": [entry]}).dims[0].handoff_s == pytest.approx(1.5e-3)
    assert "handoff" not in str(topology_to_dict(Topology(dims=(_dim(0.0),))))
    assert "hand-off 500 ms" in TOPO.describe()
    with pytest.raises(TopologyError, match="hand-off"):
        _dim(-1.0)
    with pytest.raises(TopologyError, match="hand-off"):
        _dim(float("nan"))


def test_zero_handoff_keeps_schedule_json_byte_identical() -> None:
    # Digest of this schedule's JSON before hand-off delays existed (commit 4cff6aa).
    schedule = plan(load_topology("libra-4d"), 3 * 2**20 + 7, "themis", num_chunks=5)
    digest = hashlib.sha256(schedule.to_json().encode()).hexdigest()
    assert digest == "8a6bce2296863c16fc298497be160c98016b8b2c5b07ed4b23dad2dcfdf95248"
    base = load_topology("rfs-3d")
    explicit = dataclasses.replace(base, dims=tuple(dataclasses.replace(d, handoff_s=0.0) for d in base.dims))
    first = dataclasses.replace(plan(base, 2**26, "hipipe"), info={})
    second = dataclasses.replace(plan(explicit, 2**26, "hipipe"), info={})
    assert first.to_json() == second.to_json()
