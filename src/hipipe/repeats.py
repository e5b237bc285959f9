"""How many timed runs a measurement needs: enough to pin its median down.

Runs of one schedule vary very differently from schedule to schedule. On the 2-core
testbed, 64-chunk Themis runs of 4 MiB on a 2x4 network spread 27% (max - min over the
median) within one ``hipipe bench`` row of 7 runs, while hipipe's few-chunk plan of the
same message spread 8%, and hierarchical's few large ops spread about 1% in the testbed
benchmark. A fixed count is then either wasted
on the steady rows or too small for the noisy ones: that Themis row's median (of 3 runs
in one bench run, of 7 in another) moved by 18% between two bench runs of the same
testbed shape, which alone decides whether a prediction looks 10% off. So a measurement repeats until the median's standard error is
a small fraction of it, between a floor and a cap.

The decision uses only the slowest-rank times, which every rank holds identically
(:mod:`hipipe.torch.timing`), so all ranks stop after the same run without a message.
Torch-free: the parent describes the rule; the ranks apply it.
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX_REPEATS = 12
"""Cap on one measurement's timed runs (a bench row, a tuning candidate): a 64-chunk
schedule spreading 27% reaches a ~3% standard error of its median by then; steady ones
stop at the floor."""

DEFAULT_PRECISION = 0.02
"""Relative standard error of a median at which a measurement stops."""

DEFAULT_JOBS = 3
"""Worker jobs a testbed measurement's runs are spread over (the ranks start afresh for
each). On the 2-core testbed a many-op schedule's median moves 10-30% from one job to
the next while the runs inside a job agree within a few percent: in one testbed
benchmark run, the same Themis schedules measured 0.89-1.32x in the rows' job what they
had in the tuning job just before (hierarchical's few large ops: 0.998-1.008x). No
number of runs in one job averages that out; runs from several jobs do."""

DEFAULT_EXTRA_JOBS = 3
"""Worker jobs a bench row (and the overhead run among the rows) may take beyond
:data:`DEFAULT_JOBS` while its median is unsettled (:meth:`RepeatRule.settled`). Only the
host-bound many-op rows need them. In one ``hipipe bench`` run of a 2x4 testbed at 4 MiB,
Themis' and ``pipelined``'s 64-chunk schedules (the same ops, the same predicted CPU)
spent 0.96x and 1.07x the CPU the calibration charges them, their repeats spreading
25-28% where hipipe's and hierarchical's spread 1-4%; in the testbed benchmark before
this rule, the 5 predictions that missed 10% were all such rows, over- and
under-predicted alike. A row's prediction comes from one such measurement (the overhead
run) and is compared with another, so both medians' errors add up; more jobs shrink each
by the square root of their number, on the rows that need it only."""

Z_95 = 1.96
"""Two-sided 95% normal quantile: it places the order statistics of the interval below."""


def median_relative_error(times_s: Sequence[float]) -> float:
    """Estimated standard error of the median of ``times_s``, relative to that median.

    Distribution-free: the order statistics ``n/2 -+ 0.98 sqrt(n)`` bound a confidence
    interval of the median (the binomial interval in its normal form), whose exact
    coverage is known from the binomial distribution; a standard error is its width over
    twice the normal quantile of that coverage. With 3 runs the interval is their whole
    range at 75% coverage (range / 2.30), so one outlier among the first runs asks for
    more; from about 8 runs on it leaves the extreme runs out, so a lone descheduled run
    cannot keep a settled median going to the cap (a standard deviation would). ``inf``
    for fewer than two runs.
    """
    n = len(times_s)
    if n < 2:
        return math.inf
    ordered = sorted(times_s)
    median_s = statistics.median(ordered)
    if median_s <= 0:
        return math.inf
    half_width = Z_95 / 2 * math.sqrt(n)
    low = max(0, math.floor(n / 2 - half_width))  # 0-based: the (low+1)-th smallest
    high = min(n - 1, math.ceil(n / 2 + half_width) - 1)
    # P(ordered[low] <= median <= ordered[high]) = P(low + 1 <= runs below the median <= high)
    coverage = sum(math.comb(n, i) for i in range(low + 1, high + 1)) / 2**n
    z = statistics.NormalDist().inv_cdf((1 + coverage) / 2)
    return (ordered[high] - ordered[low]) / (2 * z) / median_s


@dataclass(frozen=True, kw_only=True, slots=True)
class RepeatRule:
    """Timed runs: at least ``repeats``, then more until the median is known within
    ``precision`` (relative standard error), at most ``max_repeats``.

    ``max_repeats == repeats`` (or ``precision == 0`` with ``max_repeats == repeats``) is
    a fixed count, the old behaviour.
    """

    repeats: int
    max_repeats: int
    precision: float = 0.0

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"need at least one timed run, got {self.repeats}")
        if self.max_repeats < self.repeats:
            raise ValueError(f"at most {self.max_repeats} runs is fewer than the {self.repeats} required")
        if not 0 <= self.precision < 1:
            raise ValueError(f"precision is a fraction of the median in [0, 1), got {self.precision}")

    @staticmethod
    def fixed(repeats: int) -> "RepeatRule":
        return RepeatRule(repeats=repeats, max_repeats=repeats)

    def enough(self, times_s: Sequence[float]) -> bool:
        """Whether the timed runs so far settle the median."""
        if len(times_s) < self.repeats:
            return False
        if len(times_s) >= self.max_repeats:
            return True
        return median_relative_error(times_s) <= self.precision

    @property
    def adaptive(self) -> bool:
        """Whether the count depends on the runs: a cap above the floor and a precision to
        reach (otherwise a fixed count, always settled)."""
        return self.max_repeats > self.repeats and self.precision > 0

    def settled(self, times_s: Sequence[float]) -> bool:
        """Whether ``times_s`` (a measurement's runs so far, over every job) pin its median
        down: a fixed count is settled by definition; otherwise its median's standard
        error must be within ``precision``. Decides whether a bench row gets another job."""
        return not self.adaptive or median_relative_error(times_s) <= self.precision

    def per_job(self, jobs: int) -> "RepeatRule":
        """This rule's share in each of ``jobs`` worker jobs that take one measurement
        together (:data:`DEFAULT_JOBS`): the floor and the cap split between them, rounded
        up, and the same precision. A job of a rule that stops on precision takes at least
        two runs (one run has no spread to judge); a fixed count takes at least one."""
        if jobs < 1:
            raise ValueError(f"need at least one job, got {jobs}")
        if jobs == 1:
            return self
        floor = max(math.ceil(self.repeats / jobs), 2 if self.max_repeats > self.repeats else 1)
        cap = max(floor, math.ceil(self.max_repeats / jobs))
        return RepeatRule(repeats=floor, max_repeats=cap, precision=self.precision)

    def describe(self) -> str:
        if self.max_repeats == self.repeats:
            return f"{self.repeats} timed repeats"
        return (
            f"{self.repeats} to {self.max_repeats} timed repeats (until the median's standard error"
            f" is within {100 * self.precision:g}%)"
        )


def repeat_problem(repeats: int, max_repeats: int, precision: float) -> str | None:
    """What is wrong with these ``--repeats``, ``--max-repeats`` and ``--precision``, in the
    flags' own words (one line); None when they make a :class:`RepeatRule`."""
    if repeats < 1:
        return f"--repeats must be at least 1, got {repeats}"
    if max_repeats < repeats:
        return f"--max-repeats {max_repeats} is below --repeats {repeats}"
    if not 0 <= precision < 1:
        return f"--precision is a fraction of the median in [0, 1), got {precision}"
    return None


def jobs_problem(jobs: int, extra_jobs: int = 0) -> str | None:
    """What is wrong with ``--jobs`` or ``--extra-jobs`` (one line); None when there is at
    least one job and no negative count of extra ones."""
    if jobs < 1:
        return f"--jobs must be at least 1, got {jobs}"
    return None if extra_jobs >= 0 else f"--extra-jobs must be at least 0, got {extra_jobs}"
