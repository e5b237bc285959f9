"""The region runner of the split exact MIP: worker processes answer as the caller would,
errors come back as errors, and no worker outlives the runner."""

import subprocess
from typing import Any

import pytest

from hipipe import Collective
from hipipe.errors import HipipeError
from hipipe.planners.exact import regions
from hipipe.planners.exact.model import ExactModel
from hipipe.planners.exact.planner import mip_settings
from hipipe.planners.exact.regions import RegionRunner, solve_region
from hipipe.presets import PRESETS

MIB = 1024**2


def _region_args(first_dims: tuple[int, ...]) -> tuple[object, ...]:
    """One first-dim region of rfs-3d at 16 MiB, K = 3, asked below a generous cutoff."""
    model = ExactModel(PRESETS["rfs-3d"](), 16 * MIB, 3, Collective.ALL_REDUCE, time_unit_s=1e-3)
    return (model, mip_settings(), tuple((dim,) for dim in first_dims), 60.0, 10.0)


def test_workers_answer_each_region_as_the_caller_does() -> None:
    regions = [(0, 0, 0), (0, 1, 2), (1, 1, 2)]
    here = {first: solve_region(*_region_args(first)) for first in regions}  # type: ignore[arg-type]
    answers = {}
    with RegionRunner[tuple[int, ...]](2) as runner:
        pending = list(regions)
        while pending or runner.running:
            while pending and runner.running < runner.jobs:
                first = pending.pop()
                runner.submit(first, _region_args(first))
            first, result = runner.next_result()
            answers[first] = result
        workers = list(runner._workers)
    assert len(workers) == 2 and all(worker.poll() is not None for worker in workers)
    assert answers.keys() == here.keys()
    for first, result in answers.items():
        assert result.settled == here[first].settled
        assert result.values is not None and here[first].values is not None
        assert result.values[-1] == pytest.approx(here[first].values[-1], rel=1e-9)


def test_an_error_in_a_worker_is_raised_in_the_caller_and_a_lost_worker_is_named() -> None:
    with RegionRunner[str](2) as runner:
        runner.submit("bad", ("not a model", {}, (), 1.0, 1.0))
        with pytest.raises(AttributeError):
            runner.next_result()
        next_worker = runner._workers[runner._idle[-1]]
        next_worker.kill()
        next_worker.wait()
        with pytest.raises(HipipeError, match="worker process is gone") as raised:
            runner.submit("lost", _region_args((0, 0, 0)))
        assert "\n" not in str(raised.value)


def test_a_runner_refuses_more_regions_than_workers() -> None:
    with RegionRunner[int](1) as runner:
        runner.submit(0, _region_args((0, 0, 0)))
        with pytest.raises(RuntimeError, match="every worker is busy"):
            runner.submit(1, _region_args((0, 0, 0)))


def test_a_failed_start_stops_the_workers_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second worker cannot start: the first must not outlive the error."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen_once(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        if started:
            raise OSError("no more processes")
        started.append(real_popen(*args, **kwargs))
        return started[0]

    monkeypatch.setattr(regions.subprocess, "Popen", popen_once)
    with pytest.raises(OSError, match="no more processes"), RegionRunner[int](2):
        pass
    assert len(started) == 1 and started[0].wait(timeout=10) is not None
