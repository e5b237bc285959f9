"""One rank of the training benchmark, as torchrun starts it: ``python -m hipipe.training.worker JOB``.

torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``) starts this module once per rank. It reads the job (a JSON file every
rank can read), trains each implementation in turn on one process group, and rank 0
writes the runs to the job's output file. Progress goes to stdout as one JSON event per
line behind :data:`EVENT_MARK`; an error is one line on stderr and exit code 1, so the
launcher can show the first failing rank's reason.
"""

import faulthandler
import gc
import json
import os
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hipipe.errors import HipipeError
from hipipe.files import atomic_write_text
from hipipe.topology import Topology
from hipipe.topology_io import topology_from_dict, topology_to_dict
from hipipe.training.model import config_for_bytes
from hipipe.training.train import Implementation, TrainingConfig, Workload

EVENT_MARK = "@hipipe-training "
RUNS_FORMAT = "hipipe.training.runs"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingJob:
    """Everything a rank needs, written once by the launcher."""

    topology: Topology
    workload: Workload
    model_bytes: int
    steps: int
    implementations: tuple[Implementation, ...]
    output_path: str
    planner: str = "hipipe"
    batch_size: int = 1
    seed: int = 0
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", Workload(self.workload))
        object.__setattr__(self, "implementations", tuple(Implementation(i) for i in self.implementations))

    def config(self) -> TrainingConfig:
        return TrainingConfig(
            workload=self.workload,
            model=config_for_bytes(self.model_bytes),
            steps=self.steps,
            batch_size=self.batch_size,
            seed=self.seed,
            planner=self.planner,
            timeout_s=self.timeout_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology": topology_to_dict(self.topology),
            "workload": self.workload.value,
            "model_bytes": self.model_bytes,
            "steps": self.steps,
            "implementations": [i.value for i in self.implementations],
            "output_path": self.output_path,
            "planner": self.planner,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "timeout_s": self.timeout_s,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "TrainingJob":
        return TrainingJob(
            topology=topology_from_dict(data["topology"]),
            workload=Workload(data["workload"]),
            model_bytes=int(data["model_bytes"]),
            steps=int(data["steps"]),
            implementations=tuple(Implementation(i) for i in data["implementations"]),
            output_path=str(data["output_path"]),
            planner=str(data["planner"]),
            batch_size=int(data["batch_size"]),
            seed=int(data["seed"]),
            timeout_s=float(data["timeout_s"]),
        )


def emit(event: dict[str, Any]) -> None:
    print(EVENT_MARK + json.dumps(event), flush=True)


def run_job(job: TrainingJob) -> None:
    """Train every implementation of the job on this rank; rank 0 writes the runs."""
    import torch
    import torch.distributed as dist

    from hipipe.training.train import train

    torch.set_num_threads(1)  # ranks share the host's cores
    dist.init_process_group("gloo", timeout=timedelta(seconds=job.timeout_s))
    try:
        rank = dist.get_rank()
        config = job.config()
        runs = []
        for implementation in job.implementations:

            def on_step(step: int, loss: float, name: str = implementation.value) -> None:
                if rank == 0:
                    emit({"kind": "step", "implementation": name, "step": step, "loss": loss})

            runs.append(train(config, implementation, job.topology, on_step=on_step))
        if rank == 0:
            document = {
                "format": RUNS_FORMAT,
                "model": {
                    "width": config.model.width,
                    "num_layers": config.model.num_layers,
                    "num_parameters": config.model.num_parameters,
                    "gradient_bytes": 4 * config.model.num_parameters,
                },
                "rows": [run.to_dict() for run in runs],
            }
            atomic_write_text(Path(job.output_path), json.dumps(document, indent=1) + "\n")
            emit({"kind": "done"})
        # The trained models are garbage now, but FSDP's modules and hooks form reference
        # cycles (about 170 objects per job) that hold the process groups. Left to the
        # interpreter's exit, Gloo's destructors ran during finalization and a rank aborted
        # after the job's work was done ("terminate called without an active exception",
        # 1 of 8 FSDP jobs under torchrun on a loaded host): free them while torch is whole.
        gc.collect()
    finally:
        dist.destroy_process_group()


def _report_failure(line: str) -> None:
    """One write of the whole line: every rank shares torchrun's stderr, and `print`
    writes the text and its newline separately, so two failing ranks' lines could merge."""
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()


def _first_line(exc: BaseException) -> str:
    """An exception's message up to its first line break ("" for none): torch's run on for pages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m hipipe.training.worker JOB.json", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "?")
    try:
        job = TrainingJob.from_dict(json.loads(Path(argv[0]).read_text()))
        run_job(job)
    except (HipipeError, OSError, ValueError, KeyError) as exc:
        _report_failure(f"rank {rank}: {exc}")
        return 1
    except RuntimeError as exc:  # torch.distributed reports a dead peer or a timeout this way
        _report_failure(f"rank {rank}: {_first_line(exc) or type(exc).__name__}")
        return 1
    except Exception as exc:  # a bug, not a condition: its traceback stays in the node's log
        traceback.print_exc()
        first = _first_line(exc)
        _report_failure(f"rank {rank}: {type(exc).__name__}" + (f": {first}" if first else ""))
        return 1
    return 0


if __name__ == "__main__":
    faulthandler.enable()  # a crash in torch or Gloo (a signal) leaves every thread's stack in the log
    raise SystemExit(main(sys.argv[1:]))
