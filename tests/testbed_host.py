"""Whether this host can build testbeds: the one skip reason the root-only tests share."""

import os
import shutil
import subprocess
from pathlib import Path


def root_skip_reason() -> str | None:
    """Why the root-only testbed tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not found: install iproute2"
    if not Path("/proc/self/ns/net").exists():
        return "no network namespace support in this kernel"
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode != 0:
        return "`ip netns list` fails: no netns support"
    return None


def unused_prefix() -> str:
    """A fresh testbed prefix no namespace on this host carries: the test's own name space."""
    from hipipe.testbed import netns
    from hipipe.testbed.layout import new_prefix

    prefix = new_prefix()
    while netns.existing_netns(prefix):
        prefix = new_prefix()
    return prefix
