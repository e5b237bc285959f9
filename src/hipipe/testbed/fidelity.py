"""How far a testbed benchmark agrees with its predictions, per cell. Pure and torch-free.

A *cell* is one testbed (shape, rates) at one message size. Per cell this module
computes what the fidelity report shows and what issue 12 sets goals on:

- every planner's measured / predicted (median of the timed repeats over the
  prediction on the calibrated topology);
- the measured *spread*: ``(max - min) / median`` of a row's timed repeats, the
  run-to-run noise any comparison of two rows has to be read against;
- the planner *pairs* the measurement ranks in the predicted order (4 planners: 6
  pairs), naming the pairs that disagree;
- hipipe's reduction vs themis, measured beside simulated (from the predictions);
- ``hipipe-tuned`` against the fastest measured baseline, within the spread.

:func:`cell_fidelity` returns the numbers and the four goal checks; the reports
(:mod:`hipipe.report.bench`) and ``benchmarks/testbed.py`` only render them, so the
terminal card, the markdown and ``hipipe bench --json`` say the same thing.
"""

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hipipe.testbed.results import THEMIS, TUNED_NAME, BenchResult, BenchRow, is_torch_row

FIDELITY_PLANNERS: tuple[str, ...] = ("hipipe", THEMIS, "pipelined", "hierarchical")
"""The planners whose pairwise order the ranking goal counts (6 pairs)."""

REDUCTION_PLANNER = "hipipe"
"""Whose reduction vs themis the goal compares, measured against simulated."""

RATIO_GOAL = 0.10
"""Every planner's measured / predicted within this of 1."""

REDUCTION_GOAL_POINTS = 5.0
"""Measured reduction vs themis within this many percentage points of the simulated one."""

MAX_MISORDERED_PAIRS = 1
"""At most this many planner pairs ranked against the prediction (5 of 6 with 4 planners)."""

HOST_BOUND_BUSY_SHARE = 0.85
"""A row kept at least this share of the CPUs the ranks can keep busy (the calibration's
``host_cores``) ..."""

HOST_BOUND_CORRELATION = 0.8
"""... and its runs' times followed their host CPU seconds this closely (Pearson's r): it
was *host-bound*, its time the CPU the host spent, not the wire's. On the 2-core testbed
the many-op rows showed r 0.95-0.99 at 1.80-1.94 busy CPUs, wire-bound ``hierarchical`` rows
-0.52-0.55 at 0.26-0.48 (docs/MODEL.md section 10)."""

GOAL_RATIO = "measured/predicted within 10%"
GOAL_REDUCTION = "reduction vs themis within 5 points of simulated"
GOAL_PAIRS = "pairs ranked as predicted (>= 5 of 6)"
GOAL_TUNED = "hipipe-tuned no slower than fastest baseline (within spread)"
GOAL_NAMES: tuple[str, ...] = (GOAL_RATIO, GOAL_REDUCTION, GOAL_PAIRS, GOAL_TUNED)


def relative_spread(row: BenchRow) -> float:
    """``(max - min) / median`` of the row's timed repeats; 0 with a single repeat."""
    return (row.max_s - row.min_s) / row.median_s if row.median_s > 0 else math.nan


@dataclass(frozen=True, kw_only=True, slots=True)
class PairOrder:
    """Two planners, predicted and measured: which is faster, and by how much."""

    first: str
    second: str
    predicted_s: tuple[float, float]
    measured_s: tuple[float, float]
    """Medians of the timed repeats."""
    ranges_overlap: bool
    """The two rows' min - max ranges overlap: the measured order is within the noise."""

    @property
    def agrees(self) -> bool:
        """The measured medians are in the predicted order (equal predictions: any order)."""
        predicted = self.predicted_s[0] - self.predicted_s[1]
        if predicted == 0:
            return True
        return (self.measured_s[0] - self.measured_s[1]) * predicted > 0

    def describe(self) -> str:
        """``pipelined vs hierarchical: predicted 2.59 s < 2.60 s, measured 2.55 s > 2.45 s``."""

        def order(a: float, b: float) -> str:
            return "<" if a < b else (">" if a > b else "=")

        (pa, pb), (ma, mb) = self.predicted_s, self.measured_s
        return (
            f"{self.first} vs {self.second}: predicted {pa:.3g} s {order(pa, pb)} {pb:.3g} s,"
            f" measured {ma:.3g} s {order(ma, mb)} {mb:.3g} s"
            + (" (ranges overlap)" if self.ranges_overlap else "")
        )


def pair_orders(rows: Sequence[BenchRow]) -> list[PairOrder]:
    """Every pair of ``rows`` (in their order), predicted and measured."""
    return [
        PairOrder(
            first=a.name,
            second=b.name,
            predicted_s=(a.predicted_s, b.predicted_s),
            measured_s=(a.median_s, b.median_s),
            ranges_overlap=a.min_s <= b.max_s and b.min_s <= a.max_s,
        )
        for a, b in itertools.combinations(rows, 2)
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class TunedCheck:
    """``hipipe-tuned`` against the fastest measured baseline of the same cell."""

    tuned_s: float
    """The tuned row's median."""
    baseline: str
    baseline_s: float
    """The fastest baseline's median."""
    tolerance: float
    """The run-to-run spread of the two rows (the larger): how much slower still counts as a tie."""

    @property
    def slower_by(self) -> float:
        """``tuned / baseline - 1``: negative when hipipe-tuned is faster."""
        return self.tuned_s / self.baseline_s - 1.0

    @property
    def met(self) -> bool:
        return self.slower_by <= self.tolerance


def is_baseline(name: str) -> bool:
    """Rows hipipe-tuned is held against: every planner but hipipe's own, and torch."""
    return not name.startswith("hipipe")


def tuned_check(rows: Sequence[BenchRow]) -> TunedCheck | None:
    """hipipe-tuned vs the fastest baseline among ``rows`` (one cell); None if either is missing."""
    tuned = next((r for r in rows if r.name == TUNED_NAME), None)
    baselines = [r for r in rows if is_baseline(r.name)]
    if tuned is None or not baselines:
        return None
    fastest = min(baselines, key=lambda r: r.median_s)
    return TunedCheck(
        tuned_s=tuned.median_s,
        baseline=fastest.name,
        baseline_s=fastest.median_s,
        tolerance=max(relative_spread(tuned), relative_spread(fastest)),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Goal:
    """One goal in one cell: met, missed, or not measured (``met`` None), with its numbers."""

    name: str
    met: bool | None
    value: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CellFidelity:
    """The fidelity numbers of one cell and its four goals (in :data:`GOAL_NAMES` order)."""

    message_bytes: int
    ratios: dict[str, float]
    """measured / predicted per row, torch's included (its prediction is the flat ring)."""
    spreads: dict[str, float]
    """:func:`relative_spread` per row."""
    spread: float
    """The cell's run-to-run spread: the largest of its rows'."""
    pairs: tuple[PairOrder, ...]
    """Over the :data:`FIDELITY_PLANNERS` that ran."""
    reduction_measured: float
    reduction_simulated: float
    """hipipe's reduction vs themis (NaN when either did not run)."""
    tuned: TunedCheck | None
    tuned_choice: str | None
    """The candidate the tuning kept (``hipipe K=6``, ``themis``), this run's or the cache's; None
    without a hipipe-tuned row."""
    goals: tuple[Goal, ...]
    host_bound: tuple[str, ...] = ()
    """Rows bound by the host's CPU (:func:`is_host_bound`): their run-to-run spread is the
    spread of the CPU work the host spent on identical runs."""

    @property
    def pairs_ranked(self) -> int:
        return sum(p.agrees for p in self.pairs)

    @property
    def misordered(self) -> tuple[PairOrder, ...]:
        return tuple(p for p in self.pairs if not p.agrees)

    @property
    def reduction_gap_points(self) -> float:
        return 100 * (self.reduction_measured - self.reduction_simulated)


def cached_choice(result: BenchResult, message_bytes: int) -> str | None:
    """What a tuning cache (``bench --tuned``) kept for ``message_bytes``: its planner and chunks."""
    schedule = next((s for s in result.config.tuned if s.message_bytes == message_bytes), None)
    if schedule is None:
        return None
    return f"{schedule.planner} K={schedule.num_chunks}, from the cache"


def is_host_bound(row: BenchRow, host_cores: float) -> bool:
    """Whether ``row`` was bound by the host's CPU (:data:`HOST_BOUND_BUSY_SHARE`,
    :data:`HOST_BOUND_CORRELATION`); False when the host term is not calibrated
    (``host_cores`` 0) or the CPU was not read."""
    if host_cores <= 0 or not math.isfinite(row.host_busy_cpus):
        return False
    correlation = row.cpu_time_correlation
    return (
        row.host_busy_cpus >= HOST_BOUND_BUSY_SHARE * host_cores
        and math.isfinite(correlation)
        and correlation >= HOST_BOUND_CORRELATION
    )


def ratio_planners(rows: Sequence[BenchRow]) -> list[BenchRow]:
    """Rows the measured / predicted goal covers: every planner and hipipe-tuned, not torch."""
    return [r for r in rows if not is_torch_row(r.name)]


def cell_fidelity(
    result: BenchResult, message_bytes: int, *, planners: Sequence[str] = FIDELITY_PLANNERS
) -> CellFidelity:
    """Numbers and goals of one cell of ``result``."""
    rows = [r for r in result.rows if r.message_bytes == message_bytes]
    ranked = [r for name in planners for r in rows if r.name == name]
    pairs = tuple(pair_orders(ranked))
    measured = result.reduction(REDUCTION_PLANNER, THEMIS, message_bytes)
    simulated = result.reduction(REDUCTION_PLANNER, THEMIS, message_bytes, simulated=True)
    entry = result.tuning_entry(message_bytes)
    host_cores = result.topology.overheads.host_cores
    host_bound = tuple(r.name for r in rows if is_host_bound(r, host_cores))
    cell = CellFidelity(
        message_bytes=message_bytes,
        ratios={r.name: r.measured_over_predicted for r in rows},
        spreads={r.name: relative_spread(r) for r in rows},
        spread=max((relative_spread(r) for r in rows), default=math.nan),
        pairs=pairs,
        reduction_measured=measured,
        reduction_simulated=simulated,
        tuned=tuned_check(rows),
        tuned_choice=entry.chosen if entry is not None else cached_choice(result, message_bytes),
        goals=(),
        host_bound=host_bound,
    )
    goals = (
        _ratio_goal(ratio_planners(rows), host_bound),
        _reduction_goal(cell),
        _pairs_goal(cell),
        _tuned_goal(cell),
    )
    return dataclasses.replace(cell, goals=goals)


def result_fidelity(result: BenchResult) -> list[CellFidelity]:
    """One :class:`CellFidelity` per message size, in the run's order."""
    return [cell_fidelity(result, m) for m in result.config.messages_bytes]


def _ratio_goal(rows: Sequence[BenchRow], host_bound: Sequence[str] = ()) -> Goal:
    """The goal as measured; rows outside it that were host-bound are named as such (the goal
    is missed all the same)."""
    if not rows:
        return Goal(name=GOAL_RATIO, met=None, value="no planner ran")
    worst = max(rows, key=lambda r: abs(r.measured_over_predicted - 1))
    met = all(abs(r.measured_over_predicted - 1) <= RATIO_GOAL for r in rows)
    out = [r for r in rows if abs(r.measured_over_predicted - 1) > RATIO_GOAL]
    value = f"worst {worst.name} {worst.measured_over_predicted:.3f}"
    if out:
        value += f"; {len(out)} of {len(rows)} outside ({', '.join(r.name for r in out)})"
    bound_out = [r for r in out if r.name in host_bound]
    if bound_out:
        value += (
            f"; host-bound: {', '.join(r.name for r in bound_out)}"
            f" (time follows the host's CPU: r {min(r.cpu_time_correlation for r in bound_out):.2f}"
            + (f"-{max(r.cpu_time_correlation for r in bound_out):.2f})" if len(bound_out) > 1 else ")")
        )
    return Goal(name=GOAL_RATIO, met=met, value=value)


def _reduction_goal(cell: CellFidelity) -> Goal:
    if not (math.isfinite(cell.reduction_measured) and math.isfinite(cell.reduction_simulated)):
        return Goal(name=GOAL_REDUCTION, met=None, value=f"needs {REDUCTION_PLANNER} and {THEMIS}")
    gap = cell.reduction_gap_points
    return Goal(
        name=GOAL_REDUCTION,
        met=abs(gap) <= REDUCTION_GOAL_POINTS,
        value=(
            f"measured {100 * cell.reduction_measured:+.1f}%, simulated {100 * cell.reduction_simulated:+.1f}%"
            f" (gap {gap:+.1f} pts)"
        ),
    )


def _pairs_goal(cell: CellFidelity) -> Goal:
    if not cell.pairs:
        return Goal(name=GOAL_PAIRS, met=None, value="fewer than two planners ran")
    value = f"{cell.pairs_ranked} of {len(cell.pairs)}"
    if cell.misordered:
        value += "; misordered: " + ", ".join(f"{p.first} vs {p.second}" for p in cell.misordered)
    return Goal(name=GOAL_PAIRS, met=len(cell.misordered) <= MAX_MISORDERED_PAIRS, value=value)


def _tuned_goal(cell: CellFidelity) -> Goal:
    check = cell.tuned
    if check is None:
        return Goal(name=GOAL_TUNED, met=None, value="no hipipe-tuned row (bench --tune)")
    choice = f" (kept {cell.tuned_choice})" if cell.tuned_choice else ""
    return Goal(
        name=GOAL_TUNED,
        met=check.met,
        value=(
            f"{check.tuned_s:.3f} s{choice} vs {check.baseline} {check.baseline_s:.3f} s:"
            f" {100 * check.slower_by:+.1f}%, spread {100 * check.tolerance:.1f}%"
        ),
    )
