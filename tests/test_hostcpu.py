"""The host's CPU as a bound on a run (docs/MODEL.md section 10, "The host's CPU").

Pure and torch-free: reading ``/proc/stat``, fitting the per-step and per-byte CPU from
calibration samples, the bound itself, and what it does to a prediction and a plan.
"""

import os
import random
from dataclasses import replace
from pathlib import Path

import pytest

from hipipe.cli.calibrate import _yaml as calibrate_yaml
from hipipe.cost import group_size
from hipipe.errors import TopologyError
from hipipe.hostcpu import busy_cpu_s, reading_cpu, timed_readings
from hipipe.overheads import Overheads
from hipipe.planners import plan
from hipipe.predict import cpu_bound_s, predict
from hipipe.presets import PRESETS
from hipipe.testbed.fit import (
    OverheadRun,
    Sample,
    calibration_from_samples,
    fit_all,
    fit_host_cpu,
    host_cores_of,
    overhead_schedule,
    refit_on_run,
    retime,
    run_busy_cores,
)
from hipipe.testbed.layout import TestbedError
from hipipe.topology_io import topology_from_dict, topology_to_dict

MIB = 1 << 20
STEP_S, BYTE_S, RANKS = 5e-4, 6e-9, 8


def test_busy_time_is_read_from_proc_stat_and_nothing_is_made_up(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal: busy = user + nice + system + irq + softirq
    stat.write_text("cpu  100 20 30 5000 7 3 4 9 0 0\ncpu0 50 10 15 2500 3 1 2 4 0 0\n")
    assert busy_cpu_s(stat) == pytest.approx(157 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("intr 1 2 3\n")
    assert busy_cpu_s(stat) is None
    assert busy_cpu_s(tmp_path / "missing") is None


def test_each_run_reads_the_cpu_around_itself_and_a_missed_read_drops_them_all() -> None:
    readings: list[float | None] = []
    calls = iter(range(1, 4))
    run = reading_cpu(lambda: next(calls), readings)
    assert [run(), run(), run()] == [1, 2, 3]
    assert len(readings) == 3 and all(r is not None and r >= 0 for r in readings)
    assert timed_readings(readings, warmup=1) == tuple(readings[1:])
    assert timed_readings([0.5, None, 0.7], warmup=0) == ()  # one run unread: no CPU for the row
    assert timed_readings([None, 0.6, 0.7], warmup=1) == (0.6, 0.7)  # the warm-up's does not count


def _samples(rng: random.Random, *, noise: float) -> list[Sample]:
    """Isolated streamed samples of a 2x4 host whose ranks spend STEP_S per step and BYTE_S per byte sent."""
    samples = []
    for dim, n in enumerate((2, 4)):
        for full_bytes in (32 << 10, 256 << 10, 2 << 20, 8 << 20):
            rank_cpu_s = (n - 1) * STEP_S + (n - 1) / n * full_bytes * BYTE_S
            for phase in ("RS", "AG"):
                samples.append(
                    Sample(
                        dim=dim,
                        phase=phase,
                        full_bytes=full_bytes,
                        time_s=0.001 + full_bytes * 1e-8,
                        host_cpu_s=RANKS * rank_cpu_s * (1 + rng.uniform(-noise, noise)),
                    )
                )
    return samples


def test_per_step_and_per_byte_cpu_are_recovered_from_the_samples() -> None:
    samples = _samples(random.Random(3), noise=0.03)
    fits = fit_all([2, 4], samples)
    fit = fit_host_cpu(fits, samples, host_ranks=RANKS)
    assert fit is not None
    assert fit.cpu_step_s == pytest.approx(STEP_S, rel=0.05)
    assert fit.cpu_byte_s == pytest.approx(BYTE_S, rel=0.05)
    assert fit.max_relative_residual < 0.07
    assert fit.num_samples == len(samples)
    exact = fit_host_cpu(fits, _samples(random.Random(3), noise=0.0), host_ranks=RANKS)
    assert exact is not None
    assert (exact.cpu_step_s, exact.cpu_byte_s) == pytest.approx((STEP_S, BYTE_S), rel=1e-9)
    # Nothing measured, or no ranks to share it: no term.
    assert fit_host_cpu(fits, [replace(s, host_cpu_s=None) for s in samples], host_ranks=RANKS) is None
    assert fit_host_cpu(fits, samples, host_ranks=0) is None
    # The CPU of a concurrent run is every dim's at once: it is not a sample of one op.
    doubled = [replace(s, concurrent=True, host_cpu_s=2 * (s.host_cpu_s or 0)) for s in samples]
    again = fit_host_cpu(fits, samples + doubled, host_ranks=RANKS)
    assert again is not None and again.cpu_step_s == fit.cpu_step_s


def test_a_negative_coefficient_is_dropped_and_the_other_refitted() -> None:
    # CPU that only grows with bytes, and shrinks slightly with steps: no negative step cost.
    samples = [
        Sample(
            dim=dim,
            phase="RS",
            full_bytes=b,
            time_s=0.001 + b * 1e-8,
            host_cpu_s=RANKS * ((n - 1) / n * b * BYTE_S) * (1.2 if n == 2 else 1.0),
        )
        for dim, n in enumerate((2, 4))
        for b in (64 << 10, 1 << 20, 8 << 20)
    ]
    fit = fit_host_cpu(fit_all([2, 4], samples), samples, host_ranks=RANKS)
    assert fit is not None
    assert fit.cpu_step_s == 0.0
    assert fit.cpu_byte_s > 0


def test_the_host_cores_charged_are_the_most_the_concurrent_pass_kept_busy() -> None:
    isolated = _samples(random.Random(1), noise=0.0)
    busy = [
        replace(s, concurrent=True, host_busy_cores=c)
        for s, c in zip(isolated, (1.7, 1.92, 1.85), strict=False)
    ]
    assert host_cores_of(isolated + busy, usable_cores=2) == 1.92
    fit = fit_host_cpu(fit_all([2, 4], isolated), isolated + busy, host_ranks=RANKS)
    assert fit is not None and fit.busy_cores == 1.92  # reported beside the fit
    assert host_cores_of(isolated, usable_cores=2) == 2.0  # not measured: every usable CPU
    assert host_cores_of([replace(busy[0], host_busy_cores=3.5)], usable_cores=2) == 2.0


def _host(**terms: float) -> Overheads:
    return Overheads(host_cores=2, host_ranks=RANKS, **terms)


def test_host_terms_are_validated_round_trip_and_make_the_model_non_linear() -> None:
    with pytest.raises(TopologyError, match="host_cores must be finite and >= 0"):
        Overheads(host_cores=-1)
    topology = replace(PRESETS["tpu-2d"](), overheads=_host(cpu_step_s=STEP_S, cpu_byte_s=BYTE_S))
    assert topology_from_dict(topology_to_dict(topology)) == topology
    assert topology.overheads.charges_cpu and not topology.overheads.is_linear
    assert "8 ranks on 2 CPUs" in topology.overheads.describe()
    assert not _host().charges_cpu  # no CPU per op: nothing to charge
    assert not Overheads(cpu_step_s=STEP_S).charges_cpu  # no host to charge it on


def test_the_cpu_bound_sums_every_op_of_every_rank_over_the_cores() -> None:
    topology = replace(PRESETS["tpu-2d"](), overheads=_host(cpu_step_s=STEP_S, cpu_byte_s=BYTE_S))
    schedule = plan(topology, 64 * MIB, "themis")
    by_hand = 0.0
    for op in schedule.ops:
        n = group_size(topology, op.dims)
        by_hand += (n - 1) * STEP_S + (n - 1) / n * op.full_bytes * BYTE_S
    assert cpu_bound_s(schedule) == pytest.approx(RANKS * by_hand / 2, rel=1e-12)
    assert cpu_bound_s(plan(PRESETS["tpu-2d"](), 64 * MIB, "themis")) == 0.0


def test_a_prediction_is_the_cpu_bound_when_the_host_is_the_bottleneck_and_the_wire_otherwise() -> None:
    plain = plan(PRESETS["tpu-2d"](), 64 * MIB, "themis")
    light = replace(plain, topology=replace(plain.topology, overheads=_host(cpu_step_s=1e-12)))
    assert predict(light).median_s == pytest.approx(plain.makespan_s, rel=1e-12)
    heavy = replace(plain, topology=replace(plain.topology, overheads=_host(cpu_step_s=1e-3)))
    assert cpu_bound_s(heavy) > plain.makespan_s
    assert predict(heavy).median_s == cpu_bound_s(heavy)


def test_hipipe_keeps_fewer_chunks_when_every_op_costs_the_host_dearly() -> None:
    wire_only = plan(PRESETS["tpu-2d"](), 64 * MIB, "hipipe")
    assert wire_only.num_chunks > 1
    topology = replace(PRESETS["tpu-2d"](), overheads=_host(cpu_step_s=1e-3))
    schedule = plan(topology, 64 * MIB, "hipipe")
    retimed = schedule.info["retimed"]
    assert schedule.num_chunks == min(retimed, key=lambda r: r["predicted_s"])["num_chunks"]
    assert schedule.num_chunks < wire_only.num_chunks
    assert predict(schedule).median_s == pytest.approx(cpu_bound_s(schedule), rel=1e-12)


def test_a_calibration_charges_the_host_first_and_the_per_op_cost_only_what_it_leaves() -> None:
    samples = _samples(random.Random(5), noise=0.0)
    fits = fit_all([2, 4], samples)
    schedule = overhead_schedule(fits, 8 << 20)
    with_host = calibration_from_samples([2, 4], samples, host_ranks=RANKS, host_cores=2)
    cpu_s = cpu_bound_s(retime(schedule, with_host.topology()))
    assert cpu_s > schedule.makespan_s  # this host is the bottleneck of the 32-chunk run
    run = OverheadRun(schedule=schedule, times_s=(cpu_s,))
    calibration = calibration_from_samples([2, 4], samples, overhead=run, host_ranks=RANKS, host_cores=2)
    assert calibration.overheads.cpu_step_s == pytest.approx(STEP_S, rel=1e-9)
    assert calibration.overheads.op_s == 0.0  # the CPU bound explains the run: nothing per op is left
    assert calibration.to_dict()["host_cpu"]["num_samples"] == len(samples)
    without = calibration_from_samples([2, 4], samples, overhead=run)
    assert not without.overheads.charges_cpu
    assert without.overheads.op_s > 0  # the same run, read as a cost of every op


def test_the_host_term_is_scaled_to_the_cpu_the_overhead_run_spent() -> None:
    samples = _samples(random.Random(5), noise=0.0)
    fits = fit_all([2, 4], samples)
    schedule = overhead_schedule(fits, 8 << 20)
    isolated = calibration_from_samples([2, 4], samples, host_ranks=RANKS, host_cores=2)
    work_s = cpu_bound_s(retime(schedule, isolated.topology())) * 2  # the samples' CPU seconds per run
    # The run spent 1.5x that CPU, keeping both CPUs busy (the samples had no concurrent pass: 2 charged).
    times = (1.5 * work_s / 2, 1.5 * work_s / 2)
    run = OverheadRun(schedule=schedule, times_s=times, host_cpu_s=(1.5 * work_s, 1.5 * work_s))
    scaled = calibration_from_samples([2, 4], samples, overhead=run, host_ranks=RANKS, host_cores=2)
    assert scaled.host_cpu_scale == pytest.approx(1.5, rel=1e-9)
    assert scaled.overheads.cpu_step_s == pytest.approx(1.5 * STEP_S, rel=1e-9)
    assert scaled.overheads.cpu_byte_s == pytest.approx(1.5 * BYTE_S, rel=1e-9)
    assert scaled.overheads.host_cores == 2  # no more busy than charged: unchanged
    assert scaled.host_cpu is not None and scaled.host_cpu.cpu_step_s == pytest.approx(STEP_S, rel=1e-9)
    assert scaled.to_dict()["host_cpu"]["scale"] == pytest.approx(1.5)
    assert "# host CPU per step and per byte: the isolated runs' fit x1.5," in calibrate_yaml(scaled, "test")
    # The bound now is the run's measured time: nothing is left for the per-op cost.
    assert cpu_bound_s(retime(schedule, scaled.topology())) == pytest.approx(1.5 * work_s / 2, rel=1e-9)
    assert scaled.overheads.op_s == 0.0
    # Not read (or no host term): no scale, the isolated fit as it was.
    unread = calibration_from_samples(
        [2, 4], samples, overhead=replace(run, host_cpu_s=()), host_ranks=RANKS, host_cores=2
    )
    assert unread.host_cpu_scale is None and unread.overheads.cpu_step_s == pytest.approx(STEP_S, rel=1e-9)
    assert calibration_from_samples([2, 4], samples, overhead=run).host_cpu_scale is None


def test_a_run_that_keeps_more_cpus_busy_than_the_concurrent_pass_raises_the_cores_charged() -> None:
    isolated = _samples(random.Random(5), noise=0.0)
    busy = [replace(s, concurrent=True, host_busy_cores=1.7) for s in isolated[:2]]
    fits = fit_all([2, 4], isolated)
    schedule = overhead_schedule(fits, 8 << 20)
    run = OverheadRun(schedule=schedule, times_s=(1.0, 1.1, 1.2), host_cpu_s=(1.85, 2.0, 2.22))
    assert run_busy_cores(run) == pytest.approx(1.85)
    calibration = calibration_from_samples(
        [2, 4], isolated + busy, overhead=run, host_ranks=RANKS, host_cores=2
    )
    assert calibration.overheads.host_cores == pytest.approx(1.85)
    assert run_busy_cores(replace(run, host_cpu_s=(1.0,))) is None  # not one reading per repeat


def test_a_calibration_is_refitted_on_another_run_of_its_overhead_schedule() -> None:
    samples = _samples(random.Random(5), noise=0.0)
    fits = fit_all([2, 4], samples)
    schedule = overhead_schedule(fits, 8 << 20)
    work_s = (
        cpu_bound_s(
            retime(
                schedule, calibration_from_samples([2, 4], samples, host_ranks=RANKS, host_cores=2).topology()
            )
        )
        * 2
    )
    first = OverheadRun(
        schedule=schedule, times_s=(work_s / 1.9,), host_cpu_s=(work_s,), memory_bytes_per_s=5e9
    )
    calibration = calibration_from_samples([2, 4], samples, overhead=first, host_ranks=RANKS, host_cores=2)
    assert calibration.overhead_run == first and calibration.host_cpu_scale == pytest.approx(1.0)
    # The host got slower: the same schedule spent 1.3x the CPU in the rows' minutes.
    later = replace(first, times_s=(1.3 * work_s / 1.9,), host_cpu_s=(1.3 * work_s,))
    refitted = refit_on_run(calibration, later)
    assert refitted.host_cpu_scale == pytest.approx(1.3, rel=1e-9)
    assert refitted.overheads.cpu_step_s == pytest.approx(
        1.3 * STEP_S, rel=1e-9
    )  # of the isolated fit, not x1.0 again
    assert refitted.fits == calibration.fits and refitted.host_cpu == calibration.host_cpu
    assert refitted.overheads.memory_bytes_per_s == 5e9 and refitted.overhead_times_s == later.times_s
    # The same run again gives the same calibration.
    assert refit_on_run(calibration, first) == calibration
    other = overhead_schedule(fits, 4 << 20)
    with pytest.raises(TestbedError, match="not of this calibration's overhead schedule"):
        refit_on_run(calibration, replace(first, schedule=other))
    with pytest.raises(TestbedError, match="no overhead run"):
        refit_on_run(calibration_from_samples([2, 4], samples), first)
