"""The training benchmark on a testbed: ``hipipe bench --testbed SHAPE --rates R --workload ddp|fsdp``.

Brings a testbed up, calibrates it (so hipipe plans on the links as they are), writes
one :class:`~hipipe.training.worker.TrainingJob`, starts one torchrun node per
namespace (:mod:`hipipe.testbed.torchrun`), and tears the testbed down whatever happens.
Every node trains the model twice on the same process group, with torch's default
collectives and with hipipe's; rank 0 writes both runs. The result is
``"format": "hipipe.bench.training"``: one row per implementation with its step times,
median step, losses and exposed-communication share, plus the speed-up and the largest
relative loss difference between the two runs.
"""

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hipipe.files import scratch_dir
from hipipe.testbed import netns
from hipipe.testbed.bench import calibrate_testbed
from hipipe.testbed.layout import TestbedError, format_rate
from hipipe.testbed.torchrun import run_torchrun_job
from hipipe.topology import Topology
from hipipe.topology_io import topology_to_dict
from hipipe.training.train import TIMED_FROM_STEP, Implementation, Workload
from hipipe.training.worker import EVENT_MARK, TrainingJob

TRAINING_FORMAT = "hipipe.bench.training"
TRAINING_VERSION = 1

ProgressFn = Callable[[int, int, str], None]
"""``(steps done, steps in all, what is running)``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingBenchConfig:
    sizes: tuple[int, ...]
    rates_bits_per_s: tuple[float, ...]
    workload: Workload
    model_bytes: int
    steps: int = 8
    planner: str = "hipipe"
    calibrate: bool = True
    timeout_s: float = 300.0
    """Gloo's timeout: a dead peer is noticed within this."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", Workload(self.workload))
        if self.steps < TIMED_FROM_STEP + 1:
            raise TestbedError(
                f"train for at least {TIMED_FROM_STEP + 1} steps (the first {TIMED_FROM_STEP} plan), got {self.steps}"
            )
        if self.model_bytes < 4096:
            raise TestbedError(f"the model needs at least 4 KiB of gradients, got {self.model_bytes} bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingBenchResult:
    config: TrainingBenchConfig
    prefix: str
    topology: Topology
    """What hipipe planned on (calibrated, or the nominal rates)."""
    model: dict[str, Any]
    rows: tuple[dict[str, Any], ...]
    wall_s: float
    load_average: tuple[float, float]

    def row(self, name: Implementation) -> dict[str, Any]:
        return next(r for r in self.rows if r["name"] == name.value)

    @property
    def speedup(self) -> float:
        """torch's median step over hipipe's."""
        torch_s: float = self.row(Implementation.TORCH)["median_step_s"]
        hipipe_s: float = self.row(Implementation.HIPIPE)["median_step_s"]
        return torch_s / hipipe_s

    @property
    def max_loss_relative_difference(self) -> float:
        """The largest ``|hipipe - torch| / |torch|`` over the steps: the same training?"""
        torch_losses = self.row(Implementation.TORCH)["losses"]
        hipipe_losses = self.row(Implementation.HIPIPE)["losses"]
        return max(abs(h - t) / abs(t) for t, h in zip(torch_losses, hipipe_losses, strict=True))


def run_training_bench(
    config: TrainingBenchConfig,
    *,
    progress: ProgressFn | None = None,
    workdir: Path | None = None,
    state_dir: Path = netns.DEFAULT_STATE_DIR,
    prefix: str | None = None,
) -> TrainingBenchResult:
    """Up, calibrate, train with torch then hipipe under torchrun, down (always).

    Without ``workdir`` the worker logs go to a temporary directory, removed after a
    successful run and kept after a failure (the error names it).
    """
    with scratch_dir(workdir, prefix="hipipe-training-") as directory:
        return _run_training_bench(
            config, progress=progress, workdir=directory, state_dir=state_dir, prefix=prefix
        )


def _run_training_bench(
    config: TrainingBenchConfig,
    *,
    progress: ProgressFn | None = None,
    workdir: Path,
    state_dir: Path = netns.DEFAULT_STATE_DIR,
    prefix: str | None = None,
) -> TrainingBenchResult:
    """The body of :func:`run_training_bench` in ``workdir``."""
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    workdir.mkdir(parents=True, exist_ok=True)
    testbed = netns.up(config.sizes, config.rates_bits_per_s, prefix=prefix, state_dir=state_dir)
    layout = testbed.layout
    try:
        topology = layout.nominal_topology()
        if config.calibrate:
            calibration = calibrate_testbed(layout, workdir=workdir / "calibrate", progress=progress)
            topology = calibration.topology(name=f"testbed-{layout.shape}-calibrated")
        implementations = (Implementation.TORCH, Implementation.HIPIPE)
        runs_path = workdir / "runs.json"
        job = TrainingJob(
            topology=topology,
            workload=config.workload,
            model_bytes=config.model_bytes,
            steps=config.steps,
            implementations=implementations,
            output_path=str(runs_path),
            planner=config.planner,
            timeout_s=config.timeout_s,
        )
        job_path = workdir / "job.json"
        job_path.write_text(json.dumps(job.to_dict(), indent=1))
        total = config.steps * len(implementations)
        done = 0
        if progress:
            progress(0, total, f"training ({config.workload.value}, torch)")

        def on_event(event: dict[str, Any]) -> None:
            nonlocal done
            if event.get("kind") == "step" and progress:
                done += 1
                progress(done, total, f"training ({config.workload.value}, {event['implementation']})")

        # A step moves the model's gradients a few times over the slowest link; allow for
        # the calibration-free worst case (torch's Gloo collectives) with a wide margin.
        slowest_bytes_per_s = min(config.rates_bits_per_s) / 8
        step_bound_s = 30.0 + 20 * config.model_bytes / slowest_bytes_per_s
        run_torchrun_job(
            layout,
            ["hipipe.training.worker", str(job_path)],
            workdir=workdir / "nodes",
            event_mark=EVENT_MARK,
            deadline_s=300.0 + total * step_bound_s,
            join_timeout_s=120.0,
            on_event=on_event,
        )
        try:
            runs = json.loads(runs_path.read_text())
        except (OSError, ValueError) as exc:
            raise TestbedError(f"rank 0 wrote no training results ({exc}; logs in {workdir})") from None
    finally:
        netns.down(layout.prefix, state_dir=state_dir)
    return TrainingBenchResult(
        config=config,
        prefix=layout.prefix,
        topology=topology,
        model=runs["model"],
        rows=tuple(runs["rows"]),
        wall_s=time.monotonic() - started,
        load_average=(load_before, os.getloadavg()[0]),
    )


def training_result_to_dict(result: TrainingBenchResult) -> dict[str, Any]:
    """The JSON document of ``hipipe bench --workload``."""
    config = result.config
    return {
        "format": TRAINING_FORMAT,
        "version": TRAINING_VERSION,
        "testbed": {
            "shape": "x".join(str(s) for s in config.sizes),
            "rates": [format_rate(r) for r in config.rates_bits_per_s],
            "rates_bits_per_s": list(config.rates_bits_per_s),
        },
        "workload": config.workload.value,
        "steps": config.steps,
        "planner": config.planner,
        "model": result.model,
        "topology": topology_to_dict(result.topology),
        "rows": list(result.rows),
        "speedup": result.speedup,
        "max_loss_relative_difference": result.max_loss_relative_difference,
        "wall_s": result.wall_s,
        "load_average": list(result.load_average),
    }
