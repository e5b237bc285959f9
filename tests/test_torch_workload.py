"""Timed-run buffers of every collective: known fills, a check that passes on the right
result (hipipe's executor and torch's own) and fails on a wrong one."""

from typing import Any

import pytest

from hipipe.planners import plan
from hipipe.schedule import Collective
from hipipe.topology_io import load_topology

torch = pytest.importorskip("torch")

from hipipe.torch.launch import raise_on_failure, spawn  # noqa: E402

SPEC = "ring:2:1GB/s:1us,ring:2:1GB/s:1us"
MESSAGE_BYTES = 4 * 4 * 1000  # 1000 float32 per shard on 4 ranks


def _job(rank: int, world: int, schedules: dict[str, str]) -> dict[str, str]:
    from hipipe.schedule import Schedule
    from hipipe.torch.executor import HierarchicalCollective
    from hipipe.torch.groups import dimension_groups
    from hipipe.torch.workload import Workload

    torch.set_num_threads(1)
    groups = dimension_groups((2, 2), timeout_s=30.0)
    verdicts: dict[str, str] = {}
    for kind, text in schedules.items():
        collective = Collective(kind)
        workload = Workload(collective, MESSAGE_BYTES, torch.float32)
        executor = HierarchicalCollective(None, Schedule.from_json(text), groups=groups, timeout_s=30.0)
        for who, run in (("hipipe", workload.hipipe_run(executor)), ("torch", workload.torch_run())):
            workload.fill()
            run()
            workload.check()  # raises on a wrong result
            verdicts[f"{kind} {who}"] = "ok"
        workload.fill()  # not run: the output still holds zeros, the check must refuse it
        try:
            workload.check()
            verdicts[f"{kind} unrun"] = "accepted"
        except RuntimeError as exc:
            verdicts[f"{kind} unrun"] = str(exc)
    return verdicts


@pytest.mark.torch
def test_every_collective_is_filled_run_and_checked() -> None:
    topology = load_topology(SPEC)
    schedules = {c.value: plan(topology, MESSAGE_BYTES, "hipipe", collective=c).to_json() for c in Collective}
    outcomes: list[Any] = raise_on_failure(spawn(_job, 4, args=(schedules,), timeout_s=120.0))
    for verdicts in outcomes:
        for kind in Collective:
            assert verdicts[f"{kind.value} hipipe"] == "ok"
            assert verdicts[f"{kind.value} torch"] == "ok"
            assert verdicts[f"{kind.value} unrun"].startswith(f"wrong {kind.value} result")
