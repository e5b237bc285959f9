"""One training run on an initialized process group: DDP or FSDP2, torch's or hipipe's collectives.

The benchmark trains the same model on the same data twice, once with torch's default
communication and once with hipipe's, and compares step times and losses. Everything
that could make the two runs differ besides the collectives is fixed here: the model is
built from one seed on every rank, each rank's batches come from (seed, step, rank), the
optimizer is plain SGD (no state that could hide a difference), and the timed region of
a step is the same code in both runs.

Step time is the slowest rank's: a barrier (not timed) lines the ranks up, each rank
times forward + backward + optimizer step, and the per-step maximum over ranks is what
a training job would see. The first steps also plan schedules and build executors (DDP
rebuilds its gradient buckets after the first step, so the second step meets new bucket
sizes), so the median leaves them out (:data:`TIMED_FROM_STEP`).

The *exposed communication share* of a step is ``1 - compute_s / step_s``, where
``compute_s`` is the same step on an unwrapped local copy of the model, timed on all
ranks at once (so the CPU is as contended as in training): what the network costs the
step after whatever overlap DDP or FSDP achieves.
"""

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipipe.errors import HipipeError
from hipipe.topology import Topology
from hipipe.torch.timing import slowest_rank_s
from hipipe.training.model import ModelConfig, TinyLM, synthetic_batch

TIMED_FROM_STEP = 2
"""Steps before this one plan schedules and build groups: kept in the report, not in the median."""

COMPUTE_STEPS = 3
"""Local steps timed for the compute-only baseline of the exposed-communication share."""


class Workload(StrEnum):
    DDP = "ddp"
    FSDP = "fsdp"


class Implementation(StrEnum):
    TORCH = "torch"
    HIPIPE = "hipipe"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingConfig:
    """What both runs of the benchmark share."""

    workload: Workload
    model: ModelConfig
    steps: int
    batch_size: int = 1
    seed: int = 0
    learning_rate: float = 0.05
    planner: str = "hipipe"
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", Workload(self.workload))
        if self.steps < TIMED_FROM_STEP + 1:
            raise HipipeError(f"train for at least {TIMED_FROM_STEP + 1} steps, got {self.steps}")
        if self.batch_size < 1:
            raise HipipeError(f"batch size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingRun:
    """One run, as every rank agrees on it (slowest rank's times, mean loss over ranks)."""

    name: Implementation
    workload: Workload
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    compute_step_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", Implementation(self.name))
        object.__setattr__(self, "workload", Workload(self.workload))

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s[TIMED_FROM_STEP:])

    @property
    def communication_share(self) -> float:
        """Exposed communication: the part of a step the network adds to compute."""
        return max(0.0, 1.0 - self.compute_step_s / self.median_step_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name.value,
            "workload": self.workload.value,
            "step_times_s": list(self.step_times_s),
            "median_step_s": self.median_step_s,
            "timed_from_step": TIMED_FROM_STEP,
            "losses": list(self.losses),
            "compute_step_s": self.compute_step_s,
            "communication_share": self.communication_share,
        }


def _loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _wrap(
    model: TinyLM, config: TrainingConfig, implementation: Implementation, topology: Topology
) -> tuple[nn.Module, Callable[[], None]]:
    """The model as the workload trains it, and a function that releases what the wrap holds."""
    if config.workload is Workload.DDP:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model)
        if implementation is Implementation.TORCH:
            return ddp, lambda: None
        from hipipe.torch.comm_hook import HipipeHookState, hipipe_hook

        state = HipipeHookState.create(topology, planner=config.planner, timeout_s=config.timeout_s)
        ddp.register_comm_hook(state, hipipe_hook)
        return ddp, lambda: state.worker.shutdown(wait=True)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    if implementation is Implementation.HIPIPE:
        from hipipe.torch.fsdp import use_hipipe

        use_hipipe(model, topology, planner=config.planner, timeout_s=config.timeout_s)
    return model, lambda: None


def _mean_over_ranks(values: Sequence[float]) -> tuple[float, ...]:
    gathered: list[list[float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(values))
    rows = [rank_values for rank_values in gathered if rank_values is not None]
    return tuple(statistics.fmean(row[i] for row in rows) for i in range(len(values)))


def compute_only_step_s(config: TrainingConfig) -> float:
    """Median time of one local step of an unwrapped copy of the model (all ranks at once)."""
    torch.manual_seed(config.seed)
    model = TinyLM(config.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)
    rank = dist.get_rank()
    times_s = []
    for step in range(COMPUTE_STEPS):
        inputs, targets = synthetic_batch(
            config.model, batch_size=config.batch_size, step=step, rank=rank, seed=config.seed
        )
        dist.barrier()
        start = time.perf_counter()
        _loss(model, inputs, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times_s.append(time.perf_counter() - start)
    return slowest_rank_s([statistics.median(times_s)])[0]


def train(
    config: TrainingConfig,
    implementation: Implementation | str,
    topology: Topology,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainingRun:
    """Train ``config.steps`` steps on the default process group; every rank calls this.

    ``topology`` must describe the process group (one rank per NPU); hipipe plans its
    schedules on it. ``on_step(step, loss)`` is called on every rank after each step.
    """
    implementation = Implementation(implementation)
    world = dist.get_world_size()
    if world != topology.num_npus:
        raise HipipeError(
            f"the job has {world} ranks but the topology {topology.label()} has {topology.num_npus} NPUs"
        )
    rank = dist.get_rank()
    torch.manual_seed(config.seed)
    model = TinyLM(config.model)
    wrapped, release = _wrap(model, config, implementation, topology)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=config.learning_rate)
    times_s: list[float] = []
    losses: list[float] = []
    try:
        for step in range(config.steps):
            inputs, targets = synthetic_batch(
                config.model, batch_size=config.batch_size, step=step, rank=rank, seed=config.seed
            )
            dist.barrier()
            start = time.perf_counter()
            loss = _loss(wrapped, inputs, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times_s.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step, losses[-1])
    finally:
        release()
    return TrainingRun(
        name=implementation,
        workload=config.workload,
        step_times_s=slowest_rank_s(times_s),
        losses=_mean_over_ranks(losses),
        compute_step_s=compute_only_step_s(config),
    )
