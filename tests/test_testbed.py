"""The emulated testbed: pure parts everywhere, the real thing only as root.

Unit tests cover what needs no privilege: shape and rate parsing, names and addresses,
the exact ip/tc commands, capability messages, the alpha-beta fit. The root test
(``-m root``) builds a 2x2 testbed, checks the shaped rates against their targets,
runs one small benchmark end to end and proves that no namespace of its prefix is left.
"""

import itertools
import math
import os
import random
import tempfile
from pathlib import Path

import pytest

from hipipe.cli import main
from hipipe.cost import op_time_s
from hipipe.overheads import Overheads
from hipipe.predict import predicted_s, replay_op_times_s
from hipipe.report.bench import result_to_dict
from hipipe.schedule import Collective
from hipipe.testbed import netns
from hipipe.testbed.fit import (
    DimFit,
    OverheadRun,
    Sample,
    calibrated_topology,
    calibration_from_samples,
    calibration_sizes_bytes,
    fit_all,
    fit_concurrency_slowdown,
    fit_dim,
    fit_line,
    fit_op_curves,
    fit_overheads,
    overhead_schedule,
    retime,
)
from hipipe.testbed.layout import (
    MAX_IFNAME_CHARS,
    Layout,
    TestbedError,
    check_prefix,
    new_prefix,
    parse_rates_bits_per_s,
    parse_shape,
)
from hipipe.testbed.results import THEMIS, TORCH_NAME, BenchConfig, BenchResult, BenchRow
from hipipe.testbed.shaping import HostCapabilities, KernelCapabilities, rank_tc_commands
from testbed_host import root_skip_reason, unused_prefix


def layout_2x4() -> Layout:
    return Layout(prefix="hp3f9a", sizes=(2, 4), rates_bits_per_s=(50e6, 200e6))


# --- parsing -------------------------------------------------------------------------


def test_shape_parsing() -> None:
    assert parse_shape("2x4") == (2, 4)
    assert parse_shape("2X2x2") == (2, 2, 2)
    for bad, fragment in (("2xa", "cannot read shape"), ("1x4", "at least 2"), ("16x16", "at most")):
        with pytest.raises(TestbedError, match=fragment):
            parse_shape(bad)


def test_rates_take_the_last_unit_and_broadcast() -> None:
    assert parse_rates_bits_per_s("50,200Mbit", 2) == (50e6, 200e6)
    assert parse_rates_bits_per_s("1Gbit,200Mbit", 2) == (1e9, 200e6)
    assert parse_rates_bits_per_s("100Mbit", 3) == (100e6, 100e6, 100e6)
    with pytest.raises(TestbedError, match="need a unit"):
        parse_rates_bits_per_s("50,200", 2)
    with pytest.raises(TestbedError, match="3 rates given for 2 dimensions"):
        parse_rates_bits_per_s("1,2,3Mbit", 2)
    with pytest.raises(TestbedError, match="unknown bandwidth unit"):
        parse_rates_bits_per_s("50furlongs", 1)


def test_prefixes_are_checked_and_random() -> None:
    assert check_prefix("hp00ff") == "hp00ff"
    for bad in ("hp", "hpXYZW", "hp3f9a-", "evil", "hp3f9a0"):
        with pytest.raises(TestbedError, match="not of the form"):
            check_prefix(bad)
    prefixes = {new_prefix() for _ in range(50)}
    assert all(check_prefix(p) for p in prefixes)
    assert len(prefixes) > 40


# --- layout --------------------------------------------------------------------------


def test_names_carry_the_prefix_and_fit_the_kernel_limit() -> None:
    layout = Layout(prefix="hpabcd", sizes=(10, 25), rates_bits_per_s=(1e6, 1e6))
    names = [*layout.all_netns(), layout.bridge]
    names += [layout.rank_ifname(r) for r in range(layout.num_ranks)]
    names += [layout.hub_ifname(r) for r in range(layout.num_ranks)]
    assert all(n.startswith("hpabcd-") for n in names)
    assert max(len(layout.rank_ifname(r)) for r in range(layout.num_ranks)) <= MAX_IFNAME_CHARS
    assert len(set(layout.all_netns())) == layout.num_ranks + 1


def test_addresses_are_private_and_distinct() -> None:
    layout = layout_2x4()
    addresses = [layout.rank_address(r) for r in range(layout.num_ranks)] + [layout.hub_address]
    assert len(set(addresses)) == len(addresses)
    assert all(a.startswith("10.") for a in addresses)
    other = Layout(prefix="hp3f9b", sizes=(2, 4), rates_bits_per_s=(1e6, 1e6))
    assert other.subnet_base != layout.subnet_base


def test_shaping_dimension_follows_coordinates() -> None:
    layout = layout_2x4()
    assert layout.coords(5) == (1, 2)
    assert layout.rank_of((1, 2)) == 5
    assert layout.shaping_dim(0, 1) == 0
    assert layout.shaping_dim(0, 2) == 1
    # differs in both: the slower dimension (dim 0 at 50 Mbit/s) bounds the route
    assert layout.shaping_dim(1, 2) == 0
    assert layout.shaping_dim(3, 3) is None
    assert [layout.neighbor(r, 1) for r in (0, 2, 4, 6)] == [2, 4, 6, 0]


def test_nominal_topology_has_the_testbed_rates() -> None:
    topology = layout_2x4().nominal_topology()
    assert topology.sizes == (2, 4)
    assert [d.bandwidth_bytes_per_s for d in topology.dims] == [50e6 / 8, 200e6 / 8]


# --- commands ------------------------------------------------------------------------


def test_tc_commands_shape_each_dimension_and_spare_small_packets() -> None:
    layout = layout_2x4()
    commands = rank_tc_commands(layout, 1)
    text = [" ".join(c) for c in commands]
    assert all(c[:3] == ["tc", "-n", "hp3f9a-r1"] for c in commands)
    assert any("classid 1:10 htb rate 50000000bit ceil 50000000bit" in t for t in text)
    assert any("classid 1:11 htb rate 200000000bit ceil 200000000bit" in t for t in text)
    assert any("htb default 2" in t for t in text)
    # IPv4 total length < 128 (top 9 bits of the u16 at offset 2 zero), a 20-byte IPv4
    # header, TCP, and PSH clear in the flags byte: pure ACKs only, never a data segment
    [small] = [t for t in text if "prio 1 u32" in t]
    assert small.endswith(
        "match u16 0x0000 0xff80 at 2 match u8 0x45 0xff at 0 match u8 0x06 0xff at 9"
        " match u8 0x00 0x08 at 33 flowid 1:2"
    )
    dst_filters = [t for t in text if "match ip dst" in t]
    assert len(dst_filters) == layout.num_ranks - 1
    assert any(f"dst {layout.rank_address(0)}/32 flowid 1:10" in t for t in dst_filters)
    assert any(f"dst {layout.rank_address(3)}/32 flowid 1:11" in t for t in dst_filters)
    assert any(f"dst {layout.rank_address(2)}/32 flowid 1:10" in t for t in dst_filters)  # both dims


def test_ranks_run_tcp_without_tail_loss_probes() -> None:
    layout = layout_2x4()
    commands = netns.sysctl_commands(layout)
    assert len(commands) == layout.num_ranks * len(netns.RANK_SYSCTLS)
    for rank in range(layout.num_ranks):
        mine = [c[-1] for c in commands if c[3] == layout.rank_netns(rank)]
        assert "net.ipv4.tcp_early_retrans=0" in mine and "net.ipv4.tcp_slow_start_after_idle=0" in mine


def test_link_commands_stay_inside_the_testbed() -> None:
    layout = layout_2x4()
    commands = netns.link_commands(layout)
    for argv in commands:
        assert argv[0] == "ip"
        if argv[1] == "netns":
            assert argv[2] == "add" and argv[3].startswith("hp3f9a-")
        else:
            assert argv[1] == "-n" and argv[2].startswith("hp3f9a-"), argv
    assert sum(1 for c in commands if c[:3] == ["ip", "netns", "add"]) == layout.num_ranks + 1
    congctl = [c for c in commands if "congctl" in c]
    assert [c[2] for c in congctl] == [layout.rank_netns(r) for r in range(layout.num_ranks)]
    assert all(c[c.index("congctl") + 1] == "cubic" and "replace" in c for c in congctl)


# --- capabilities --------------------------------------------------------------------


def test_host_problems_are_one_line() -> None:
    ok = HostCapabilities(is_root=True, ip_path="/sbin/ip", tc_path="/sbin/tc", has_netns=True)
    assert ok.problem() is None
    not_root = HostCapabilities(is_root=False, ip_path="/sbin/ip", tc_path="/sbin/tc", has_netns=True)
    assert "needs root" in (not_root.problem() or "")
    no_tc = HostCapabilities(is_root=True, ip_path="/sbin/ip", tc_path=None, has_netns=True)
    assert "tc not found" in (no_tc.problem() or "") and "iproute2" in (no_tc.problem() or "")
    no_netns = HostCapabilities(is_root=True, ip_path=None, tc_path=None, has_netns=False)
    assert "network namespaces" in (no_netns.problem() or "")
    for caps in (not_root, no_tc, no_netns):
        assert "\n" not in (caps.problem() or "")


def test_kernel_capabilities_report_netem_absence() -> None:
    kernel = KernelCapabilities(htb=True, u32=True, netem=False)
    assert kernel.problem() is None
    assert "netem no" in kernel.describe()
    assert "htb" in (KernelCapabilities(htb=False, u32=False, netem=False, htb_error="x").problem() or "")


def test_cli_reports_bad_input_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["testbed", "up", "2x4", "--rates", "50,200"]) == 2
    assert main(["bench", "--testbed", "2x", "--rates", "1Mbit"]) == 2
    assert main(["bench", "--testbed", "2x2", "--rates", "1Mbit", "--planners", "nope"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 3 and all(line.startswith("hipipe: error:") for line in lines), err


def test_without_root_every_command_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["testbed", "up", "2x2", "--rates", "10Mbit"]) == 2
    assert main(["testbed", "down", "--all"]) == 2
    assert main(["bench", "--testbed", "2x2", "--rates", "10Mbit", "--output", str(Path.cwd() / "x")]) == 2
    assert main(["calibrate", "--testbed", "2x2", "--rates", "10Mbit", "-o", "-"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 4 and all("needs root" in line for line in lines), lines


# --- calibration fit -----------------------------------------------------------------


def test_fit_line_is_exact_on_a_line() -> None:
    xs = [1e3, 1e5, 1e6, 4e6]
    intercept, slope = fit_line(xs, [0.002 + 8e-8 * x for x in xs])
    assert intercept == pytest.approx(0.002, rel=1e-9)
    assert slope == pytest.approx(8e-8, rel=1e-9)
    with pytest.raises(TestbedError):
        fit_line([1.0, 1.0], [1.0, 2.0])


def test_fit_recovers_bandwidth_and_latency_from_noisy_samples() -> None:
    rng = random.Random(7)
    size, bandwidth, constant = 4, 25e6, 0.003
    samples = []
    for full_bytes in (128 * 1024, 1 << 20, 4 << 20, 8 << 20):
        for phase in ("RS", "AG"):
            ideal = constant + (size - 1) / size * full_bytes / bandwidth
            samples.append(
                Sample(
                    dim=1, phase=phase, full_bytes=full_bytes, time_s=ideal * (1 + rng.uniform(-0.02, 0.02))
                )
            )
    fit = fit_dim(1, size, samples)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=0.03)
    assert fit.constant_s == pytest.approx(constant, rel=0.3)
    assert fit.max_relative_residual < 0.05
    assert fit.num_samples == 8


def _two_dim_fits() -> list[DimFit]:
    return [
        fit_dim(
            k,
            n,
            [
                Sample(dim=k, phase="RS", full_bytes=b, time_s=c + b * (n - 1) / n / bw)
                for b in (100_000, 10_000_000)
            ],
        )
        for k, (n, c, bw) in enumerate([(2, 0.002, 6e6), (4, 0.001, 24e6)])
    ]


def _traced_run(fits: list[DimFit], truth: Overheads) -> OverheadRun:
    """The overhead schedule as a run on a network whose overheads are ``truth`` (no jitter)."""
    schedule = overhead_schedule(fits, 4 << 20)
    on_truth = retime(schedule, calibrated_topology(fits, overheads=truth))
    starts, ends = replay_op_times_s(on_truth, random.Random(0))
    return OverheadRun(
        schedule=schedule,
        times_s=(max(ends),),
        op_times_s=tuple(zip(starts, ends, strict=True)),
        memory_bytes_per_s=truth.memory_bytes_per_s,
    )


def test_linear_overheads_are_recovered_from_a_traced_pipelined_run() -> None:
    fits = _two_dim_fits()
    truth = Overheads(op_s=0.003, handoff_s=0.0005, memory_bytes_per_s=2e9)
    run = _traced_run(fits, truth)
    assert run.schedule.num_chunks == 32
    fitted = fit_overheads(fits, run)
    assert fitted.op_s == pytest.approx(0.003, rel=1e-3)
    assert fitted.handoff_s == pytest.approx(0.0005, rel=1e-6)
    assert fitted.memory_bytes_per_s == 2e9
    assert fitted.concurrency_slowdown == 0.0
    assert fitted.jitter_s == pytest.approx(0.0, abs=1e-9)
    # Not slower than the alpha-beta lines: nothing to add.
    untraced = OverheadRun(schedule=run.schedule, times_s=(run.schedule.makespan_s * 0.9,))
    assert fit_overheads(fits, untraced) == Overheads()


def test_concurrency_slowdown_is_recovered_from_the_concurrency_pass() -> None:
    lines = [(2, 0.002, 6e6), (4, 0.001, 24e6)]
    sizes = (1 << 16, 1 << 18, 1 << 20, 1 << 22)
    samples = []
    for k, (n, c, bw) in enumerate(lines):
        for b in sizes:
            wire_s = b * (n - 1) / n / bw
            samples.append(Sample(dim=k, phase="RS", full_bytes=b, time_s=c + wire_s))
            samples.append(
                Sample(dim=k, phase="RS", full_bytes=b, time_s=(c + wire_s) * 1.3, concurrent=True)
            )
    fits = fit_all([n for n, _, _ in lines], samples)
    assert fits[1].bandwidth_bytes_per_s == pytest.approx(24e6, rel=1e-6)  # lines from isolated ops only
    assert fit_concurrency_slowdown(fits, samples) == pytest.approx(0.3, rel=1e-6)
    assert fit_concurrency_slowdown(fits, [s for s in samples if not s.concurrent]) == 0.0
    # Given the slowdown, the rest of the overheads still reproduce a run on that network.
    truth = Overheads(op_s=0.002, concurrency_slowdown=0.3)
    run = _traced_run(_two_dim_fits(), truth)
    fitted = fit_overheads(_two_dim_fits(), run, concurrency_slowdown=0.3)
    assert fitted.op_s == pytest.approx(0.002, rel=1e-3)
    predicted = predicted_s(retime(run.schedule, calibrated_topology(_two_dim_fits(), overheads=fitted)))
    assert predicted == pytest.approx(run.times_s[0], rel=1e-4)


def test_calibration_sizes_follow_the_slowest_rate() -> None:
    sizes = calibration_sizes_bytes([50e6, 200e6])
    assert len(sizes) == 9 and list(sizes) == sorted(sizes)
    assert all(1.8 < b / a < 2.3 for a, b in itertools.pairwise(sizes))  # dense: curves interpolate
    assert sizes[0] == pytest.approx(sizes[-1] / 256, rel=0.2)  # down to a 64-chunk plan's pieces
    assert sizes[-1] == pytest.approx(50e6 / 8, rel=0.01)  # ~1 s on the 50 Mbit/s dimension
    assert calibration_sizes_bytes([1e9])[-1] == 8 * 2**20
    assert calibration_sizes_bytes([1e6])[-1] == 256 * 1024
    assert all(s % 4096 == 0 for s in calibration_sizes_bytes([37e6]))


def test_calibrated_topology_reproduces_the_fitted_lines() -> None:
    fits = [
        fit_dim(
            k,
            n,
            [
                Sample(dim=k, phase="RS", full_bytes=b, time_s=c + b * (n - 1) / n / bw)
                for b in (100_000, 10_000_000)
            ],
        )
        for k, (n, c, bw) in enumerate([(2, 0.002, 6e6), (4, 0.001, 24e6)])
    ]
    topology = calibrated_topology(fits)
    for fit in fits:
        for full_bytes in (64 * 1024, 16 << 20):
            assert op_time_s(topology, (fit.dim,), full_bytes) == pytest.approx(
                fit.predict_s(full_bytes), rel=1e-9
            )


# --- bench bookkeeping ---------------------------------------------------------------


def test_bench_reductions_and_json() -> None:
    config = BenchConfig(sizes=(2, 2), rates_bits_per_s=(1e8, 1e8), messages_bytes=(1 << 20,))
    rows = tuple(
        BenchRow(name=name, message_bytes=1 << 20, num_ranks=4, times_s=times, predicted_s=pred)
        for name, times, pred in (
            ("hipipe", (1.0, 1.2, 1.1), 1.0),
            (THEMIS, (2.0, 2.0, 2.0), 1.6),
            (TORCH_NAME, (4.0, 4.0, 5.0), 4.0),
        )
    )
    result = BenchResult(
        config=config,
        prefix="hp0000",
        kernel="",
        rates=(),
        calibration=None,
        topology=Layout(prefix="hp0000", sizes=(2, 2), rates_bits_per_s=(1e8, 1e8)).nominal_topology(),
        rows=rows,
    )
    assert result.reduction("hipipe", THEMIS, 1 << 20) == pytest.approx(1 - 1.1 / 2.0)
    assert result.reduction("hipipe", THEMIS, 1 << 20, simulated=True) == pytest.approx(1 - 1.0 / 1.6)
    assert result.reduction("hipipe", TORCH_NAME, 1 << 20) == pytest.approx(1 - 1.1 / 4.0)
    assert math.isnan(result.reduction("ring", THEMIS, 1 << 20))
    document = result_to_dict(result)
    hipipe = document["rows"][0]
    assert hipipe["median_s"] == pytest.approx(1.1)
    assert hipipe["busbw_bytes_per_s"] == pytest.approx((1 << 20) / 1.1 * 2 * 3 / 4)
    assert document["rows"][2]["reduction_vs_torch"] == pytest.approx(0.0)
    with pytest.raises(TestbedError):
        BenchConfig(sizes=(2, 2), rates_bits_per_s=(1e8, 1e8), messages_bytes=(1001,))


# --- the real testbed (root) ---------------------------------------------------------


@pytest.mark.root
@pytest.mark.slow
def test_testbed_rates_and_one_small_benchmark(tmp_path: Path) -> None:
    reason = root_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="the benchmark needs torch")
    from hipipe.testbed.ratecheck import check_rates

    state_dir = tmp_path / "state"
    prefix = unused_prefix()
    rates = (40e6, 120e6)
    try:
        testbed = netns.up((2, 2), rates, prefix=prefix, state_dir=state_dir)
        assert len(netns.existing_netns(prefix)) == 5
        for rank in range(testbed.layout.num_ranks):  # every rank's connections run cubic, not the host's
            routes = netns.run(["ip", "-n", testbed.layout.rank_netns(rank), "route", "show"])
            assert f"congctl {netns.TCP_CONGESTION_CONTROL}" in routes, routes
            probes = netns.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    testbed.layout.rank_netns(rank),
                    "sysctl",
                    "-n",
                    "net.ipv4.tcp_early_retrans",
                ]
            )
            assert probes.strip() == "0", probes
        measured = check_rates(testbed.layout, duration_s=1.5, warmup_s=0.5)
        for rate in measured:
            assert rate.median_bits_per_s == pytest.approx(rate.target_bits_per_s, rel=0.10), rate
        netns.down(prefix, state_dir=state_dir)
        assert netns.existing_netns(prefix) == []

        from hipipe.testbed.bench import run_bench

        config = BenchConfig(
            sizes=(2, 2),
            rates_bits_per_s=rates,
            messages_bytes=(1 << 20,),
            planners=("hipipe", THEMIS),
            warmup=1,
            repeats=1,
            max_repeats=1,
            jobs=2,
            calibration_sizes_bytes=(64 * 1024, 512 * 1024),
            calibration_repeats=1,
            rate_check_s=0.5,
        )
        result = run_bench(config, workdir=tmp_path / "bench", state_dir=state_dir, prefix=prefix)
        assert {r.name for r in result.rows} == {"hipipe", THEMIS, TORCH_NAME}
        assert all(r.median_s > 0 and r.predicted_s > 0 for r in result.rows)
        # two worker jobs, one run each: every row and the calibration's overhead run has two
        assert all(len(r.times_s) == 2 for r in result.rows)
        assert result.calibration is not None and len(result.calibration.overhead_times_s) == 2
        # The overhead schedule ran again in the rows' two jobs; the rows were predicted on its refit.
        before = result.calibration_before_rows
        assert (
            before is not None
            and before.overhead_run is not None
            and result.calibration.overhead_run is not None
        )
        assert result.calibration.overhead_run.schedule == before.overhead_run.schedule
        assert len(result.calibration.overhead_run.traces) == len(before.overhead_run.traces) + 1
        assert result_to_dict(result)["calibration_before_rows"] == before.to_dict()
        assert sorted(p.name for p in (tmp_path / "bench" / "bench").iterdir()) == ["job0", "job1"]
        assert len(result.gantt_panels) == 2
    finally:
        netns.down(prefix, state_dir=state_dir)
        assert netns.existing_netns(prefix) == []
    assert not list(state_dir.glob("*.json"))


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("collective", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
def test_bench_measures_reduce_scatter_and_all_gather_against_torch(
    tmp_path: Path, collective: Collective, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = root_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="the benchmark needs torch")
    from hipipe.testbed.bench import run_bench

    state_dir, prefix = tmp_path / "state", unused_prefix()
    config = BenchConfig(
        sizes=(2, 2),
        rates_bits_per_s=(100e6, 200e6),
        messages_bytes=(1 << 20,),
        collective=collective,
        planners=("hipipe",),
        repeats=2,
        max_repeats=2,
        jobs=1,
        calibrate=False,
        rate_check_s=0.0,
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    try:
        # every run is checked on the ranks against the closed form of its collective
        result = run_bench(config, state_dir=state_dir, prefix=prefix)
    finally:
        netns.down(prefix, state_dir=state_dir)
    assert list(scratch.iterdir()) == []  # its own work directory (worker logs) is gone
    torch_name = f"torch.distributed.{collective.torch_function}"
    assert [r.name for r in result.rows] == ["hipipe", torch_name]
    assert all(len(r.times_s) == 2 and r.collective is collective for r in result.rows)
    hipipe = result.rows[0]
    # a ReduceScatter or AllGather moves (N-1)/N of the message per rank: busbw = algbw * 3/4
    assert hipipe.busbw_bytes_per_s == pytest.approx((1 << 20) / hipipe.median_s * 3 / 4)
    document = result_to_dict(result)
    assert document["collective"] == collective.value
    assert document["rows"][0]["reduction_vs_torch"] == pytest.approx(
        1 - hipipe.median_s / result.rows[1].median_s
    )
    assert netns.existing_netns(prefix) == []


def test_streamed_samples_become_one_curve_per_dim_and_phase() -> None:
    fits = _two_dim_fits()
    samples = [
        Sample(dim=k, phase=phase, full_bytes=size, time_s=t, streamed_ops=8)
        for k in (0, 1)
        for phase in ("RS", "AG")
        for size, times in ((1 << 16, (0.010, 0.012, 0.011)), (1 << 20, (0.05, 0.07, 0.06)))
        for t in times
    ]
    samples.append(Sample(dim=0, phase="RS", full_bytes=1 << 16, time_s=9.0, concurrent=True))
    curves = fit_op_curves(fits, samples)
    alone = [c for c in curves if not c.busy]
    assert sorted((c.dim, c.phase) for c in alone) == [(0, "AG"), (0, "RS"), (1, "AG"), (1, "RS")]
    # the median of the isolated repeats: the concurrent sample is not one of their points
    assert all(c.points == ((65536.0, 0.011), (1048576.0, 0.06)) for c in alone)
    [busy] = [c for c in curves if c.busy]  # it makes the busy curve of its dim and phase
    assert (busy.dim, busy.phase, busy.points) == (0, "RS", ((65536.0, 9.0),))
    calibration = calibration_from_samples([2, 4], samples)
    assert calibration.overheads.concurrency_slowdown == 0.0  # the busy curve carries it


def test_streamed_runs_last_about_a_window() -> None:
    pytest.importorskip("torch", reason="the rank side of the calibration needs torch")
    from hipipe.testbed.calibrate import MAX_STREAMED_OPS, STREAM_WINDOW_S, streamed_ops

    assert streamed_ops(4 * STREAM_WINDOW_S) == 1  # a long op is timed alone
    assert streamed_ops(2 * STREAM_WINDOW_S / 5) == 5
    assert streamed_ops(1e-6) == MAX_STREAMED_OPS


def test_jitter_is_recovered_from_the_spread_of_traced_ops() -> None:
    fits = _two_dim_fits()
    truth = Overheads(op_s=0.002, jitter_s=0.004)
    schedule = overhead_schedule(fits, 4 << 20)
    on_truth = retime(schedule, calibrated_topology(fits, overheads=truth))
    starts, ends = replay_op_times_s(on_truth, random.Random(7))
    run = OverheadRun(
        schedule=schedule, times_s=(max(ends),), op_times_s=tuple(zip(starts, ends, strict=True))
    )
    fitted = fit_overheads(fits, run)
    assert fitted.jitter_s == pytest.approx(0.004, rel=0.25)


def test_every_jobs_trace_joins_the_hand_off_and_jitter_fits() -> None:
    """Five traced runs (one per worker job) fitted together: the jitter no worse than the
    median single fit, the hand-off found where single traces miss it; a trace of the wrong
    length (another schedule's) is left out."""
    fits = _two_dim_fits()
    truth = Overheads(op_s=0.002, handoff_s=0.0005, jitter_s=0.004)
    schedule = overhead_schedule(fits, 4 << 20)
    on_truth = retime(schedule, calibrated_topology(fits, overheads=truth))
    traces = []
    for seed in range(5):
        starts, ends = replay_op_times_s(on_truth, random.Random(100 + seed))
        traces.append(tuple(zip(starts, ends, strict=True)))
    alone = [
        fit_overheads(fits, OverheadRun(schedule=schedule, times_s=(max(e for _, e in t),), op_times_s=t))
        for t in traces
    ]
    run = OverheadRun(
        schedule=schedule,
        times_s=tuple(max(e for _, e in t) for t in traces),
        op_times_s=traces[0],
        more_traces=(*traces[1:], traces[0][:-1]),
    )
    assert run.traces == tuple(traces)  # the short trace is dropped
    pooled = fit_overheads(fits, run)
    pooled_error = abs(pooled.jitter_s - 0.004)
    assert pooled_error < 0.1 * 0.004
    assert (
        pooled_error <= sorted(abs(f.jitter_s - 0.004) for f in alone)[2]
    )  # no worse than the median single fit
    # The hand-off is read only where an op did not wait for its dim: under jitter one trace
    # has too few such ops to fit it (0), five together recover it, and the per-op cost
    # fitted last comes out near the truth instead of absorbing the missing hand-off.
    assert all(f.handoff_s == 0.0 for f in alone)
    assert pooled.handoff_s == pytest.approx(0.0005, rel=0.01)
    assert pooled.op_s == pytest.approx(0.002, rel=0.1)
