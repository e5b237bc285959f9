"""The reference configurations (the six networks of the benchmarks), as small named factories.

Bandwidths in GB/s (1 GB = 1e9 B) and per-link latencies in ns. The numbers are
representative; the shapes follow public ASTRA-sim and LIBRA inputs.
"""

from collections.abc import Callable

from hipipe.topology import Dimension, Topology


def rfs_3d() -> Topology:
    """Ring 2 + fully connected 8 + switch 4 (the project's default network)."""
    return Topology(
        name="rfs-3d",
        dims=(
            Dimension.make("ring", 2, 200, 50),
            Dimension.make("fully_connected", 8, 100, 500),
            Dimension.make("switch", 4, 50, 2000),
        ),
    )


def hgx_h100_32() -> Topology:
    """Four HGX H100 nodes: NVSwitch 8 inside, a 4-node ring across."""
    return Topology(
        name="hgx-h100-32",
        dims=(Dimension.make("switch", 8, 400, 936), Dimension.make("ring", 4, 50, 1000)),
    )


def switch_3d_512() -> Topology:
    """Three identical 8-port switch levels: 512 NPUs."""
    return Topology(
        name="switch-3d-512",
        dims=tuple(Dimension.make("switch", 8, 50, 1) for _ in range(3)),
    )


def libra_3d() -> Topology:
    """LIBRA-style 3D: ring 16, fully connected 8, switch 32 (4,096 NPUs)."""
    return Topology(
        name="libra-3d",
        dims=(
            Dimension.make("ring", 16, 250, 100),
            Dimension.make("fully_connected", 8, 150, 500),
            Dimension.make("switch", 32, 100, 2000),
        ),
    )


def libra_4d() -> Topology:
    """LIBRA-style 4D: ring 4, fully connected 8, ring 4, switch 32 (4,096 NPUs)."""
    return Topology(
        name="libra-4d",
        dims=(
            Dimension.make("ring", 4, 250, 50),
            Dimension.make("fully_connected", 8, 125, 200),
            Dimension.make("ring", 4, 75, 500),
            Dimension.make("switch", 32, 50, 2000),
        ),
    )


def tpu_2d() -> Topology:
    """A 4x8 2D torus (TPU-style)."""
    return Topology(
        name="tpu-2d",
        dims=(Dimension.make("ring", 4, 80, 1000), Dimension.make("ring", 8, 80, 1000)),
    )


PRESETS: dict[str, Callable[[], Topology]] = {
    "rfs-3d": rfs_3d,
    "hgx-h100-32": hgx_h100_32,
    "switch-3d-512": switch_3d_512,
    "libra-3d": libra_3d,
    "libra-4d": libra_4d,
    "tpu-2d": tpu_2d,
}
"""Name -> factory, in the order the benchmarks report them."""

DEFAULT_PRESET = "rfs-3d"
