"""``hipipe tune`` under torchrun: measure the candidates on the real network, keep the fastest.

Every rank runs :func:`tune_in_process`. Rank 0 plans the candidates
(:func:`hipipe.tuning.candidates.tuning_candidates`) and sends them to the others, so a
schedule is planned once; every rank then runs each candidate with the executor,
warm-up then timed repeats (a count, or until the median is settled: every rank holds the
same times, so all stop together), each time the slowest rank's (:mod:`hipipe.torch.timing`),
and checks the result of the warm-ups and the last repeat. The times are maxima over
ranks, so every rank reaches the same choice; rank 0 writes it.
"""

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from hipipe.errors import HipipeError
from hipipe.repeats import RepeatRule
from hipipe.schedule import Collective, schedule_from_dict, schedule_to_dict
from hipipe.topology import Topology
from hipipe.torch.bench import DTYPES
from hipipe.torch.executor import HierarchicalCollective
from hipipe.torch.groups import dimension_groups
from hipipe.torch.timing import timed_runs
from hipipe.torch.workload import Workload
from hipipe.tuning.cache import TunedEntry, TuningKey
from hipipe.tuning.candidates import Candidate, tuned_entry, tuning_candidates


def _share_candidates(
    topology: Topology, message_bytes: int, collective: Collective, best_few: int
) -> list[Candidate]:
    """Rank 0 plans; every rank gets the same candidates (collective)."""
    box: list[object] = [None]
    if dist.get_rank() == 0:
        planned = tuning_candidates(topology, message_bytes, collective=collective, best_few=best_few)
        box[0] = json.dumps([{"name": c.name, "schedule": schedule_to_dict(c.schedule)} for c in planned])
    dist.broadcast_object_list(box, src=0)
    return [
        Candidate(name=str(item["name"]), schedule=schedule_from_dict(item["schedule"]))
        for item in json.loads(str(box[0]))
    ]


def _measure(
    candidate: Candidate,
    groups: list[object],
    workload: Workload,
    warmup: int,
    repeats: int | RepeatRule,
    timeout_s: float,
) -> list[float]:
    """One candidate's timed repeats (a count, or until the median is settled); warm-ups
    and the last repeat are checked."""
    executor = HierarchicalCollective(None, candidate.schedule, groups=groups, timeout_s=timeout_s)

    def after(index: int, elapsed_s: float) -> None:
        if index < warmup:
            workload.check()

    times = timed_runs(
        workload.hipipe_run(executor),
        warmup=warmup,
        repeats=repeats,
        before=workload.fill,
        after=after,
    )
    workload.check()  # the buffer holds the last timed run's result
    return times


def tune_in_process(
    topology: Topology,
    message_bytes: int,
    *,
    collective: Collective = Collective.ALL_REDUCE,
    dtype: str = "float32",
    warmup: int = 1,
    repeats: int | RepeatRule = 3,
    best_few: int = 3,
    timeout_s: float = 60.0,
) -> TunedEntry:
    """On every rank of an initialized world: measure the candidates; the same entry everywhere."""
    if dtype not in DTYPES:
        raise HipipeError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
    if dist.get_world_size() != topology.num_npus:
        raise HipipeError(
            f"the topology {topology.label()} needs {topology.num_npus} ranks, the job has {dist.get_world_size()}"
        )
    itemsize = DTYPES[dtype].itemsize
    if message_bytes % itemsize:
        raise HipipeError(f"{message_bytes} bytes is not a whole number of {dtype} elements")
    torch.set_num_threads(1)
    candidates = _share_candidates(topology, message_bytes, collective, best_few)
    groups = dimension_groups(topology.sizes, timeout_s=timeout_s)
    workload = Workload(collective, message_bytes, DTYPES[dtype])
    times: dict[str, list[float]] = {}
    for candidate in candidates:
        times[candidate.name] = _measure(candidate, groups, workload, warmup, repeats, timeout_s)
    key = TuningKey.of(topology, collective, message_bytes, dtype)
    return tuned_entry(
        key,
        candidates,
        times,
        warmup=warmup,
        source=f"torchrun, world {dist.get_world_size()}",
        topology_name=topology.name,
    )


def tune_from_env(
    topology: Topology,
    message_bytes: int,
    *,
    collective: Collective,
    dtype: str,
    warmup: int,
    repeats: int | RepeatRule,
    best_few: int,
    timeout_s: float,
    backend: str = "gloo",
) -> tuple[int, TunedEntry]:
    """Join a ``torchrun`` job (env:// rendezvous), tune, leave; ``(rank, entry)``."""
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size != topology.num_npus:
        raise HipipeError(
            f"the topology {topology.label()} needs {topology.num_npus} ranks, torchrun started {world_size}"
        )
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    entry = tune_in_process(
        topology,
        message_bytes,
        collective=collective,
        dtype=dtype,
        warmup=warmup,
        repeats=repeats,
        best_few=best_few,
        timeout_s=timeout_s,
    )
    dist.destroy_process_group()
    return rank, entry
