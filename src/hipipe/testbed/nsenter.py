"""Enter a named network namespace from Python (the calling thread only).

``setns(2)`` on a network namespace changes the namespace of the calling thread; every
socket it creates afterwards lives there, and sockets made before keep their old one.
That is why a worker enters its namespace first, before torch or Gloo open anything,
and why the ratecheck and the parent's rendezvous store use one dedicated thread per
namespace. Python 3.11 has no ``os.setns``, hence ctypes.
"""

import ctypes
import ctypes.util
import os
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = Path("/run/netns")
"""Where ``ip netns add`` bind-mounts each named namespace."""


def enter_netns(name: str) -> None:
    """Move the calling thread into the network namespace ``name``."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fd = os.open(NETNS_RUN_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name!r}: {os.strerror(errno)}")
    finally:
        os.close(fd)
