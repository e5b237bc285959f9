"""DDP trains with hipipe's AllReduce and ends where the default hook ends (8 Gloo processes)."""

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hipipe.torch.launch import raise_on_failure, spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SPEC = "ring:2:4GB/s:1us,ring:2:2GB/s:1us,switch:2:1GB/s:1us"
PLANNERS = ("hipipe", "themis", "ring")
STEPS = 3


def train(rank: int, world_size: int, spec: str, planners: tuple[str, ...]) -> dict[str, Any]:
    """Worker: the same model and data trained with the default hook and with each planner."""
    from torch.nn.parallel import DistributedDataParallel

    from hipipe.topology_io import load_topology
    from hipipe.torch.comm_hook import HipipeHookState, hipipe_hook

    topology = load_topology(spec)
    groups = None
    finals: dict[str, list[Any]] = {}
    for name in ("default", *planners):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.Tanh(), torch.nn.Linear(37, 5))
        # A tiny bucket cap gives several buckets of odd sizes, each with its own schedule.
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
        if name != "default":
            state = HipipeHookState.create(topology, planner=name, groups=groups, timeout_s=30)
            groups = state.groups
            ddp.register_comm_hook(state, hipipe_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        generator = torch.Generator().manual_seed(100 + rank)
        for _ in range(STEPS):
            inputs = torch.randn(16, 13, generator=generator)
            targets = torch.randn(16, 5, generator=generator)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
            optimizer.step()
        finals[name] = [p.detach().clone() for p in model.parameters()]
    # A hook that cannot plan fails backward on every rank, promptly and in words.
    model = torch.nn.Linear(13, 5)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(
        HipipeHookState.create(topology, planner="no-such-planner", groups=groups), hipipe_hook
    )
    try:
        ddp(torch.randn(4, 13)).sum().backward()
        hook_error = "no error"
    except Exception as exc:
        hook_error = str(exc)
    initial = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.Tanh(), torch.nn.Linear(37, 5))
    moved = max(float((a - b).abs().max()) for a, b in zip(finals["default"], _seeded(initial), strict=True))
    return {
        "hook_error": hook_error,
        "moved": moved,
        "differences": {
            name: max(
                float((a - b).abs().max()) for a, b in zip(finals["default"], finals[name], strict=True)
            )
            for name in planners
        },
    }


def _seeded(model: Any) -> list[Any]:
    torch.manual_seed(0)
    fresh = type(model)(torch.nn.Linear(13, 37), torch.nn.Tanh(), torch.nn.Linear(37, 5))
    return [p.detach() for p in fresh.parameters()]


def test_ddp_with_hipipe_hook_matches_default_hook() -> None:
    results = raise_on_failure(spawn(train, 8, args=(SPEC, PLANNERS), timeout_s=240, pg_timeout_s=30))
    for rank, result in enumerate(results):
        assert "unknown planner 'no-such-planner'" in result["hook_error"], result["hook_error"]
        assert result["moved"] > 1e-3, "training must change the parameters, or the comparison proves nothing"
        for planner, difference in result["differences"].items():
            assert difference < 1e-5, (rank, planner, difference)
