"""Failures are clean: a clear error on every surviving rank, within the timeout, never a hang.

Three jobs: one runs every misuse that is caught before any traffic (so its processes
survive to try the next one); one kills a rank in the middle of a run; one has a rank
that stops answering, so the others must time out. Every job's processes are reaped by
pid before it returns (``exitcode`` set on every rank).
"""

import dataclasses
import os
import threading
import time
from typing import Any

import pytest

from hipipe.planners import plan
from hipipe.topology_io import load_topology

torch = pytest.importorskip("torch")

from hipipe.torch.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SPEC_2X2X2 = "ring:2:1GB/s:1us,ring:2:1GB/s:1us,ring:2:1GB/s:1us"
SPEC_2X2 = "ring:2:1GB/s:1us,ring:2:1GB/s:1us"
NUMEL = 10003


def misuse(rank: int, world_size: int, schedule_json: str, other_json: str) -> dict[str, str]:
    """Worker: each misuse must raise a HipipeError on this rank; returns its message."""
    from torch.distributed.device_mesh import init_device_mesh

    from hipipe.errors import HipipeError
    from hipipe.schedule import Schedule
    from hipipe.torch import HierarchicalAllReduce, dimension_groups

    schedule = Schedule.from_json(schedule_json)
    groups = dimension_groups(schedule.topology.sizes, timeout_s=20)
    executor = HierarchicalAllReduce(None, schedule, groups=groups, timeout_s=20)
    attempts = {
        "mesh-shape": lambda: HierarchicalAllReduce(init_device_mesh("cpu", (2, 4)), schedule, timeout_s=20),
        "groups-count": lambda: HierarchicalAllReduce(None, schedule, groups=groups[:2], timeout_s=20),
        "wrong-size": lambda: executor.run(torch.zeros(NUMEL + 1, dtype=torch.int64)),
        "wrong-dtype": lambda: executor.run(torch.zeros(NUMEL * 8, dtype=torch.bool)),
        "avg-of-ints": lambda: executor.run(torch.zeros(NUMEL, dtype=torch.int64), op="avg"),
        "unknown-op": lambda: executor.run(torch.zeros(NUMEL, dtype=torch.int64), op="product"),
        "deadlocking-sequences": lambda: HierarchicalAllReduce(
            None,
            dataclasses.replace(schedule, sequences=(schedule.sequences[0][::-1], *schedule.sequences[1:])),
            groups=groups,
            timeout_s=20,
        ),
        # Rank 3 alone brings another schedule: every rank must refuse, none may hang.
        "different-schedule": lambda: HierarchicalAllReduce(
            None, Schedule.from_json(other_json if rank == 3 else schedule_json), groups=groups, timeout_s=20
        ),
    }
    messages: dict[str, str] = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            messages[name] = "no error"
        except HipipeError as exc:
            messages[name] = f"HipipeError: {exc}"
        except Exception as exc:
            messages[name] = f"{type(exc).__name__}: {exc}"
    # The executor still works after all that.
    data = torch.full((NUMEL,), rank, dtype=torch.int64)
    executor.run(data)
    messages["still-works"] = "" if bool((data == sum(range(world_size))).all()) else "wrong sum"
    return messages


EXPECTED = {
    "mesh-shape": "DeviceMesh has shape (2, 4)",
    "groups-count": "got 2 process groups",
    "wrong-size": "planned for 80024 bytes",
    "wrong-dtype": "cannot all-reduce dtype bool",
    "avg-of-ints": "avg needs a floating-point dtype",
    "unknown-op": "unknown reduce op",
    "different-schedule": "hold a different schedule",
    "deadlocking-sequences": "deadlock",
}


@pytest.fixture(scope="module")
def misuse_messages() -> list[dict[str, str]]:
    topology = load_topology(SPEC_2X2X2)
    schedule = plan(topology, NUMEL * 8, "pipelined", num_chunks=4)
    other = plan(topology, NUMEL * 8, "ring")  # needs an all-dims group the others would not create
    outcomes = spawn(misuse, 8, args=(schedule.to_json(), other.to_json()), timeout_s=180, pg_timeout_s=20)
    assert all(o.exitcode is not None for o in outcomes), "every process is reaped"
    failed = [f"rank {o.rank}: {o.error}" for o in outcomes if not o.ok]
    assert not failed, failed
    return [o.value for o in outcomes]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_misuse_is_refused_on_every_rank(misuse_messages: list[dict[str, str]], name: str) -> None:
    for rank, messages in enumerate(misuse_messages):
        assert messages[name].startswith("HipipeError"), (rank, messages[name])
        assert EXPECTED[name] in messages[name], (rank, messages[name])
        assert "\n" not in messages[name]


def test_executor_survives_refused_misuse(misuse_messages: list[dict[str, str]]) -> None:
    assert all(m["still-works"] == "" for m in misuse_messages)


def interrupted(
    rank: int, world_size: int, schedule_json: str, victim: int, mode: str, timeout_s: float
) -> Any:
    """Worker: run AllReduces in a loop; the victim dies (``kill``) or goes silent (``hang``)."""
    import torch.distributed as dist

    from hipipe.schedule import Schedule
    from hipipe.torch import HierarchicalAllReduce, dimension_groups

    schedule = Schedule.from_json(schedule_json)
    groups = dimension_groups(schedule.topology.sizes, timeout_s=timeout_s)
    executor = HierarchicalAllReduce(None, schedule, groups=groups, timeout_s=timeout_s)
    data = torch.ones(schedule.message_bytes // 8, dtype=torch.int64)
    executor.run(data)  # one good run first: the failure comes in the middle of the job
    dist.barrier()
    if rank == victim:
        if mode == "kill":
            threading.Timer(0.3, lambda: os._exit(9)).start()
        else:
            time.sleep(0.3)
            time.sleep(timeout_s + 3)  # silent: never joins the next op, until the others gave up
            return "victim"
    started = time.monotonic()
    try:
        for _ in range(1000):
            executor.run(data)
    except Exception as exc:
        elapsed_s = time.monotonic() - started
        try:
            executor.run(data)
            again = "ran again"
        except Exception as second:
            again = str(second)
        raise RuntimeError(f"after {elapsed_s:.2f} s: {type(exc).__name__}: {exc} | then: {again}") from exc
    return "finished without noticing"


def _survivors(spec: str, nproc: int, mode: str, timeout_s: float) -> tuple[list[Any], float]:
    schedule = plan(load_topology(spec), 8 * NUMEL, "pipelined")
    started = time.monotonic()
    outcomes = spawn(
        interrupted,
        nproc,
        args=(schedule.to_json(), 1, mode, timeout_s),
        timeout_s=90,
        pg_timeout_s=timeout_s,
    )
    assert all(o.exitcode is not None for o in outcomes), "every process is reaped"
    return [o for o in outcomes if o.rank != 1], time.monotonic() - started


def test_killed_rank_gives_every_survivor_an_error() -> None:
    timeout_s = 20.0
    survivors, _ = _survivors(SPEC_2X2X2, 8, "kill", timeout_s)
    for outcome in survivors:
        assert not outcome.ok, outcome
        assert "CollectiveError" in outcome.error and "op " in outcome.error, outcome.error
        elapsed_s = float(outcome.error.split("after ")[1].split(" s:")[0])
        assert elapsed_s < timeout_s, outcome.error


def test_silent_rank_makes_the_others_time_out() -> None:
    timeout_s = 4.0
    survivors, _ = _survivors(SPEC_2X2, 4, "hang", timeout_s)
    for outcome in survivors:
        assert not outcome.ok, outcome
        assert "CollectiveError" in outcome.error, outcome.error
        assert "cannot run again" in outcome.error.split(" | then: ")[1], outcome.error
        elapsed_s = float(outcome.error.split("after ")[1].split(" s:")[0])
        assert elapsed_s < timeout_s + 5, outcome.error
