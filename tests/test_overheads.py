"""Calibrated overheads: every consumer charges the same terms (docs/MODEL.md section 10)."""

import random
from dataclasses import replace
from typing import Any

import pytest

from hipipe.checker import check
from hipipe.cost import op_time_s
from hipipe.errors import HipipeError, TopologyError
from hipipe.overheads import OpCurve, Overheads
from hipipe.planners import plan
from hipipe.planners.hipipe import sequence_mip
from hipipe.planners.hipipe.candidates import SearchLog
from hipipe.predict import other_dims_busy, predict, replay_op_times_s
from hipipe.presets import PRESETS
from hipipe.schedule import Collective, Phase, Schedule, schedule_to_dict
from hipipe.topology_io import topology_from_dict, topology_to_dict

MIB = 1 << 20
LINEAR = Overheads(op_s=2e-6, handoff_s=3e-6, memory_bytes_per_s=40e9)


def _tpu(overheads: Overheads) -> object:
    return replace(PRESETS["tpu-2d"](), overheads=overheads)


def test_overheads_are_validated_and_round_trip() -> None:
    with pytest.raises(TopologyError, match="op_s must be finite and >= 0"):
        Overheads(op_s=-1.0)
    with pytest.raises(TopologyError, match="unknown overheads bogus"):
        Overheads.from_dict({"bogus": 1})
    topology = _tpu(LINEAR)
    data = topology_to_dict(topology)
    assert data["overheads"]["handoff_s"] == 3e-6
    assert topology_from_dict(data) == topology
    assert "overheads" not in topology_to_dict(PRESETS["tpu-2d"]())  # plain files stay plain


def test_reduce_scatter_pays_its_local_reduction_and_every_op_its_fixed_cost() -> None:
    plain, calibrated = PRESETS["tpu-2d"](), _tpu(LINEAR)
    n, size = plain.dims[0].size, 8 * MIB
    reduction_s = 3 * (n - 1) / n * size / 40e9
    rs_extra = op_time_s(calibrated, (0,), size, Phase.RS) - op_time_s(plain, (0,), size, Phase.RS)
    ag_extra = op_time_s(calibrated, (0,), size, Phase.AG) - op_time_s(plain, (0,), size, Phase.AG)
    assert rs_extra == pytest.approx(2e-6 + reduction_s, rel=1e-12)
    assert ag_extra == pytest.approx(2e-6, rel=1e-12)


@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("planner", ["hipipe", "themis", "pipelined", "hierarchical"])
def test_linear_overheads_plan_check_and_cost_time(planner: str, collective: Collective) -> None:
    plain = plan(PRESETS["tpu-2d"](), 64 * MIB, planner, collective=collective)
    schedule = plan(_tpu(LINEAR), 64 * MIB, planner, collective=collective)  # hipipe: LP == simulator
    assert check(schedule).ok
    assert schedule.makespan_s > plain.makespan_s
    for op in schedule.chunk_ops(0)[1:]:
        before = schedule.ops[op.index - 1]
        if op.dims != before.dims:
            assert op.start_s >= before.end_s + 3e-6 * (1 - 1e-9)
    assert predict(schedule).median_s == schedule.makespan_s  # linear: nothing to sample


def test_checker_rejects_a_skipped_handoff() -> None:
    schedule = plan(PRESETS["tpu-2d"](), 64 * MIB, "hierarchical")
    with_handoff = replace(schedule, topology=_tpu(Overheads(handoff_s=1e-3)))
    result = check(with_handoff)
    assert not result.ok
    assert any("hand-off" in problem for problem in result.problems)


def test_prediction_matches_the_simulator_without_non_linear_terms_and_grows_with_them() -> None:
    schedule = plan(_tpu(LINEAR), 64 * MIB, "themis")
    tiny = replace(schedule, topology=_tpu(replace(LINEAR, concurrency_slowdown=1e-12)))
    assert predict(tiny).median_s == pytest.approx(schedule.makespan_s, rel=1e-9)
    slowed = replace(schedule, topology=_tpu(replace(LINEAR, concurrency_slowdown=0.2)))
    assert predict(slowed).median_s > schedule.makespan_s * 1.02
    noisy: Schedule = replace(schedule, topology=_tpu(replace(LINEAR, jitter_s=3e-6)))
    first, second = predict(noisy, seed=1), predict(noisy, seed=1)
    assert first == second  # seeded: the same prediction every time
    assert first.low_s < first.median_s < first.high_s
    starts, ends = replay_op_times_s(noisy, random.Random(0))
    assert all(e > s for s, e in zip(starts, ends, strict=True))


def test_hipipe_picks_the_chunk_count_the_full_model_predicts_fastest() -> None:
    topology = _tpu(replace(LINEAR, op_s=2e-5, concurrency_slowdown=0.3, jitter_s=2e-6))
    schedule = plan(topology, 64 * MIB, "hipipe")
    retimed = schedule.info["retimed"]
    assert len(retimed) >= 2
    best = min(r["predicted_s"] for r in retimed)
    assert predict(schedule).median_s == pytest.approx(best, rel=1e-12)
    assert schedule.num_chunks == min(retimed, key=lambda r: r["predicted_s"])["num_chunks"]
    assert check(schedule).ok


def test_exact_refuses_terms_it_does_not_model() -> None:
    with pytest.raises(HipipeError, match="exact planner models latency, bandwidth and a per-op cost only"):
        plan(_tpu(Overheads(handoff_s=1e-6)), 16 * MIB, "exact", num_chunks=2)
    assert check(plan(_tpu(Overheads(op_s=1e-6)), 16 * MIB, "exact", num_chunks=2)).ok


def _line_s(full_bytes: float) -> float:
    return 1e-3 + full_bytes * 1e-8


def test_an_op_curve_interpolates_and_follows_the_wire_beyond_its_points() -> None:
    curve = OpCurve(dim=0, phase="RS", points=((4000.0, 0.020), (1000.0, 0.010)))  # sorted on the way in
    assert curve.points == ((1000.0, 0.010), (4000.0, 0.020))
    assert curve.time_s(2500, _line_s) == pytest.approx(0.015)
    assert curve.time_s(500, _line_s) == pytest.approx(0.010 * _line_s(500) / _line_s(1000))
    assert curve.time_s(7000, _line_s) == pytest.approx(0.030)  # the last segment's slope, not the line's
    alone = OpCurve(dim=0, phase="AG", points=((1000.0, 0.010),))
    assert alone.time_s(3000, _line_s) == pytest.approx(0.010 + _line_s(3000) - _line_s(1000))
    for bad in ({"dim": 0, "phase": "XX", "points": [[1, 1]]}, {"dim": 0, "phase": "RS", "points": [[0, 1]]}):
        with pytest.raises(TopologyError, match="op curve"):
            OpCurve.from_dict(bad)
    with pytest.raises(TopologyError, match="two curves for one dim and phase"):
        Overheads(op_curves=(curve, replace(curve, points=((9.0, 1.0),))))


def test_op_curves_round_trip_and_make_the_model_non_linear() -> None:
    curves = (OpCurve(dim=0, phase="RS", points=((1e6, 0.01), (4e6, 0.03))),)
    topology = _tpu(Overheads(op_curves=curves))
    assert topology_from_dict(topology_to_dict(topology)) == topology
    assert not topology.overheads.is_linear and not topology.overheads.is_zero
    assert "streamed op times" in topology.overheads.describe()


def test_single_dim_ops_take_their_curve_time_and_jitter_is_centred_on_it() -> None:
    plain = plan(PRESETS["tpu-2d"](), 64 * MIB, "hierarchical")
    rs_ops = [op for op in plain.ops if op.phase is Phase.RS]
    # every RS op takes 10x its line time; AG ops keep their line (no curve)
    curves = tuple(
        OpCurve(
            dim=k,
            phase="RS",
            points=tuple((b, 10 * op_time_s(plain.topology, (k,), b)) for b in (1.0, 2.0**40)),
        )
        for k in {op.dims[0] for op in rs_ops}
    )
    on_curves = replace(plain, topology=_tpu(Overheads(op_curves=curves)))
    starts, ends = replay_op_times_s(on_curves, random.Random(0))
    for op in plain.ops:
        line_s = op_time_s(plain.topology, op.dims, op.full_bytes)
        expected = 10 * line_s if op.phase is Phase.RS else line_s
        assert ends[op.index] - starts[op.index] == pytest.approx(expected, rel=1e-9)
    jittery = replace(plain, topology=_tpu(Overheads(op_curves=curves, jitter_s=1e-5)))
    many = [replay_op_times_s(jittery, random.Random(seed)) for seed in range(400)]
    first_rs = rs_ops[0].index
    mean_s = sum(e[first_rs] - s[first_rs] for s, e in many) / len(many)
    curve_s = ends[first_rs] - starts[first_rs]
    assert mean_s == pytest.approx(curve_s, rel=0.02)  # the curve is already the mean


def test_a_busy_curve_charges_its_share_of_the_other_dims_that_are_busy() -> None:
    schedule = plan(PRESETS["tpu-2d"](), 64 * MIB, "pipelined", num_chunks=8)

    def flat(seconds: float, *, busy: bool) -> tuple[OpCurve, ...]:
        return tuple(
            OpCurve(dim=k, phase=p, points=((1.0, seconds), (2.0**40, seconds)), busy=busy)
            for k in (0, 1)
            for p in ("RS", "AG")
        )

    alone = replace(schedule, topology=_tpu(Overheads(op_curves=flat(1e-3, busy=False))))
    both = replace(
        schedule, topology=_tpu(Overheads(op_curves=flat(1e-3, busy=False) + flat(3e-3, busy=True)))
    )
    starts, ends = replay_op_times_s(alone, random.Random(0))
    assert all(e - s == pytest.approx(1e-3) for s, e in zip(starts, ends, strict=True))
    starts, ends = replay_op_times_s(both, random.Random(0))
    times = list(zip(starts, ends, strict=True))
    # two dims: an op during which the other dim moved data takes the busy time, else the alone time
    for op in schedule.ops:
        overlapped = other_dims_busy(schedule, times, op.index) == 1
        assert ends[op.index] - starts[op.index] == pytest.approx(3e-3 if overlapped else 1e-3)
    assert {round(e - s, 9) for s, e in times} == {1e-3, 3e-3}
    assert predict(both).median_s > predict(alone).median_s


def test_an_op_is_stretched_when_another_dim_starts_while_it_runs() -> None:
    """Not only the dims busy at its start: ops another dim starts during an op slow it too
    (on the testbed a pipelined RS on the slow dim took 1.17x its curve while the fast dim's
    ops came and went during it, and 1.0x with the fast dim idle)."""
    schedule = plan(PRESETS["tpu-2d"](), 64 * MIB, "pipelined", num_chunks=2)
    curves = tuple(
        OpCurve(dim=k, phase=p, points=((1.0, seconds), (2.0**40, seconds)), busy=flag)
        for seconds, flag in ((10e-3, False), (14e-3, True))
        for k in (0, 1)
        for p in ("RS", "AG")
    )
    # a 0.5 ms hand-off: a chunk's next op starts after the other chunk's op on that dim has
    on_curves = replace(schedule, topology=_tpu(Overheads(op_curves=curves, handoff_s=5e-4)))
    starts, ends = replay_op_times_s(on_curves, random.Random(0))
    times = list(zip(starts, ends, strict=True))

    def idle_at_start_busy_later(index: int) -> bool:
        dims = schedule.ops[index].dims
        others = [j for k, seq in enumerate(schedule.sequences) if k not in dims for j in seq]
        return not any(starts[j] <= starts[index] < ends[j] for j in others) and any(
            starts[index] < starts[j] < ends[index] for j in others
        )

    stretched = [op.index for op in schedule.ops if idle_at_start_busy_later(op.index)]
    assert stretched  # the second chunk's first op starts alone; the first chunk's hand-off follows
    assert all(ends[i] - starts[i] == pytest.approx(14e-3) for i in stretched)
    alone = [op.index for op in schedule.ops if other_dims_busy(schedule, times, op.index) == 0]
    assert alone and all(ends[i] - starts[i] == pytest.approx(10e-3) for i in alone)


@pytest.mark.parametrize("collective", [Collective.ALL_REDUCE, Collective.REDUCE_SCATTER])
def test_the_plans_a_re_timed_plan_makes_share_their_sequence_mips(
    monkeypatch: pytest.MonkeyPatch, collective: Collective
) -> None:
    """Re-timing plans the best few K again, and those searches meet many of the same
    sequence MIPs: each is solved once per plan, and the plan is the one that solving
    every MIP afresh in each search gives."""
    topology = _tpu(replace(LINEAR, op_s=2e-5, concurrency_slowdown=0.3, jitter_s=2e-6))
    solve, solved = sequence_mip._solve, sequence_mip._solved
    inputs: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        start = kwargs["start"]
        start_key = None if start is None else (start[0], start[1].tolist())
        inputs.append(
            repr((args[1:], kwargs["collective"], kwargs["incumbent_s"], start_key, kwargs["max_nodes"]))
        )
        return solve(*args, **kwargs)

    monkeypatch.setattr(sequence_mip, "_solve", counted)
    shared = plan(topology, 64 * MIB, "hipipe", collective=collective)
    assert len(shared.info["retimed"]) >= 2
    assert inputs and len(set(inputs)) == len(inputs)
    once = len(inputs)

    def afresh(*args: Any, log: SearchLog, **kwargs: Any) -> Any:
        log.solved_mips.clear()  # every search solves its MIPs itself, as if nothing were shared
        return solved(*args, log=log, **kwargs)

    inputs.clear()
    monkeypatch.setattr(sequence_mip, "_solved", afresh)
    alone = plan(topology, 64 * MIB, "hipipe", collective=collective)
    assert len(inputs) > once
    assert schedule_to_dict(alone) == schedule_to_dict(shared)
