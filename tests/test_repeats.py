"""When a measurement stops: the repeat rule, and timed_runs applying it on the ranks."""

import math
import statistics
from collections.abc import Iterator

import pytest

from hipipe.repeats import RepeatRule, median_relative_error


def test_the_median_error_is_its_confidence_interval_over_that_intervals_quantile() -> None:
    # 3 runs: the interval is the whole range, which holds the median 6 times in 8
    z_75 = statistics.NormalDist().inv_cdf(0.875)
    assert median_relative_error([1.0, 1.2, 0.8]) == pytest.approx(0.4 / (2 * z_75))
    # 12 runs: n/2 -+ 0.98 sqrt(12) = 2.6 .. 9.4 -> the 3rd .. 10th smallest,
    # which hold the median when 3 to 9 of the 12 runs fall below it
    coverage = sum(math.comb(12, i) for i in range(3, 10)) / 2**12
    z = statistics.NormalDist().inv_cdf((1 + coverage) / 2)
    times = [float(t) for t in range(1, 13)]
    assert median_relative_error(times) == pytest.approx((10 - 3) / (2 * z) / 6.5)
    assert median_relative_error([1.0]) == math.inf
    assert median_relative_error([2.0, 2.0, 2.0]) == 0.0


def test_a_fixed_count_stops_at_that_count_whatever_the_spread() -> None:
    rule = RepeatRule.fixed(3)
    assert not rule.enough([1.0, 5.0])
    assert rule.enough([1.0, 5.0, 0.1])


def test_steady_runs_stop_at_the_floor_and_noisy_ones_run_to_the_cap() -> None:
    rule = RepeatRule(repeats=3, max_repeats=12, precision=0.02)
    assert rule.enough([1.0, 1.01, 0.99])
    noisy = [1.8, 1.7, 1.45, 1.67, 1.6, 1.4, 1.39, 1.75, 1.5, 1.62, 1.41]
    assert not any(rule.enough(noisy[:n]) for n in range(len(noisy) + 1))
    assert rule.enough([*noisy, 1.6])  # the cap


def test_one_outlying_run_asks_for_more_but_cannot_hold_a_settled_median() -> None:
    rule = RepeatRule(repeats=3, max_repeats=20, precision=0.02)
    assert not rule.enough([1.0, 1.0, 1.6])
    settled = next(n for n in range(3, 21) if rule.enough([1.0, 1.0, 1.6, *[1.0] * (n - 3)]))
    assert settled < 12


def test_a_measurement_is_settled_when_its_median_is_pinned_down_over_every_job() -> None:
    rule = RepeatRule(repeats=3, max_repeats=12, precision=0.02)
    assert rule.settled([1.0, 1.01, 0.99])
    assert not rule.settled([1.0, 2.0] * 3)  # three jobs that disagree
    assert not rule.settled([1.0, 2.0] * 3 + [1.5] * 4)
    assert rule.settled([1.0, 2.0] * 3 + [1.5] * 8)  # more jobs pin the median between them
    # a fixed count, or no precision asked for, is settled whatever the spread
    assert RepeatRule.fixed(3).settled([1.0, 2.0, 3.0])
    assert RepeatRule(repeats=3, max_repeats=12).settled([1.0, 2.0, 3.0])


def test_a_rule_refuses_what_cannot_be_met() -> None:
    with pytest.raises(ValueError, match="at least one timed run"):
        RepeatRule(repeats=0, max_repeats=3)
    with pytest.raises(ValueError, match="fewer than the 5 required"):
        RepeatRule(repeats=5, max_repeats=3)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        RepeatRule(repeats=3, max_repeats=5, precision=1.5)


def test_the_rule_says_what_it_does() -> None:
    assert RepeatRule.fixed(3).describe() == "3 timed repeats"
    assert "3 to 12 timed repeats" in RepeatRule(repeats=3, max_repeats=12, precision=0.02).describe()
    assert "within 2%" in RepeatRule(repeats=3, max_repeats=12, precision=0.02).describe()


def test_timed_runs_keeps_timing_until_the_rule_is_met(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import hipipe.torch.timing as timing

    values: Iterator[float] = iter([9.0, 1.0, 1.6, 1.2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 7.0])
    monkeypatch.setattr(timing, "time_once", lambda run, device=None: next(values))
    seen: list[tuple[int, float]] = []
    rule = RepeatRule(repeats=3, max_repeats=20, precision=0.02)
    times = timing.timed_runs(lambda: None, warmup=1, repeats=rule, after=lambda i, t: seen.append((i, t)))
    # the warm-up (9.0) is left out; the outlier keeps it going until the median is settled
    assert times[0] == 1.0 and 9.0 not in times
    assert rule.enough(times) and not rule.enough(times[:-1])
    assert [i for i, _ in seen] == list(range(len(times) + 1))
    values = iter([1.0, 2.0, 3.0, 4.0])
    assert timing.timed_runs(lambda: None, warmup=0, repeats=3) == [1.0, 2.0, 3.0]


def test_a_rule_splits_between_jobs_without_losing_its_floor_or_cap() -> None:
    adaptive = RepeatRule(repeats=3, max_repeats=12, precision=0.02)
    # 3 jobs: 2 to 4 runs each (a job that stops on precision needs two runs), 6 to 12 in all
    assert adaptive.per_job(3) == RepeatRule(repeats=2, max_repeats=4, precision=0.02)
    assert adaptive.per_job(2) == RepeatRule(repeats=2, max_repeats=6, precision=0.02)
    assert adaptive.per_job(1) is adaptive
    # a fixed count stays fixed: at least one run per job, rounded up
    assert RepeatRule.fixed(3).per_job(3) == RepeatRule.fixed(1)
    assert RepeatRule.fixed(4).per_job(3) == RepeatRule.fixed(2)
    assert RepeatRule.fixed(1).per_job(2) == RepeatRule.fixed(1)
    with pytest.raises(ValueError, match="at least one job"):
        adaptive.per_job(0)
