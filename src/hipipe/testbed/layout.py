"""What a testbed is, before anything is created: shape, rates, names and addresses.

Everything here is a pure function of the user's input and a random id, so it can be
tested without root and so ``down`` can recompute every name a crashed ``up`` made.

Naming: a testbed has a unique prefix ``hp<4 hex>`` (:func:`new_prefix`). Its network
namespaces are ``<prefix>-hub`` (a bridge joining the ranks) and ``<prefix>-r<rank>``;
interfaces carry the same names (15 characters at most, the kernel's limit). Cleanup
only ever touches names built from one exact prefix.

Addresses: one private /24 per testbed, derived from the prefix, that exists only
inside the testbed's own namespaces (no route leaves them).
"""

import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from hipipe.errors import HipipeError
from hipipe.topology import Algorithm, Dimension, Kind, Topology
from hipipe.units import parse_bandwidth_bytes_per_s

PREFIX_PATTERN = re.compile(r"^hp[0-9a-f]{4}$")
"""A testbed prefix: ``hp`` and four hex digits (``hp3f9a``)."""

MAX_RANKS = 250
"""Ranks fit in one /24 next to the hub's address (.254)."""

MAX_IFNAME_CHARS = 15
"""Linux IFNAMSIZ - 1."""

SMALL_PACKET_BYTES = 128
"""TCP segments shorter than this without PSH (pure ACKs) bypass the shaped classes."""


class TestbedError(HipipeError):
    """The testbed cannot be built, measured or removed; the reason fits on one line."""

    __test__ = False  # not a pytest class despite its name


def new_prefix() -> str:
    """A fresh random prefix, so that several testbeds can coexist on one machine."""
    return f"hp{secrets.token_hex(2)}"


def check_prefix(prefix: str) -> str:
    if not PREFIX_PATTERN.match(prefix):
        raise TestbedError(f"testbed prefix {prefix!r} is not of the form hp<4 hex digits> (e.g. hp3f9a)")
    return prefix


def parse_shape(text: str) -> tuple[int, ...]:
    """``2x4`` -> ``(2, 4)``: ranks per dimension, dimension 0 first (varies fastest)."""
    parts = [p.strip() for p in text.lower().split("x")]
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        raise TestbedError(f"cannot read shape {text!r}: expected sizes joined by x, e.g. 2x4") from None
    if any(s < 2 for s in sizes):
        raise TestbedError(f"shape {text!r}: every dimension needs at least 2 ranks")
    if math.prod(sizes) > MAX_RANKS:
        raise TestbedError(
            f"shape {text!r} has {math.prod(sizes)} ranks; a testbed holds at most {MAX_RANKS}"
        )
    return sizes


def parse_rates_bits_per_s(text: str, num_dims: int) -> tuple[float, ...]:
    """``50,200Mbit`` -> one rate per dimension in bits/s.

    A number without a unit takes the unit of the last item that has one, so
    ``50,200Mbit`` means 50 and 200 Mbit/s. One rate applies to every dimension.
    """
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise TestbedError("no rate given (e.g. --rates 50,200Mbit)")
    unit_match = re.search(r"[a-zA-Z/]+$", items[-1])
    default_unit = unit_match.group(0) if unit_match else ""
    if not default_unit:
        raise TestbedError(f"rates {text!r} need a unit, e.g. 50,200Mbit")
    rates = []
    for item in items:
        with_unit = item if re.search(r"[a-zA-Z]", item) else item + default_unit
        try:
            rates.append(parse_bandwidth_bytes_per_s(with_unit) * 8)
        except HipipeError as exc:
            raise TestbedError(f"rates {text!r}: {exc}") from None
    if len(rates) == 1:
        rates *= num_dims
    if len(rates) != num_dims:
        raise TestbedError(f"{len(rates)} rates given for {num_dims} dimensions (give one or {num_dims})")
    return tuple(rates)


def format_rate(rate_bits_per_s: float) -> str:
    """``2e8`` -> ``200 Mbit/s``."""
    for factor, name in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if rate_bits_per_s >= factor:
            return f"{rate_bits_per_s / factor:.4g} {name}"
    return f"{rate_bits_per_s:.4g} bit/s"


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Names and addresses of one testbed: a pure function of prefix, shape and rates."""

    prefix: str
    sizes: tuple[int, ...]
    rates_bits_per_s: tuple[float, ...]

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if len(self.sizes) != len(self.rates_bits_per_s):
            raise TestbedError(f"{len(self.rates_bits_per_s)} rates for {len(self.sizes)} dimensions")
        if not self.sizes or any(s < 2 for s in self.sizes):
            raise TestbedError(f"bad shape {self.sizes}: every dimension needs at least 2 ranks")
        if self.num_ranks > MAX_RANKS:
            raise TestbedError(f"{self.num_ranks} ranks; a testbed holds at most {MAX_RANKS}")
        if any(not r > 0 for r in self.rates_bits_per_s):
            raise TestbedError("every rate must be positive")
        assert len(self.rank_ifname(self.num_ranks - 1)) <= MAX_IFNAME_CHARS

    @property
    def num_ranks(self) -> int:
        return math.prod(self.sizes)

    @property
    def num_dims(self) -> int:
        return len(self.sizes)

    @property
    def shape(self) -> str:
        return "x".join(str(s) for s in self.sizes)

    @property
    def hub_netns(self) -> str:
        return f"{self.prefix}-hub"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def rank_netns(self, rank: int) -> str:
        return f"{self.prefix}-r{rank}"

    def rank_ifname(self, rank: int) -> str:
        """The rank's end of its veth, inside the rank's namespace (GLOO_SOCKET_IFNAME)."""
        return f"{self.prefix}-r{rank}"

    def hub_ifname(self, rank: int) -> str:
        """The hub's end of the rank's veth, enslaved to the bridge."""
        return f"{self.prefix}-h{rank}"

    def all_netns(self) -> tuple[str, ...]:
        """Every namespace this testbed owns: ranks first, hub last (deleted in this order)."""
        return (*(self.rank_netns(r) for r in range(self.num_ranks)), self.hub_netns)

    @property
    def subnet_base(self) -> str:
        """``10.A.B`` with A in 128..191 and B in 0..255 taken from the prefix's random bits."""
        value = int(self.prefix[2:], 16)
        return f"10.{128 + value % 64}.{value // 64 % 256}"

    def rank_address(self, rank: int) -> str:
        return f"{self.subnet_base}.{rank + 1}"

    @property
    def hub_address(self) -> str:
        """The bridge's address: where the parent's rendezvous store listens."""
        return f"{self.subnet_base}.254"

    def coords(self, rank: int) -> tuple[int, ...]:
        """Coordinates of a rank, dimension 0 fastest (as :meth:`Topology.coords`)."""
        out = []
        for size in self.sizes:
            out.append(rank % size)
            rank //= size
        return tuple(out)

    def rank_of(self, coords: tuple[int, ...]) -> int:
        rank = 0
        for size, c in zip(reversed(self.sizes), reversed(coords), strict=True):
            rank = rank * size + c
        return rank

    def neighbor(self, rank: int, dim: int, step: int = 1) -> int:
        """The rank ``step`` positions further along ``dim`` (a ring neighbour)."""
        coords = list(self.coords(rank))
        coords[dim] = (coords[dim] + step) % self.sizes[dim]
        return self.rank_of(tuple(coords))

    def shaping_dim(self, src: int, dst: int) -> int | None:
        """Which dimension's class carries traffic from ``src`` to ``dst``.

        Ranks that differ in one coordinate talk over that dimension. A pair that differs
        in several (a flat ring crossing dimensions) shares the slowest of them, the link
        that bounds such a route on a real hierarchical network. ``None`` for ``src == dst``.
        """
        a, b = self.coords(src), self.coords(dst)
        differing = [k for k in range(self.num_dims) if a[k] != b[k]]
        if not differing:
            return None
        return min(differing, key=lambda k: (self.rates_bits_per_s[k], k))

    def nominal_topology(self) -> Topology:
        """The topology the testbed emulates (:func:`nominal_topology`)."""
        return nominal_topology(self.sizes, self.rates_bits_per_s)


def nominal_topology(sizes: Sequence[int], rates_bits_per_s: Sequence[float]) -> Topology:
    """The topology a testbed of this shape and rates emulates, at its nominal rates and zero latency.

    Each dimension is a switch (the hub bridge) running the ring algorithm, as the
    executor's per-dimension ring collectives do. :mod:`hipipe.testbed.calibrate`
    measures the real latency and bandwidth. Known before any testbed is up, so a
    tuning cache can be keyed by it.
    """
    return Topology(
        dims=tuple(
            Dimension(
                kind=Kind.SWITCH,
                size=size,
                bandwidth_bytes_per_s=rate / 8,
                latency_s=0.0,
                algorithm=Algorithm.RING,
            )
            for size, rate in zip(sizes, rates_bits_per_s, strict=True)
        ),
        name=f"testbed-{'x'.join(str(s) for s in sizes)}",
    )
