"""Rate limits per dimension with tc: htb classes picked by destination address.

Each rank's veth gets an htb root with one class per dimension (rate = ceil = the
dimension's rate, so a dimension never borrows another's bandwidth) and one unshaped
class. u32 filters send TCP segments shorter than :data:`SMALL_PACKET_BYTES` without
the PSH flag (pure ACKs) to the unshaped class first -- otherwise ACKs queue behind data
and small exchanges stall -- then classify by destination: the class of the dimension
the pair talks over (:meth:`Layout.shaping_dim`). Small *data* segments stay shaped:
when every short packet bypassed the queue, the tail of a message overtook the data
queued before it, and one job of 24 runs of 4 MiB pipelined and Themis schedules on 2x4
at 100 Mbit/s saw 285 reorderings and 257 SACK recoveries (3 and 15 with the PSH test).
Anything else (ARP, the rendezvous store on the hub) is unshaped. Shaping is on egress
only: each rank's sending rate per dimension is what the cost model calls the per-NPU
bandwidth B_k.

The kernel may lack a qdisc: :func:`probe_kernel` tries htb, u32 and netem on a
namespace's loopback and reports the absence in one line instead of failing later.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hipipe.testbed.layout import SMALL_PACKET_BYTES, Layout, TestbedError

UNSHAPED_RATE_BITS_PER_S = 10e9
"""Rate of the parent and the unshaped class: far above what 2 cores can push."""

HTB_QUANTUM_BYTES = 60_000
"""Explicit quantum keeps htb from warning about rate/r2q at both 25 Mbit and 10 Gbit."""

BURST_S = 0.0005
"""Token bucket depth in time at the class rate; covers timer slack on a busy host."""

MIN_BURST_BYTES = 4_000


IPV4_NO_OPTIONS = 0x45
"""First byte of an IPv4 header of 20 bytes (version 4, IHL 5): the TCP header follows at 20."""

IPPROTO_TCP = 0x06

TCP_PSH = 0x08
"""The PSH bit of the TCP flags byte: set on a segment that ends a write, never on a pure ACK."""


def dim_classid(dim: int) -> str:
    return f"1:{10 + dim}"


UNSHAPED_CLASSID = "1:2"


def _bits(rate_bits_per_s: float) -> str:
    return f"{round(rate_bits_per_s)}bit"


def burst_bytes(rate_bits_per_s: float) -> int:
    return max(MIN_BURST_BYTES, round(rate_bits_per_s / 8 * BURST_S))


def rank_tc_commands(layout: Layout, rank: int) -> list[list[str]]:
    """tc argv lists that shape one rank's egress (run in order, in the rank's namespace)."""
    ns, dev = layout.rank_netns(rank), layout.rank_ifname(rank)
    tc = ["tc", "-n", ns]
    unshaped, quantum = _bits(UNSHAPED_RATE_BITS_PER_S), HTB_QUANTUM_BYTES
    commands = [
        [*tc, *f"qdisc add dev {dev} root handle 1: htb default 2".split()],
        [*tc, *f"class add dev {dev} parent 1: classid 1:1 htb rate {unshaped} quantum {quantum}".split()],
        [
            *tc,
            *f"class add dev {dev} parent 1:1 classid {UNSHAPED_CLASSID} htb".split(),
            *f"rate {unshaped} quantum {quantum}".split(),
        ],
    ]
    for dim, rate in enumerate(layout.rates_bits_per_s):
        burst = burst_bytes(rate)
        commands.append(
            [
                *tc,
                *f"class add dev {dev} parent 1:1 classid {dim_classid(dim)} htb".split(),
                *f"rate {_bits(rate)} ceil {_bits(rate)} burst {burst} cburst {burst} quantum {quantum}".split(),
            ]
        )
    # IPv4 total length is the u16 at offset 2; below 128 the top 9 bits are zero. Only
    # TCP segments without PSH (a 20-byte IP header puts the TCP flags at byte 33): pure
    # ACKs. A small *data* segment carries PSH and stays in its dimension's queue, else
    # it overtakes the data queued before it and the receiver sees the stream reordered.
    small_mask = f"0x{0xFFFF & ~(SMALL_PACKET_BYTES - 1):04x}"
    commands.append(
        [
            *tc,
            *f"filter add dev {dev} parent 1: protocol ip prio 1 u32".split(),
            *f"match u16 0x0000 {small_mask} at 2".split(),
            *f"match u8 {IPV4_NO_OPTIONS:#04x} 0xff at 0 match u8 {IPPROTO_TCP:#04x} 0xff at 9".split(),
            *f"match u8 0x00 {TCP_PSH:#04x} at 33 flowid {UNSHAPED_CLASSID}".split(),
        ]
    )
    for peer in range(layout.num_ranks):
        peer_dim = layout.shaping_dim(rank, peer)
        if peer_dim is None:
            continue
        commands.append(
            [
                *tc,
                *f"filter add dev {dev} parent 1: protocol ip prio 2 u32".split(),
                *f"match ip dst {layout.rank_address(peer)}/32 flowid {dim_classid(peer_dim)}".split(),
            ]
        )
    return commands


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCapabilities:
    """What this host offers before anything is created (no side effects to find out)."""

    is_root: bool
    ip_path: str | None
    tc_path: str | None
    has_netns: bool

    def problem(self) -> str | None:
        """The first reason a testbed cannot be built here, in one line, or ``None``."""
        if not self.has_netns:
            return "this kernel has no network namespaces (/proc/self/ns/net is missing)"
        if self.ip_path is None or self.tc_path is None:
            missing = " and ".join(n for n, p in (("ip", self.ip_path), ("tc", self.tc_path)) if p is None)
            return f"{missing} not found on PATH: install iproute2 (apt-get install -y iproute2)"
        if not self.is_root:
            return "the emulated testbed needs root (network namespaces and tc); run as root"
        return None


def detect_host() -> HostCapabilities:
    return HostCapabilities(
        is_root=os.geteuid() == 0,
        ip_path=shutil.which("ip"),
        tc_path=shutil.which("tc"),
        has_netns=Path("/proc/self/ns/net").exists(),
    )


def require_host() -> HostCapabilities:
    caps = detect_host()
    problem = caps.problem()
    if problem is not None:
        raise TestbedError(problem)
    return caps


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelCapabilities:
    """Queueing disciplines and filters the kernel accepted in a probe namespace."""

    htb: bool
    u32: bool
    netem: bool
    htb_error: str = ""

    def problem(self) -> str | None:
        if not self.htb:
            return f"the kernel refused an htb qdisc (sch_htb missing?): {self.htb_error}"
        if not self.u32:
            return "the kernel refused a u32 filter (cls_u32 missing?)"
        return None

    def describe(self) -> str:
        """One line: ``htb yes, u32 yes, netem no (no latency emulation)``."""
        netem = "yes" if self.netem else "no (no delay/loss emulation)"
        return f"htb {'yes' if self.htb else 'no'}, u32 {'yes' if self.u32 else 'no'}, netem {netem}"


def probe_commands(netns: str) -> dict[str, list[list[str]]]:
    """Per feature, the commands that succeed only if the kernel has it (on ``lo``)."""
    tc = ["tc", "-n", netns]
    return {
        "htb": [[*tc, "qdisc", "replace", "dev", "lo", "root", "handle", "1:", "htb", "default", "1"]],
        "u32": [
            [
                *tc,
                *["filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32"],
                *["match", "ip", "dst", "127.0.0.1/32", "flowid", "1:1"],
            ]
        ],
        "netem": [[*tc, "qdisc", "replace", "dev", "lo", "root", "netem", "delay", "1ms"]],
        "cleanup": [[*tc, "qdisc", "del", "dev", "lo", "root"]],
    }
