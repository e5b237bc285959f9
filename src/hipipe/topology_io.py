"""Ways in for a topology: preset name, one-line spec, hipipe YAML, ASTRA-sim YAML.

:func:`load_topology` accepts any of them, so every command and API call that asks
for a topology takes the same strings.

One-line spec: dimensions separated by ``,``, fields by ``:``::

    ring:4:100GB/s:1us,switch:8:50GB/s:2us[:halving_doubling]

ASTRA-sim network YAML (``topology``, ``npus_count``, ``bandwidth``, ``latency``): the
analytical backend reads bandwidth in GB/s with 1 GB = 2^30 B and latency in ns per link;
hipipe reads it the same way so that both tools model the same network.
"""

import math
from pathlib import Path
from typing import Any

import yaml

from hipipe.errors import HipipeError, TopologyError
from hipipe.overheads import Overheads
from hipipe.presets import PRESETS
from hipipe.topology import DEFAULT_ALGORITHM, Algorithm, Dimension, Topology, _parse_kind
from hipipe.units import parse_bandwidth_bytes_per_s, parse_time_s

ASTRA_SIM_GB_BYTES = 2**30
"""ASTRA-sim's analytical backend converts GB/s with 2^30 bytes per GB."""

_ASTRA_KINDS = {"ring": "ring", "switch": "switch", "fullyconnected": "fully_connected"}

_ALGORITHM_ALIASES = {
    "ring": Algorithm.RING,
    "direct": Algorithm.DIRECT,
    "hd": Algorithm.HALVING_DOUBLING,
    "halving_doubling": Algorithm.HALVING_DOUBLING,
    "halvingdoubling": Algorithm.HALVING_DOUBLING,
}


def load_topology(source: "Topology | str | Path") -> Topology:
    """A topology from a preset name, a spec string, or a YAML/JSON file path."""
    if isinstance(source, Topology):
        return source
    text = str(source).strip()
    if text in PRESETS:
        return PRESETS[text]()
    path = Path(text)
    if path.suffix.lower() in {".yaml", ".yml", ".json"} or path.exists():
        return read_topology_file(path)
    if ":" in text:
        return parse_spec(text)
    names = ", ".join(PRESETS)
    raise TopologyError(f"unknown topology {text!r}: not a preset ({names}), a spec or a file")


def parse_spec(text: str) -> Topology:
    """Read ``kind:size:bandwidth:latency[:algorithm]`` dimensions separated by commas."""
    dims = []
    for index, part in enumerate(p.strip() for p in text.split(",")):
        fields = [f.strip() for f in part.split(":")]
        if len(fields) not in (4, 5):
            raise TopologyError(
                f"dimension {index} {part!r}: expected kind:size:bandwidth:latency[:algorithm],"
                " e.g. ring:4:100GB/s:1us"
            )
        kind = _parse_kind(fields[0])
        try:
            size = int(fields[1])
        except ValueError:
            raise TopologyError(f"dimension {index}: size {fields[1]!r} is not an integer") from None
        try:
            bandwidth = parse_bandwidth_bytes_per_s(fields[2])
            latency = parse_time_s(fields[3])
        except HipipeError as exc:
            raise TopologyError(f"dimension {index}: {exc}") from None
        algorithm = _parse_algorithm(fields[4]) if len(fields) == 5 else DEFAULT_ALGORITHM[kind]
        dims.append(
            Dimension(
                kind=kind,
                size=size,
                bandwidth_bytes_per_s=bandwidth,
                latency_s=latency,
                algorithm=algorithm,
            )
        )
    return Topology(dims=tuple(dims), name="")


def _parse_algorithm(text: Any) -> Algorithm:
    key = str(text).strip().lower().replace("-", "_")
    if key not in _ALGORITHM_ALIASES:
        raise TopologyError(f"unknown algorithm {text!r} (use ring, direct, halving_doubling)")
    return _ALGORITHM_ALIASES[key]


def read_topology_file(path: Path) -> Topology:
    """hipipe YAML/JSON (``dims:``) or ASTRA-sim network YAML (``topology:``)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"cannot read topology file {str(path)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise TopologyError(f"{path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: expected a mapping with 'dims' (hipipe) or 'topology' (ASTRA-sim)")
    try:
        if "topology" in data and "dims" not in data:
            topo = topology_from_astra_sim(data)
        else:
            topo = topology_from_dict(data)
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from None
    return topo if topo.name else Topology(dims=topo.dims, name=path.stem, overheads=topo.overheads)


def topology_from_astra_sim(data: dict[str, Any]) -> Topology:
    """ASTRA-sim network YAML: parallel lists ``topology``, ``npus_count``, ``bandwidth``, ``latency``."""
    keys = ("topology", "npus_count", "bandwidth", "latency")
    missing = [k for k in keys if k not in data]
    if missing:
        raise TopologyError(f"ASTRA-sim network is missing {', '.join(missing)}")
    lists = {k: data[k] for k in keys}
    for key, value in lists.items():
        if not isinstance(value, list):
            raise TopologyError(f"ASTRA-sim '{key}' must be a list, got {value!r}")
    lengths = {len(v) for v in lists.values()}
    if len(lengths) != 1:
        raise TopologyError("ASTRA-sim lists topology/npus_count/bandwidth/latency differ in length")
    dims = []
    for k, (kind_name, npus, bandwidth_gb, latency_ns) in enumerate(zip(*lists.values(), strict=True)):
        kind_key = str(kind_name).strip().lower().replace("_", "")
        if kind_key not in _ASTRA_KINDS:
            raise TopologyError(
                f"dimension {k}: unknown ASTRA-sim topology {kind_name!r} (Ring, FullyConnected, Switch)"
            )
        kind = _parse_kind(_ASTRA_KINDS[kind_key])
        dims.append(
            Dimension(
                kind=kind,
                size=_as_int(npus, f"dimension {k} npus_count"),
                bandwidth_bytes_per_s=_as_float(bandwidth_gb, f"dimension {k} bandwidth")
                * ASTRA_SIM_GB_BYTES,
                latency_s=_as_float(latency_ns, f"dimension {k} latency") * 1e-9,
                algorithm=DEFAULT_ALGORITHM[kind],
            )
        )
    return Topology(dims=tuple(dims), name=str(data.get("name", "")))


def topology_from_dict(data: Any) -> Topology:
    """hipipe's own format: ``{name, dims: [{kind, size, bandwidth, latency, algorithm}]}``.

    Each dimension gives its bandwidth as ``bandwidth`` (a string with a unit),
    ``bandwidth_gbps`` or ``bandwidth_bytes_per_s``, and its latency as ``latency``,
    ``latency_ns`` or ``latency_s``.
    """
    if not isinstance(data, dict) or not isinstance(data.get("dims"), list):
        raise TopologyError("a topology needs a 'dims' list")
    dims = []
    for k, entry in enumerate(data["dims"]):
        if not isinstance(entry, dict):
            raise TopologyError(f"dimension {k}: expected a mapping, got {entry!r}")
        try:
            dims.append(_dimension_from_dict(entry))
        except HipipeError as exc:
            raise TopologyError(f"dimension {k}: {exc}") from None
    overheads = Overheads.from_dict(data["overheads"]) if data.get("overheads") is not None else Overheads()
    return Topology(dims=tuple(dims), name=str(data.get("name", "") or ""), overheads=overheads)


def _dimension_from_dict(entry: dict[str, Any]) -> Dimension:
    for key in ("kind", "size"):
        if key not in entry:
            raise TopologyError(f"missing '{key}'")
    kind = _parse_kind(entry["kind"])
    if "bandwidth_bytes_per_s" in entry:
        bandwidth = _as_float(entry["bandwidth_bytes_per_s"], "bandwidth_bytes_per_s")
    elif "bandwidth_gbps" in entry:
        bandwidth = _as_float(entry["bandwidth_gbps"], "bandwidth_gbps") * 1e9
    elif "bandwidth" in entry:
        bandwidth = parse_bandwidth_bytes_per_s(str(entry["bandwidth"]))
    else:
        raise TopologyError("missing 'bandwidth' (e.g. bandwidth: 100GB/s)")
    if "latency_s" in entry:
        latency = _as_float(entry["latency_s"], "latency_s")
    elif "latency_ns" in entry:
        latency = _as_float(entry["latency_ns"], "latency_ns") * 1e-9
    elif "latency" in entry:
        latency = parse_time_s(str(entry["latency"]))
    else:
        raise TopologyError("missing 'latency' (e.g. latency: 500ns)")
    algorithm = _parse_algorithm(entry["algorithm"]) if "algorithm" in entry else DEFAULT_ALGORITHM[kind]
    return Dimension(
        kind=kind,
        size=_as_int(entry["size"], "size"),
        bandwidth_bytes_per_s=bandwidth,
        latency_s=latency,
        algorithm=algorithm,
    )


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    """Exact round-trip form (base SI units), used inside schedule JSON and written YAML."""
    return {
        "name": topology.name,
        "dims": [
            {
                "kind": d.kind.value,
                "size": d.size,
                "bandwidth_bytes_per_s": d.bandwidth_bytes_per_s,
                "latency_s": d.latency_s,
                "algorithm": d.algorithm.value,
            }
            for d in topology.dims
        ],
    } | ({} if topology.overheads.is_zero else {"overheads": topology.overheads.to_dict()})


def topology_to_yaml(topology: Topology) -> str:
    """hipipe YAML that :func:`load_topology` reads back exactly."""
    return yaml.safe_dump(topology_to_dict(topology), sort_keys=False)


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise TopologyError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, str):
        # PyYAML (YAML 1.1) reads 5.86e6 as a string (it wants 5.86e+6): accept plain numbers.
        try:
            value = float(value)
        except ValueError:
            raise TopologyError(f"{what} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TopologyError(f"{what} must be a number, got {value!r}")
    return float(value)
