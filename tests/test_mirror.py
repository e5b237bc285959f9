"""ReduceScatter and AllGather schedules read backwards in time (planners/hipipe/mirror.py)."""

import math
from dataclasses import replace

import pytest

from hipipe import Collective, plan
from hipipe.checker import check
from hipipe.overheads import Overheads
from hipipe.planners.hipipe.mirror import mirrored, mirrored_sequences
from hipipe.presets import PRESETS
from hipipe.simulator import simulate

MIB = 1024**2
ONE_PHASE = (Collective.REDUCE_SCATTER, Collective.ALL_GATHER)


@pytest.mark.parametrize("collective", ONE_PHASE)
@pytest.mark.parametrize(("preset", "num_chunks"), [("rfs-3d", 3), ("libra-4d", 4), ("tpu-2d", None)])
def test_a_mirrored_schedule_is_the_other_collective_proven_and_as_fast(
    collective: Collective, preset: str, num_chunks: int | None
) -> None:
    """Under alpha-beta both phases of an op cost the same: reading a schedule backwards
    keeps every op's duration, and the simulator can only start ops earlier."""
    for planner in ("hipipe", "themis", "pipelined"):
        schedule = plan(PRESETS[preset](), 16 * MIB, planner, num_chunks=num_chunks, collective=collective)
        reflected = mirrored(schedule)
        assert reflected.collective is not collective
        assert check(reflected).problems == ()
        assert reflected.chunks == schedule.chunks
        assert reflected.makespan_s <= schedule.makespan_s * (1 + 1e-12)
        # read backwards again, it is the schedule it came from
        assert mirrored_sequences(reflected) == schedule.sequences
        assert math.isclose(mirrored(reflected).makespan_s, schedule.makespan_s, rel_tol=1e-12)


def test_an_allreduce_has_no_mirror() -> None:
    schedule = plan(PRESETS["tpu-2d"](), 16 * MIB, "pipelined", num_chunks=2)
    with pytest.raises(ValueError, match="only ReduceScatter and AllGather"):
        mirrored_sequences(schedule)


@pytest.mark.parametrize(("preset", "size_mib"), [("rfs-3d", 64), ("rfs-3d", 256), ("libra-4d", 1024)])
def test_hipipe_plans_reduce_scatter_and_all_gather_equally_fast(preset: str, size_mib: int) -> None:
    """Before the mirror the search's plans differed: rfs-3d 64 MiB RS 0.2674 vs AG 0.2648 ms,
    256 MiB RS 0.9368 vs AG 0.9380 ms, libra-4d 1 GiB RS 2.555 vs AG 2.573 ms."""
    topology = PRESETS[preset]()
    rs = plan(topology, size_mib * MIB, "hipipe", collective=Collective.REDUCE_SCATTER)
    ag = plan(topology, size_mib * MIB, "hipipe", collective=Collective.ALL_GATHER)
    assert rs.makespan_s == pytest.approx(ag.makespan_s, rel=1e-9)
    kept = {rs.info["mirror"]["kept"], ag.info["mirror"]["kept"]}
    assert kept == {"direct", "mirrored"}  # on these three one direction's search wins
    for schedule in (rs, ag):
        record = schedule.info["mirror"]
        assert schedule.makespan_s == min(record["direct_makespan_s"], record["mirrored_makespan_s"])
        assert schedule.info["simulated_makespan_s"] == schedule.makespan_s
        assert check(schedule).problems == ()
        assert math.isclose(simulate(schedule).makespan_s, schedule.makespan_s, rel_tol=1e-12)
        assert all(
            schedule.makespan_s <= b * (1 + 1e-9) for b in schedule.info["baselines_makespan_s"].values()
        )


def test_with_a_reduction_cost_the_mirror_is_retimed_under_its_own_collective() -> None:
    """The local reduction is charged to ReduceScatter ops only: an AllGather plan read
    backwards as a ReduceScatter pays it, so its makespan comes from its own re-timing, and
    the planner keeps whichever direction is faster under the reduction cost."""
    base = PRESETS["rfs-3d"]()
    topology = replace(base, overheads=Overheads(memory_bytes_per_s=5e9))
    ag = plan(topology, 64 * MIB, "hipipe", collective=Collective.ALL_GATHER, num_chunks=3)
    as_rs = mirrored(ag)
    assert check(as_rs).problems == ()
    assert as_rs.makespan_s > ag.makespan_s  # the reductions cost time the gathers did not
    rs = plan(topology, 64 * MIB, "hipipe", collective=Collective.REDUCE_SCATTER, num_chunks=3)
    record = rs.info["mirror"]
    assert record["searched_as"] == "all_gather"
    assert rs.makespan_s == min(record["direct_makespan_s"], record["mirrored_makespan_s"])
    assert math.isclose(simulate(rs).makespan_s, rs.makespan_s, rel_tol=1e-12)


def test_ablations_do_not_search_the_mirror() -> None:
    schedule = plan(PRESETS["rfs-3d"](), 16 * MIB, "hipipe-uniform", collective=Collective.REDUCE_SCATTER)
    assert "mirror" not in schedule.info
