"""Parsing and formatting of quantities with units.

Conventions (docs/MODEL.md section 1): 1 GB = 1e9 bytes for bandwidths; sizes accept both
decimal (KB, MB, GB) and binary (KiB, MiB, GiB) prefixes; a bare byte count is bytes.
Inside the library every quantity is an SI base unit (bytes, bytes/s, seconds).
"""

import math
import re

from hipipe.errors import HipipeError

_SIZE_FACTORS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}

_BANDWIDTH_FACTORS_BYTES_PER_S: dict[str, float] = {
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "bit/s": 1 / 8,
    "kbit/s": 1e3 / 8,
    "mbit/s": 1e6 / 8,
    "gbit/s": 1e9 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "bps": 1 / 8,
    "kbps": 1e3 / 8,
    "mbps": 1e6 / 8,
    "gbps": 1e9 / 8,
}

_TIME_FACTORS_S: dict[str, float] = {
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
}

_NUMBER_UNIT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ/]*)\s*$")


def _split(text: str, what: str) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(text)
    if match is None:
        raise HipipeError(f"cannot read {what} {text!r}: expected a number and a unit")
    return float(match.group(1)), match.group(2).lower()


def parse_size_bytes(text: str | int) -> int:
    """Read a message size such as ``64MiB``, ``1GB`` or ``4096`` into whole bytes (> 0)."""
    if isinstance(text, int):
        value_bytes = text
    else:
        number, unit = _split(text, "size")
        if unit not in _SIZE_FACTORS:
            raise HipipeError(f"unknown size unit {unit!r} in {text!r} (use B, KiB, MiB, GiB, KB, MB, GB)")
        exact = number * _SIZE_FACTORS[unit]
        if not math.isfinite(exact) or abs(exact - round(exact)) > 1e-6 * max(1.0, exact):
            raise HipipeError(f"size {text!r} is not a whole number of bytes")
        value_bytes = round(exact)
    if value_bytes <= 0:
        raise HipipeError(f"message size must be positive, got {text!r}")
    return value_bytes


def parse_sizes_bytes(text: str) -> list[int]:
    """Read a comma-separated list of sizes (``1MiB,16MiB,1GiB``)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise HipipeError("no message size given")
    return [parse_size_bytes(p) for p in parts]


def parse_bandwidth_bytes_per_s(text: str) -> float:
    """Read ``100GB/s`` (1 GB = 1e9 B), ``400Gbit/s`` or ``50Mbit`` into bytes/s (> 0)."""
    number, unit = _split(text, "bandwidth")
    if unit not in _BANDWIDTH_FACTORS_BYTES_PER_S:
        raise HipipeError(f"unknown bandwidth unit {unit!r} in {text!r} (use GB/s, Gbit/s, Mbit)")
    value = number * _BANDWIDTH_FACTORS_BYTES_PER_S[unit]
    if not value > 0:
        raise HipipeError(f"bandwidth must be positive, got {text!r}")
    return value


def parse_time_s(text: str) -> float:
    """Read ``500ns``, ``1us``, ``2ms`` into seconds (>= 0)."""
    number, unit = _split(text, "latency")
    if unit not in _TIME_FACTORS_S:
        raise HipipeError(f"unknown time unit {unit!r} in {text!r} (use ns, us, ms, s)")
    if number < 0:
        raise HipipeError(f"latency must be >= 0, got {text!r}")
    return number * _TIME_FACTORS_S[unit]


def format_size(size_bytes: float) -> str:
    """``1073741824`` -> ``1 GiB``; exact binary multiples print without decimals."""
    for factor, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if size_bytes >= factor:
            value = size_bytes / factor
            return f"{value:.0f} {name}" if value == int(value) else f"{value:.3g} {name}"
    return f"{size_bytes:.0f} B"


def format_time(time_s: float) -> str:
    """Seconds with a unit that keeps 3-4 significant digits (``12.3 us``)."""
    if time_s >= 1:
        return f"{time_s:.3f} s"
    if time_s >= 1e-3:
        return f"{time_s * 1e3:.3f} ms"
    if time_s >= 1e-6:
        return f"{time_s * 1e6:.2f} us"
    return f"{time_s * 1e9:.1f} ns"
