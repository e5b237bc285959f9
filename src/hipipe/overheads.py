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
- ``concurrency_slowdown``: the fraction by which an op's bandwidth term grows for
  each *other* dimension moving data on the rank when it starts (shared cores, NIC
  or memory). Not linear: :mod:`hipipe.predict` applies it.
- ``jitter_s``: the mean of the random delay with which each member of an op's group
  arrives (exponential: a thread woken late, a rank descheduled). An op starts when its
  last member arrives, so it pays the maximum of ``n`` such delays (``n`` the group's
  NPUs): bigger groups wait longer. Absolute, not relative to the op's length: on the
  testbed a one-op schedule of 3.4 s varies by 0.4% between runs while ops of a few ms
  inside a pipeline vary by tens of percent. A pipeline waits for the later of two ops
  at every hand-over, so the delays cost more the more ops run in parallel paths; not
  linear either: :mod:`hipipe.predict` samples it.

All default to zero: a topology without ``overheads`` is the plain alpha-beta model.
"""

import contextlib
import math
from dataclasses import dataclass, fields
from typing import Any

from hipipe.errors import TopologyError


@dataclass(frozen=True, kw_only=True, slots=True)
class Overheads:
    """Extra costs of real runs, all zero by default (see the module docstring)."""

    op_s: float = 0.0
    handoff_s: float = 0.0
    memory_bytes_per_s: float = 0.0
    """0: the local reduction is free (the plain alpha-beta model)."""
    concurrency_slowdown: float = 0.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        for item in fields(self):
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
        return all(getattr(self, item.name) == 0 for item in fields(self))

    @property
    def is_linear(self) -> bool:
        """True when the LP and the deterministic simulator charge every term exactly."""
        return self.concurrency_slowdown == 0 and self.jitter_s == 0

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

    def to_dict(self) -> dict[str, float]:
        return {item.name: getattr(self, item.name) for item in fields(self)}

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
        return cls(**data)

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
        return ", ".join(parts)
