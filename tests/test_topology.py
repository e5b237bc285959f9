from pathlib import Path

import pytest

from hipipe.errors import TopologyError
from hipipe.presets import PRESETS
from hipipe.topology import Algorithm, Dimension, Kind, Topology
from hipipe.topology_io import (
    ASTRA_SIM_GB_BYTES,
    load_topology,
    parse_spec,
    topology_to_yaml,
)


def test_presets_match_the_reference_table() -> None:
    rfs = load_topology("rfs-3d")
    assert rfs.sizes == (2, 8, 4)
    assert [d.kind for d in rfs.dims] == [Kind.RING, Kind.FULLY_CONNECTED, Kind.SWITCH]
    assert [d.bandwidth_bytes_per_s for d in rfs.dims] == [200e9, 100e9, 50e9]
    assert [d.latency_s for d in rfs.dims] == pytest.approx([50e-9, 500e-9, 2000e-9])
    assert [d.algorithm for d in rfs.dims] == [Algorithm.RING, Algorithm.DIRECT, Algorithm.RING]
    assert load_topology("libra-4d").num_npus == 4 * 8 * 4 * 32
    assert load_topology("switch-3d-512").num_npus == 512
    assert set(PRESETS) == {"rfs-3d", "hgx-h100-32", "switch-3d-512", "libra-3d", "libra-4d", "tpu-2d"}


def test_latency_steps_per_kind_and_algorithm() -> None:
    # ring algorithm: n-1 steps; a switch step crosses 2 links; direct: one step.
    assert Dimension.make("ring", 4, 1, 1).latency_steps == 3
    assert Dimension.make("switch", 4, 1, 1).latency_steps == 6
    assert Dimension.make("fully_connected", 8, 1, 1).latency_steps == 1
    assert Dimension.make("switch", 8, 1, 1, "halving_doubling").latency_steps == 3 * 2
    assert Dimension.make("fully_connected", 8, 1, 1, "halving_doubling").latency_steps == 3
    assert Dimension.make("ring", 16, 1, 1, "halving_doubling").latency_steps == 4


def test_coords_round_trip_with_dim0_fastest() -> None:
    topo = parse_spec("ring:2:1GB/s:0ns,ring:3:1GB/s:0ns,ring:4:1GB/s:0ns")
    assert topo.coords(1) == (1, 0, 0)
    assert topo.coords(2) == (0, 1, 0)
    assert all(topo.rank(topo.coords(r)) == r for r in range(topo.num_npus))


def test_spec_parsing() -> None:
    topo = load_topology("ring:4:100GB/s:1us,switch:8:50GB/s:2us:hd")
    assert topo.sizes == (4, 8)
    assert topo.dims[0].bandwidth_bytes_per_s == 100e9
    assert topo.dims[1].latency_s == pytest.approx(2e-6)
    assert topo.dims[1].algorithm is Algorithm.HALVING_DOUBLING


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ring:1:100GB/s:1us", "at least 2 NPUs"),
        ("ring:4:-5GB/s:1us", "positive"),
        ("ring:4:100GB/s", "kind:size:bandwidth:latency"),
        ("torus:4:100GB/s:1us", "unknown dimension kind"),
        ("ring:x:100GB/s:1us", "not an integer"),
        ("ring:6:100GB/s:1us:hd", "power-of-two"),
        ("no-such-preset", "unknown topology"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        load_topology(spec)


def test_hipipe_yaml_round_trip(tmp_path: Path) -> None:
    topo = load_topology("libra-4d")
    path = tmp_path / "net.yaml"
    path.write_text(topology_to_yaml(topo))
    assert load_topology(str(path)) == topo


def test_hipipe_yaml_with_units(tmp_path: Path) -> None:
    path = tmp_path / "mine.yml"
    path.write_text(
        "dims:\n"
        "  - {kind: ring, size: 4, bandwidth: 100GB/s, latency: 1us}\n"
        "  - {kind: switch, size: 8, bandwidth_gbps: 50, latency_ns: 2000, algorithm: direct}\n"
    )
    topo = load_topology(str(path))
    assert topo.name == "mine"
    assert topo.dims[1].bandwidth_bytes_per_s == 50e9
    assert topo.dims[1].algorithm is Algorithm.DIRECT


def test_astra_sim_network_yaml(tmp_path: Path) -> None:
    path = tmp_path / "astra.yml"
    path.write_text(
        "topology: [ Ring, FullyConnected, Switch ]\n"
        "npus_count: [ 2, 8, 4 ]\n"
        "bandwidth: [ 200.0, 100.0, 50.0 ]  # GB/s\n"
        "latency: [ 50.0, 500.0, 2000.0 ]  # ns\n"
    )
    topo = load_topology(str(path))
    assert topo.sizes == (2, 8, 4)
    assert [d.kind for d in topo.dims] == [Kind.RING, Kind.FULLY_CONNECTED, Kind.SWITCH]
    # ASTRA-sim's analytical backend: 1 GB/s = 2^30 B/s.
    assert topo.dims[2].bandwidth_bytes_per_s == 50 * ASTRA_SIM_GB_BYTES
    assert topo.dims[0].latency_s == pytest.approx(50e-9)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("topology: [Ring]\nnpus_count: [4, 2]\nbandwidth: [1]\nlatency: [1]\n", "differ in length"),
        ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [1]\n", "missing latency"),
        ("topology: [Mesh]\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1]\n", "unknown ASTRA-sim topology"),
        ("dims: [{kind: ring, size: 4, latency: 1us}]\n", "missing 'bandwidth'"),
        ("dims: [ {kind: ring, size: 4\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
    ],
)
def test_bad_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(TopologyError, match=message):
        load_topology(str(path))


def test_unreadable_file() -> None:
    with pytest.raises(TopologyError, match="cannot read topology file"):
        load_topology("/nonexistent/net.yaml")


def test_topology_needs_dimensions() -> None:
    with pytest.raises(TopologyError):
        Topology(dims=())
