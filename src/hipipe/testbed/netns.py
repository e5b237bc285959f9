"""Create and remove a testbed: namespaces, veth pairs, the hub bridge, tc shaping.

Topology of one testbed (prefix ``hp3f9a``, 4 ranks)::

    hp3f9a-r0 [hp3f9a-r0 10.x.y.1] --veth-- [hp3f9a-h0] \\
    hp3f9a-r1 [hp3f9a-r1 10.x.y.2] --veth-- [hp3f9a-h1]  +- bridge hp3f9a-br 10.x.y.254
    ...                                                  /   (all in namespace hp3f9a-hub)

Nothing is created in the host's own namespace, so no route, address or interface of
the host changes. A state file (``/run/hipipe/testbeds/<prefix>.json``) is written
*before* the first namespace exists, so ``down`` can remove everything a crashed
``up`` made: it kills the processes still inside the namespaces (by pid, from
``ip netns pids``) and deletes the namespaces, which takes their veths, bridge and
qdiscs with them. Only names built from one exact prefix are ever deleted.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hipipe.files import atomic_write_text
from hipipe.testbed.layout import Layout, TestbedError, check_prefix, new_prefix
from hipipe.testbed.shaping import KernelCapabilities, probe_commands, rank_tc_commands, require_host

DEFAULT_STATE_DIR = Path("/run/hipipe/testbeds")
"""On tmpfs: it disappears at reboot together with the namespaces it lists."""

COMMAND_TIMEOUT_S = 20.0


def run(argv: list[str], *, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True) -> str:
    """Run one ``ip``/``tc`` command; a failure becomes a one-line :class:`TestbedError`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} not found: install iproute2 (apt-get install -y iproute2)") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    if check and done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        raise TestbedError(f"`{' '.join(argv)}` failed: {reason}")
    return done.stdout


def link_commands(layout: Layout) -> list[list[str]]:
    """``ip`` argv lists that build the namespaces, bridge and veths (before shaping)."""
    hub = ["ip", "-n", layout.hub_netns]
    commands = [
        ["ip", "netns", "add", layout.hub_netns],
        [*hub, "link", "set", "lo", "up"],
        [*hub, "link", "add", layout.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"],
        [*hub, "link", "set", layout.bridge, "addrgenmode", "none"],
        [*hub, "addr", "add", f"{layout.hub_address}/24", "dev", layout.bridge],
        [*hub, "link", "set", layout.bridge, "up"],
    ]
    for rank in range(layout.num_ranks):
        ns, ifname, hub_if = layout.rank_netns(rank), layout.rank_ifname(rank), layout.hub_ifname(rank)
        rank_ip = ["ip", "-n", ns]
        commands += [
            ["ip", "netns", "add", ns],
            [*rank_ip, "link", "set", "lo", "up"],
            [*hub, "link", "add", hub_if, "type", "veth", "peer", "name", ifname, "netns", ns],
            [*hub, "link", "set", hub_if, "addrgenmode", "none"],
            [*hub, "link", "set", hub_if, "master", layout.bridge],
            [*hub, "link", "set", hub_if, "up"],
            # IPv4 only: no link-local IPv6 address for Gloo to pick by mistake.
            [*rank_ip, "link", "set", ifname, "addrgenmode", "none"],
            # Small GSO packets: htb lets a whole super-packet through on credit, and at the
            # default 64 KB a 40 KB message after idle crossed a 50 Mbit/s class in 0.24 ms
            # instead of 6.4 -- small ops beat the rate, and the calibration with them.
            # 16 KB: 4.8 ms, while 2 cores still shape 4 x 400 Mbit/s (1 MSS: only ~100).
            [*rank_ip, "link", "set", ifname, "gso_max_size", "16384"],
            [*rank_ip, "addr", "add", f"{layout.rank_address(rank)}/24", "dev", ifname],
            [*rank_ip, "link", "set", ifname, "up"],
            # Pin TCP to loss-based cubic on the testbed's subnet, whatever the host's
            # default: BBR paces each connection at its own estimate of the bottleneck,
            # and on an htb class with a collective's app-limited bursts that estimate
            # ran some message sizes at half the class rate (64 KiB ReduceScatters on a
            # 25 Mbit/s ring of 4: 1.94x their wire time under BBR, 1.08x under cubic;
            # 56 KiB ones 1.04x under both), so op time was not a function of bytes.
            [
                *rank_ip,
                *("route", "replace", f"{layout.subnet_base}.0/24", "dev", ifname),
                *("proto", "kernel", "scope", "link", "src", layout.rank_address(rank)),
                *("congctl", TCP_CONGESTION_CONTROL),
            ],
        ]
    return commands


TCP_CONGESTION_CONTROL = "cubic"
"""Congestion control of every rank-to-rank connection (per route; see :func:`link_commands`)."""


RANK_SYSCTLS: tuple[str, ...] = ("net.ipv4.tcp_slow_start_after_idle=0", "net.ipv4.tcp_early_retrans=0")
"""Per-namespace TCP settings.

- no slow start after idle: a collective's connection idles between ops and must not
  fall back to slow start each time (what a tuned cluster host does too);
- no tail loss probes: a segment waits in its htb class for as long as the bytes queued
  ahead of it take at the class rate, far beyond twice the RTT an idle connection
  measured, so the probe fired for segments still queued on the host. Over one job of
  24 runs of 4 MiB pipelined and Themis schedules on 2x4 at 100 Mbit/s that was 416
  probes and 431 retransmitted segments, every one a duplicate (431 DSACKs back, no
  qdisc drop); with probes off, 20 retransmissions. The shaped links never drop (htb
  queues, no loss emulation), so nothing is left for a probe to recover."""


def sysctl_commands(layout: Layout) -> list[list[str]]:
    return [
        ["ip", "netns", "exec", layout.rank_netns(rank), "sysctl", "-q", "-w", setting]
        for rank in range(layout.num_ranks)
        for setting in RANK_SYSCTLS
    ]


def shaping_commands(layout: Layout) -> list[list[str]]:
    return [cmd for rank in range(layout.num_ranks) for cmd in rank_tc_commands(layout, rank)]


def probe_kernel(netns: str) -> KernelCapabilities:
    """Try htb, u32 and netem on ``netns``'s loopback; leave it as it was."""
    commands = probe_commands(netns)
    results: dict[str, bool] = {}
    htb_error = ""
    for feature in ("htb", "u32", "netem"):
        try:
            for argv in commands[feature]:
                run(argv)
            results[feature] = True
        except TestbedError as exc:
            results[feature] = False
            if feature == "htb":
                htb_error = str(exc)
                results["u32"] = False
                break
    for argv in commands["cleanup"]:
        run(argv, check=False)
    return KernelCapabilities(
        htb=results["htb"],
        u32=results.get("u32", False),
        netem=results.get("netem", False),
        htb_error=htb_error,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Testbed:
    """A testbed that is up: its layout, what the kernel offers, where its state lives."""

    __test__ = False

    layout: Layout
    kernel: KernelCapabilities
    state_path: Path


def state_path(prefix: str, state_dir: Path = DEFAULT_STATE_DIR) -> Path:
    return state_dir / f"{check_prefix(prefix)}.json"


def _write_state(path: Path, layout: Layout, status: str, kernel: KernelCapabilities | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "format": "hipipe.testbed",
        "prefix": layout.prefix,
        "sizes": list(layout.sizes),
        "rates_bits_per_s": list(layout.rates_bits_per_s),
        "netns": list(layout.all_netns()),
        "status": status,
        "owner_pid": os.getpid(),
        "created_unix_s": time.time(),
    }
    if kernel is not None:
        document["kernel"] = kernel.describe()
    atomic_write_text(path, json.dumps(document, indent=1) + "\n")


def read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TestbedError(f"cannot read testbed state {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != "hipipe.testbed":
        raise TestbedError(f"{path} is not a hipipe testbed state file")
    return data


def layout_from_state(data: dict[str, Any]) -> Layout:
    return Layout(
        prefix=str(data["prefix"]),
        sizes=tuple(int(s) for s in data["sizes"]),
        rates_bits_per_s=tuple(float(r) for r in data["rates_bits_per_s"]),
    )


def up(
    sizes: tuple[int, ...],
    rates_bits_per_s: tuple[float, ...],
    *,
    prefix: str | None = None,
    state_dir: Path = DEFAULT_STATE_DIR,
) -> Testbed:
    """Build a testbed; on any failure remove what was made and raise one line."""
    require_host()
    if prefix is None:
        prefix = new_prefix()
        while state_path(prefix, state_dir).exists() or existing_netns(prefix):
            prefix = new_prefix()
    layout = Layout(prefix=prefix, sizes=sizes, rates_bits_per_s=rates_bits_per_s)
    path = state_path(prefix, state_dir)
    if path.exists() or existing_netns(prefix):
        raise TestbedError(f"a testbed with prefix {prefix} already exists (hipipe testbed down {prefix})")
    _write_state(path, layout, "creating")
    try:
        for argv in link_commands(layout)[:2]:
            run(argv)
        kernel = probe_kernel(layout.hub_netns)
        problem = kernel.problem()
        if problem is not None:
            raise TestbedError(problem)
        for argv in link_commands(layout)[2:]:
            run(argv)
        for argv in shaping_commands(layout):
            run(argv)
        for argv in sysctl_commands(layout):
            run(argv, check=False)  # a tuning, not a requirement (sysctl may be missing)
    except BaseException:
        down(prefix, state_dir=state_dir)
        raise
    _write_state(path, layout, "up", kernel)
    return Testbed(layout=layout, kernel=kernel, state_path=path)


def list_netns() -> list[str]:
    """Names of all network namespaces (first word of each ``ip netns list`` line)."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def existing_netns(prefix: str) -> list[str]:
    """Namespaces that belong to exactly this prefix: ``<prefix>-hub`` and ``<prefix>-r<n>``."""
    pattern = re.compile(rf"^{re.escape(check_prefix(prefix))}-(hub|r[0-9]+)$")
    return [name for name in list_netns() if pattern.match(name)]


def kill_netns_processes(netns: str, grace_s: float = 2.0) -> None:
    """Stop processes left inside one of our namespaces (a crashed worker), by pid."""
    pids = [int(p) for p in run(["ip", "netns", "pids", netns], check=False).split() if p.isdigit()]
    pids = [p for p in pids if p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if Path(f"/proc/{p}").exists()]


def down(prefix: str, *, state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Remove every namespace of the testbed ``prefix`` and its state file.

    Works after a crash: the namespaces come from the state file and from the host's
    list, filtered by the exact prefix. Returns the namespaces deleted.
    """
    check_prefix(prefix)
    path = state_path(prefix, state_dir)
    names: set[str] = set(existing_netns(prefix))
    if path.exists():
        with contextlib.suppress(TestbedError):
            names.update(str(n) for n in read_state(path).get("netns", []))
    present = set(list_netns())
    deleted = []
    # Ranks before the hub: deleting a rank's namespace destroys its veth pair.
    for name in sorted(names, key=lambda n: (n.endswith("-hub"), n)):
        if not name.startswith(f"{prefix}-") or name not in present:
            continue
        kill_netns_processes(name)
        run(["ip", "netns", "delete", name])
        deleted.append(name)
    path.unlink(missing_ok=True)
    return deleted


def known_prefixes(state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Prefixes with a state file (testbeds up, or left behind by a crash)."""
    if not state_dir.is_dir():
        return []
    return sorted(p.stem for p in state_dir.glob("hp*.json") if re.match(r"^hp[0-9a-f]{4}$", p.stem))


def tc_class_stats(layout: Layout, rank: int) -> str:
    return run(["tc", "-n", layout.rank_netns(rank), "-s", "class", "show", "dev", layout.rank_ifname(rank)])
