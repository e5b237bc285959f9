"""The tuning cache: measured-fastest schedules keyed by (topology, collective, size, dtype).

A JSON file any consumer can read without torch (``hipipe run``, the DDP hook, FSDP
comms, ``hipipe bench --tuned``). Entries are keyed by a :class:`TuningKey`: a
fingerprint of the topology's dimensions (not its name: the same network under two
names is one network), the collective, the message size in bytes and the dtype. Each
entry keeps the kept schedule and every candidate's measured times, so the choice can
be checked later.

Writes are atomic (read, replace one entry, rename into place), so a crash never
leaves half a cache. A file that is not a tuning cache is an error in one line, never
a silent fallback to planning: a run that silently stops using its tuned schedules
would be slower for no visible reason.
"""

import hashlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hipipe.errors import HipipeError
from hipipe.files import atomic_write_text
from hipipe.schedule import Collective, Schedule, schedule_from_dict, schedule_to_dict
from hipipe.topology import Topology

CACHE_FORMAT = "hipipe.tuning-cache"
CACHE_VERSION = 1


class TuningError(HipipeError):
    """A tuning cache is unreadable, or tuning cannot run as asked."""


def topology_fingerprint(topology: Topology) -> str:
    """Stable short hash of what the cost model sees: each dim's kind, size, bandwidth, latency, algorithm.

    ``repr`` of the floats is exact, so a topology read back from YAML or JSON hashes the
    same; the name is left out on purpose.
    """
    dims = [
        [
            d.kind.value,
            d.size,
            repr(float(d.bandwidth_bytes_per_s)),
            repr(float(d.latency_s)),
            d.algorithm.value,
        ]
        for d in topology.dims
    ]
    return hashlib.sha256(json.dumps(dims).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class TuningKey:
    """What a tuned schedule is for."""

    topology: str
    """:func:`topology_fingerprint` of the topology the caller names."""
    collective: Collective
    message_bytes: int
    dtype: str

    @staticmethod
    def of(topology: Topology, collective: Collective | str, message_bytes: int, dtype: str) -> "TuningKey":
        return TuningKey(
            topology=topology_fingerprint(topology),
            collective=Collective.parse(collective),
            message_bytes=int(message_bytes),
            dtype=dtype,
        )

    def label(self) -> str:
        return f"{self.topology}/{self.collective.value}/{self.message_bytes}/{self.dtype}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """One candidate's measured runs: the slowest rank's time of each timed repeat."""

    name: str
    """``hipipe K=8``, ``themis``, ...: unique within one tuning."""
    planner: str
    num_chunks: int
    predicted_s: float
    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (the median included, for readers of the file)."""
        return {
            "name": self.name,
            "planner": self.planner,
            "num_chunks": self.num_chunks,
            "predicted_s": self.predicted_s,
            "times_s": list(self.times_s),
            "median_s": self.median_s,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class TunedEntry:
    """One cache entry: the kept schedule and the measurements it was chosen from."""

    key: TuningKey
    chosen: str
    """Name of the kept candidate (the measured fastest)."""
    schedule: Schedule
    measurements: tuple[Measurement, ...]
    warmup: int
    source: str
    """Where it was measured (``testbed 2x2 at 40,120Mbit``, ``torchrun``)."""
    topology_name: str = ""
    """The topology's name when tuned (for people; the key uses the fingerprint)."""


def _entry_to_dict(entry: TunedEntry) -> dict[str, Any]:
    return {
        "topology": entry.key.topology,
        "collective": entry.key.collective.value,
        "message_bytes": entry.key.message_bytes,
        "dtype": entry.key.dtype,
        "topology_name": entry.topology_name,
        "source": entry.source,
        "warmup": entry.warmup,
        "chosen": entry.chosen,
        "measurements": [m.to_dict() for m in entry.measurements],
        "schedule": schedule_to_dict(entry.schedule),
    }


def _entry_from_dict(data: dict[str, Any]) -> TunedEntry:
    return TunedEntry(
        key=TuningKey(
            topology=str(data["topology"]),
            collective=Collective.parse(data["collective"]),
            message_bytes=int(data["message_bytes"]),
            dtype=str(data["dtype"]),
        ),
        chosen=str(data["chosen"]),
        schedule=schedule_from_dict(data["schedule"]),
        measurements=tuple(
            Measurement(
                name=str(m["name"]),
                planner=str(m["planner"]),
                num_chunks=int(m["num_chunks"]),
                predicted_s=float(m["predicted_s"]),
                times_s=tuple(float(t) for t in m["times_s"]),
            )
            for m in data["measurements"]
        ),
        warmup=int(data["warmup"]),
        source=str(data["source"]),
        topology_name=str(data.get("topology_name", "")),
    )


def read_cache(path: str | Path) -> dict[TuningKey, TunedEntry]:
    """Every entry of the cache at ``path``; empty if the file does not exist yet.

    Raises :class:`TuningError` (one line) if the file exists but is not a readable cache.
    """
    target = Path(path)
    if not target.exists():
        return {}
    try:
        data = json.loads(target.read_text())
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise ValueError(f"not a {CACHE_FORMAT} file")
        if data.get("version") != CACHE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, this hipipe reads {CACHE_VERSION}")
        entries = [_entry_from_dict(e) for e in data["entries"]]
    except (ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TuningError(f"tuning cache {str(target)!r} is unreadable ({first}): fix or delete it") from None
    return {e.key: e for e in entries}


def write_entry(path: str | Path, entry: TunedEntry) -> None:
    """Add ``entry`` to the cache at ``path`` (replacing one with the same key), atomically."""
    entries = read_cache(path)
    entries[entry.key] = entry
    document = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "entries": [_entry_to_dict(entries[k]) for k in sorted(entries)],
    }
    atomic_write_text(path, json.dumps(document, indent=1) + "\n")


def find_entry(
    cache: str | Path, topology: Topology, collective: Collective | str, message_bytes: int, dtype: str
) -> TunedEntry | None:
    return read_cache(cache).get(TuningKey.of(topology, collective, message_bytes, dtype))


def load_tuned(
    cache: str | Path, topology: Topology, collective: Collective | str, message_bytes: int, dtype: str
) -> Schedule | None:
    """The tuned schedule for this key, or None if the cache has none (or does not exist).

    The schedule may have been planned on a calibrated version of ``topology`` (its own
    ``topology`` field says which); it runs on the same ranks and dims either way.
    """
    entry = find_entry(cache, topology, collective, message_bytes, dtype)
    return None if entry is None else entry.schedule
