"""The network model: a :class:`Topology` is an ordered list of :class:`Dimension`.

See docs/MODEL.md section 1. Dimension 0 varies fastest in a rank's coordinates. Latency is
per link; how many links one step of a collective crosses depends on the dimension's
kind (a switch step crosses 2 hops: NPU -> switch -> NPU), and how many steps an op
takes depends on the per-dimension algorithm (:mod:`hipipe.cost`).
"""

import math
from dataclasses import dataclass, field
from enum import StrEnum

from hipipe.errors import TopologyError
from hipipe.overheads import Overheads


class Kind(StrEnum):
    """Physical shape of one dimension."""

    RING = "ring"
    SWITCH = "switch"
    FULLY_CONNECTED = "fully_connected"


class Algorithm(StrEnum):
    """Algorithm a dimension uses for its ReduceScatter / AllGather."""

    RING = "ring"
    DIRECT = "direct"
    HALVING_DOUBLING = "halving_doubling"


HOPS_PER_STEP: dict[Kind, int] = {Kind.RING: 1, Kind.SWITCH: 2, Kind.FULLY_CONNECTED: 1}
"""Links one step crosses: a switch step goes NPU -> switch -> NPU."""

DEFAULT_ALGORITHM: dict[Kind, Algorithm] = {
    Kind.RING: Algorithm.RING,
    Kind.SWITCH: Algorithm.RING,
    Kind.FULLY_CONNECTED: Algorithm.DIRECT,
}


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Dimension:
    """One dimension of the network, as seen by one NPU."""

    kind: Kind
    size: int
    """NPUs along this dimension (n_k >= 2)."""
    bandwidth_bytes_per_s: float
    """Per-NPU bandwidth the dimension's collective can use (B_k)."""
    latency_s: float
    """Latency of one link (a_k); a step crosses :data:`HOPS_PER_STEP` links."""
    algorithm: Algorithm = field(default=Algorithm.RING)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", Kind(self.kind))
        except ValueError:
            kinds = ", ".join(k.value for k in Kind)
            raise TopologyError(f"unknown dimension kind {self.kind!r} (use {kinds})") from None
        try:
            object.__setattr__(self, "algorithm", Algorithm(self.algorithm))
        except ValueError:
            algs = ", ".join(a.value for a in Algorithm)
            raise TopologyError(f"unknown algorithm {self.algorithm!r} (use {algs})") from None
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise TopologyError(f"dimension size must be an integer, got {self.size!r}")
        if self.size < 2:
            raise TopologyError(f"a dimension needs at least 2 NPUs, got size {self.size}")
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise TopologyError(f"bandwidth must be positive, got {self.bandwidth_bytes_per_s!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise TopologyError(f"latency must be >= 0, got {self.latency_s!r}")
        if self.algorithm is Algorithm.HALVING_DOUBLING and not _is_power_of_two(self.size):
            raise TopologyError(f"halving_doubling needs a power-of-two dimension size, got {self.size}")

    @classmethod
    def make(
        cls,
        kind: Kind | str,
        size: int,
        bandwidth_gbps: float,
        latency_ns: float,
        algorithm: Algorithm | str | None = None,
    ) -> "Dimension":
        """Build from user units: GB/s (1 GB = 1e9 B) and ns; default algorithm per kind."""
        kind_value = _parse_kind(kind)
        return cls(
            kind=kind_value,
            size=size,
            bandwidth_bytes_per_s=bandwidth_gbps * 1e9,
            latency_s=latency_ns * 1e-9,
            algorithm=DEFAULT_ALGORITHM[kind_value] if algorithm is None else Algorithm(algorithm),
        )

    @property
    def latency_steps(self) -> int:
        """Link latencies paid by one ReduceScatter or AllGather on this dimension.

        Steps (docs/MODEL.md section 2) times the links one step crosses: ring algorithm
        n-1 steps, direct 1 step, halving-doubling log2(n) steps.
        """
        hops = HOPS_PER_STEP[self.kind]
        if self.algorithm is Algorithm.RING:
            return (self.size - 1) * hops
        if self.algorithm is Algorithm.DIRECT:
            return hops
        return int(math.log2(self.size)) * hops

    def describe(self) -> str:
        """``switch 8 @ 400 GB/s / 936 ns (ring)``."""
        return (
            f"{self.kind.value} {self.size} @ {self.bandwidth_bytes_per_s / 1e9:g} GB/s"
            f" / {self.latency_s * 1e9:g} ns ({self.algorithm.value})"
        )


def _parse_kind(kind: Kind | str) -> Kind:
    text = str(kind).strip().lower().replace("-", "_")
    aliases = {
        "fc": "fully_connected",
        "fullyconnected": "fully_connected",
        "full": "fully_connected",
    }
    text = aliases.get(text, text)
    try:
        return Kind(text)
    except ValueError:
        kinds = ", ".join(k.value for k in Kind)
        raise TopologyError(f"unknown dimension kind {kind!r} (use {kinds})") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """An ordered list of dimensions; an NPU's id has dimension 0 varying fastest."""

    dims: tuple[Dimension, ...]
    name: str = ""
    overheads: Overheads = field(default_factory=Overheads)
    """Calibrated costs beyond alpha-beta (:mod:`hipipe.overheads`); zero unless measured."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        if not self.dims:
            raise TopologyError("a topology needs at least one dimension")
        if len(self.dims) > 8:
            raise TopologyError(f"at most 8 dimensions are supported, got {len(self.dims)}")

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    @property
    def num_npus(self) -> int:
        """N = prod n_k."""
        return math.prod(d.size for d in self.dims)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    def coords(self, rank: int) -> tuple[int, ...]:
        """Coordinates of a rank, dimension 0 fastest."""
        out = []
        for d in self.dims:
            out.append(rank % d.size)
            rank //= d.size
        return tuple(out)

    def rank(self, coords: tuple[int, ...]) -> int:
        """Inverse of :meth:`coords`."""
        rank = 0
        for d, c in zip(reversed(self.dims), reversed(coords), strict=True):
            rank = rank * d.size + c
        return rank

    def describe(self) -> str:
        """One line per dimension, for reports."""
        return "\n".join(f"dim {k}: {d.describe()}" for k, d in enumerate(self.dims))

    def label(self) -> str:
        """Short name for titles: the preset name, or the shape (``8x4``)."""
        return self.name or "x".join(str(s) for s in self.sizes)
