"""Calibrated cost-model terms beyond alpha-beta (docs/MODEL.md section 10).

The alpha-beta model charges an op ``latency + bytes / bandwidth`` and nothing else.
Real runs pay more, and what they pay grows with the number of ops, which is what makes
many-chunk schedules (Themis' 64 chunks, pipelined) slower than predicted while
few-chunk ones hold. :class:`Overheads` names each extra cost so that ``hipipe
calibrate`` can measure it and every consumer charges the same thing:

- ``op_s``: a fixed cost every op pays on its dimension (launch, first-message
  round trips, a thread waking up). Linear: the chunk-size LP and the simulator
  charge it exactly.
- ``handoff_s``: the delay between a chunk's op ending on one dimension and its next
  op starting on another (the executor's threads hand the chunk over). Linear.
- ``memory_bytes_per_s``: the rank's memory bandwidth for the local reduction: a
  reducing step reads two buffers and writes one, so a ReduceScatter over ``n`` ranks
  on ``S`` bytes pays ``3 (n-1)/n S / memory_bytes_per_s`` (ASTRA-sim's
  ``local-mem-bw``). 0 means not charged. Linear in bytes.
- ``concurrency_slowdown``: the fraction by which an op's time grows for each *other*
  dimension moving data on the rank while it runs (shared cores, NIC or memory; on
  a shared host the cores matter as much as the wire, so the whole op stretches). Not linear: :mod:`hipipe.predict` applies it.
- ``jitter_s``: the mean of the random delay with which each member of an op's group
  arrives (exponential: a thread woken late, a rank descheduled). An op starts when its
  last member arrives, so it pays the maximum of ``n`` such delays (``n`` the group's
  NPUs): bigger groups wait longer. Absolute, not relative to the op's length: on the
  testbed a one-op schedule of 3.4 s varies by 0.4% between runs while ops of a few ms
  inside a pipeline vary by tens of percent. A pipeline waits for the later of two ops
  at every hand-over, so the delays cost more the more ops run in parallel paths; not
  linear either: :mod:`hipipe.predict` samples it.
- ``op_curves``: per dimension and phase, the measured mean time of one op *streamed*
  back to back on that dimension, at several sizes (:class:`OpCurve`). On a shared host
  a small op pays per ring step for every rank to be woken and scheduled, which the
  kernel hides under the transfer of a large op: the measured time is not a line in
  the size (on the 2-core testbed, 64 KiB ops on a 25 Mbit/s ring of 4 take 2.0x their
  wire time, 4 MiB ops 1.05x), so :mod:`hipipe.predict` reads single-dimension ops off
  these curves (interpolated) instead of the line, and the jitter then only spreads
  them around that mean. A second, ``busy`` curve per (dim, phase), timed while every
  other dim streamed its own ops, gives the op's time when it shares the rank: an op
  during which ``m`` of the ``D - 1`` other dims move data takes its alone time plus
  ``m / (D - 1)`` of the difference (with busy curves the scalar concurrency slowdown
  is not fitted: on a 2-core host the contention is for the cores, so it is large for
  small ops and small for large ones). Not linear: the LP and the simulator keep the lines.
- ``host_cores``, ``host_ranks``, ``cpu_step_s``, ``cpu_byte_s``: the host's CPU. Every
  ring step of an op costs a rank ``cpu_step_s`` of CPU (threads woken, system calls)
  and every byte it sends ``cpu_byte_s`` (copies, the kernel's network stack, the
  reduction); ``host_ranks`` ranks share ``host_cores`` CPUs, so no schedule ends before
  its whole CPU work, ``host_ranks * sum over its ops``, divided by ``host_cores``. On a
  host with a core or more per rank this never binds; on the 2-core testbed (8 ranks) a
  many-op schedule runs near it (Themis' 64 chunks kept both cores 94-99% busy). A
  bound on the whole run, not a cost of one op: :mod:`hipipe.predict` applies it.

All default to zero: a topology without ``overheads`` is the plain alpha-beta model.
"""

import bisect
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from hipipe.errors import TopologyError

PHASES = ("RS", "AG")


@dataclass(frozen=True, kw_only=True, slots=True)
class OpCurve:
    """Measured mean time of one streamed op on one dimension: ``(full_bytes, seconds)`` points.

    ``full_bytes`` is the op's wide side per NPU (RS input, AG output), as in the cost
    model; the time includes everything the op paid (latency, wire, reduction, waking
    up), which is why it replaces the line rather than adding to it.
    """

    dim: int
    phase: str
    """``RS`` or ``AG``."""
    points: tuple[tuple[float, float], ...]
    busy: bool = False
    """Timed while every other dimension streamed its own ops too (the concurrency pass):
    what the op takes when it shares the rank with all the others."""

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise TopologyError(f"an op curve's phase must be RS or AG, got {self.phase!r}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise TopologyError(f"an op curve's dim must be an integer >= 0, got {self.dim!r}")
        try:
            points = tuple(sorted((float(b), float(t)) for b, t in self.points))
        except (TypeError, ValueError) as exc:
            raise TopologyError(f"op curve points must be [bytes, seconds] pairs: {exc}") from None
        if not points or any(
            not (math.isfinite(b) and b > 0 and math.isfinite(t) and t > 0) for b, t in points
        ):
            raise TopologyError("an op curve needs points [bytes > 0, seconds > 0]")
        if len({b for b, _ in points}) != len(points):
            raise TopologyError("an op curve has two points at the same size")
        object.__setattr__(self, "points", points)

    def time_s(self, full_bytes: float, line_s: Callable[[float], float]) -> float:
        """The op's time at ``full_bytes``: piecewise linear between the points.

        Below the first point the curve takes the shape of the line ``line_s`` (the fitted
        alpha-beta time of this dimension), scaled to meet that point; above the last it
        continues the last segment's slope, which is the wire's own (the line's is fitted
        over every size, and small ops bend it). One point: the line's shape both ways.
        """
        sizes = [b for b, _ in self.points]
        if full_bytes <= sizes[0]:
            first_b, first_t = self.points[0]
            return first_t * line_s(full_bytes) / line_s(first_b) if line_s(first_b) > 0 else first_t
        if full_bytes >= sizes[-1]:
            last_b, last_t = self.points[-1]
            if len(self.points) == 1:
                return last_t + line_s(full_bytes) - line_s(last_b)
            before_b, before_t = self.points[-2]
            slope = max(0.0, (last_t - before_t) / (last_b - before_b))
            return last_t + slope * (full_bytes - last_b)
        right = bisect.bisect_left(sizes, full_bytes)
        (b0, t0), (b1, t1) = self.points[right - 1], self.points[right]
        return t0 + (t1 - t0) * (full_bytes - b0) / (b1 - b0)

    def to_dict(self) -> dict[str, Any]:
        data = {"dim": self.dim, "phase": self.phase, "points": [[b, t] for b, t in self.points]}
        return data | ({"busy": True} if self.busy else {})

    @classmethod
    def from_dict(cls, data: Any) -> "OpCurve":
        if not isinstance(data, dict) or not {"dim", "phase", "points"} <= set(data) <= {
            "dim",
            "phase",
            "points",
            "busy",
        }:
            raise TopologyError(f"an op curve is a mapping with dim, phase, points (and busy), got {data!r}")
        if not isinstance(data.get("busy", False), bool):
            raise TopologyError(f"an op curve's busy must be true or false, got {data['busy']!r}")
        points = data["points"]
        if not isinstance(points, list) or any(
            not isinstance(p, list | tuple) or len(p) != 2 for p in points
        ):
            raise TopologyError(f"op curve points must be [bytes, seconds] pairs, got {points!r}")
        return cls(
            dim=data["dim"],
            phase=str(data["phase"]),
            points=tuple((p[0], p[1]) for p in points),
            busy=data.get("busy", False),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Overheads:
    """Extra costs of real runs, all zero by default (see the module docstring)."""

    op_s: float = 0.0
    handoff_s: float = 0.0
    memory_bytes_per_s: float = 0.0
    """0: the local reduction is free (the plain alpha-beta model)."""
    concurrency_slowdown: float = 0.0
    jitter_s: float = 0.0
    op_curves: tuple[OpCurve, ...] = ()
    """Measured streamed op times per (dim, phase); empty: every op follows its line."""
    host_cores: float = 0.0
    """CPUs the ranks of one host share (0: the host's CPU is not charged)."""
    host_ranks: float = 0.0
    """Ranks on that host."""
    cpu_step_s: float = 0.0
    """Host CPU seconds one rank spends per ring step of an op."""
    cpu_byte_s: float = 0.0
    """Host CPU seconds one rank spends per byte it sends (``(n-1)/n`` of the op's bytes)."""

    def __post_init__(self) -> None:
        curves = tuple(self.op_curves)
        if any(not isinstance(c, OpCurve) for c in curves):
            raise TopologyError("overheads.op_curves must hold op curves")
        keys = [(c.dim, c.phase, c.busy) for c in curves]
        if len(set(keys)) != len(keys):
            raise TopologyError("overheads.op_curves has two curves for one dim and phase")
        object.__setattr__(self, "op_curves", tuple(sorted(curves, key=lambda c: (c.dim, c.phase, c.busy))))
        for item in fields(self):
            if item.name == "op_curves":
                continue
            value = getattr(self, item.name)
            if isinstance(value, str):  # YAML 1.1 reads 5e9 as a string
                with contextlib.suppress(ValueError):
                    value = float(value)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TopologyError(f"overheads.{item.name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise TopologyError(f"overheads.{item.name} must be finite and >= 0, got {value!r}")
            object.__setattr__(self, item.name, float(value))

    @property
    def is_zero(self) -> bool:
        """True for the plain alpha-beta model."""
        return not self.op_curves and all(
            getattr(self, item.name) == 0 for item in fields(self) if item.name != "op_curves"
        )

    @property
    def is_linear(self) -> bool:
        """True when the LP and the deterministic simulator charge every term exactly."""
        return (
            self.concurrency_slowdown == 0
            and self.jitter_s == 0
            and not self.op_curves
            and not self.charges_cpu
        )

    @property
    def charges_cpu(self) -> bool:
        """Whether the host's CPU bounds a run (:func:`hipipe.predict.cpu_bound_s`)."""
        return self.host_cores > 0 and self.host_ranks > 0 and (self.cpu_step_s > 0 or self.cpu_byte_s > 0)

    def op_cpu_s(self, group_npus: int, full_bytes: float) -> float:
        """One rank's CPU for one ring op over ``group_npus`` ranks on ``full_bytes``."""
        steps = group_npus - 1
        return steps * self.cpu_step_s + steps / group_npus * full_bytes * self.cpu_byte_s

    def curve(self, dim: int, phase: str, *, busy: bool = False) -> OpCurve | None:
        """The measured curve of ``phase`` ops on ``dim`` (alone, or with every other dim busy)."""
        return next((c for c in self.op_curves if (c.dim, c.phase, c.busy) == (dim, phase, busy)), None)

    def reduction_s(self, group_npus: int, full_bytes: float) -> float:
        """Local reduction of one ReduceScatter over ``group_npus`` ranks on ``full_bytes``."""
        if self.memory_bytes_per_s == 0:
            return 0.0
        return self.reduction_s_per_byte(group_npus) * full_bytes

    def reduction_s_per_byte(self, group_npus: int) -> float:
        """``3 (n-1)/n / memory_bytes_per_s``: read two buffers, write one, per reduced byte."""
        if self.memory_bytes_per_s == 0:
            return 0.0
        return 3.0 * (group_npus - 1) / group_npus / self.memory_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        numbers: dict[str, Any] = {
            item.name: getattr(self, item.name) for item in fields(self) if item.name != "op_curves"
        }
        return numbers | ({"op_curves": [c.to_dict() for c in self.op_curves]} if self.op_curves else {})

    @classmethod
    def from_dict(cls, data: Any) -> "Overheads":
        if not isinstance(data, dict):
            raise TopologyError(f"overheads must be a mapping, got {data!r}")
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TopologyError(
                f"unknown overheads {', '.join(map(str, unknown))} (use {', '.join(sorted(known))})"
            )
        curves = data.get("op_curves") or []
        if not isinstance(curves, list):
            raise TopologyError(f"overheads.op_curves must be a list, got {curves!r}")
        numbers = {key: value for key, value in data.items() if key != "op_curves"}
        return cls(**numbers, op_curves=tuple(OpCurve.from_dict(c) for c in curves))

    def describe(self) -> str:
        """One line for reports; ``none`` for the plain model."""
        if self.is_zero:
            return "none (alpha-beta only)"
        parts = []
        if self.op_s:
            parts.append(f"{self.op_s * 1e3:.3g} ms/op")
        if self.handoff_s:
            parts.append(f"{self.handoff_s * 1e3:.3g} ms hand-off")
        if self.memory_bytes_per_s:
            parts.append(f"reduction at {self.memory_bytes_per_s / 1e9:.3g} GB/s")
        if self.concurrency_slowdown:
            parts.append(f"+{100 * self.concurrency_slowdown:.3g}% per other busy dim")
        if self.jitter_s:
            parts.append(f"{self.jitter_s * 1e3:.3g} ms mean jitter")
        if self.charges_cpu:
            parts.append(
                f"{self.host_ranks:g} ranks on {self.host_cores:.3g} CPUs"
                f" ({self.cpu_step_s * 1e3:.3g} ms/step, {self.cpu_byte_s * 1e9:.3g} s/GB)"
            )
        if self.op_curves:
            busy = " (alone and with the other dims busy)" if any(c.busy for c in self.op_curves) else ""
            parts.append(f"streamed op times measured on {len({c.dim for c in self.op_curves})} dims{busy}")
        return ", ".join(parts)
