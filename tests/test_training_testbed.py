"""The training benchmark on a real testbed (root): torchrun nodes in namespaces, faults, cleanup."""

import os
import time
from pathlib import Path

import pytest

from hipipe.testbed import netns
from hipipe.testbed.layout import TestbedError
from testbed_host import root_skip_reason, unused_prefix

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.torch]


@pytest.fixture
def prefix() -> str:
    reason = root_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="training needs torch")
    return unused_prefix()


def test_fsdp_trains_the_same_under_torchrun_nodes(tmp_path: Path, prefix: str) -> None:
    from hipipe.testbed.training import TrainingBenchConfig, run_training_bench, training_result_to_dict

    config = TrainingBenchConfig(
        sizes=(2, 2),
        rates_bits_per_s=(200e6, 200e6),
        workload="fsdp",  # type: ignore[arg-type]
        model_bytes=1 << 20,
        steps=3,
        calibrate=False,
        timeout_s=60,
    )
    state_dir = tmp_path / "state"
    try:
        result = run_training_bench(config, workdir=tmp_path / "work", state_dir=state_dir, prefix=prefix)
    finally:
        assert netns.existing_netns(prefix) == []
    document = training_result_to_dict(result)
    assert document["format"] == "hipipe.bench.training"
    assert [row["name"] for row in document["rows"]] == ["torch", "hipipe"]
    assert all(row["workload"] == "fsdp" and len(row["losses"]) == 3 for row in document["rows"])
    assert document["max_loss_relative_difference"] < 1e-4
    assert document["speedup"] > 0
    # every node ran under its own torchrun (one log per node, each saw the rendezvous), and
    # torchrun kept its run directory in the job's workdir, not in the system's /tmp
    nodes = tmp_path / "work" / "nodes"
    assert sorted(p.name for p in nodes.glob("*.log")) == [f"node{n}.log" for n in range(4)]
    assert sorted(p.name for p in nodes.iterdir() if p.is_dir()) == [f"node{n}-torchrun" for n in range(4)]


def test_a_rank_that_dies_mid_training_fails_the_job_in_one_line(tmp_path: Path, prefix: str) -> None:
    import json

    from hipipe.testbed.torchrun import run_torchrun_job
    from hipipe.training.worker import EVENT_MARK, TrainingJob

    state_dir = tmp_path / "state"
    testbed = netns.up((2, 2), (200e6, 200e6), prefix=prefix, state_dir=state_dir)
    layout = testbed.layout
    victim = layout.rank_netns(3)
    killed: list[int] = []

    def on_event(event: dict[str, object]) -> None:
        if event.get("kind") == "step" and event.get("step") == 1 and not killed:
            # Kill rank 3's training process (torchrun's child), not its agent: a crash mid-training.
            for pid in netns.run(["ip", "netns", "pids", victim]).split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                if b"hipipe.training.worker" in cmdline and b"torch.distributed.run" not in cmdline:
                    os.kill(int(pid), 9)
                    killed.append(int(pid))

    job = TrainingJob(
        topology=layout.nominal_topology(),
        workload="ddp",  # type: ignore[arg-type]
        model_bytes=1 << 20,
        steps=40,
        implementations=("hipipe",),  # type: ignore[arg-type]
        output_path=str(tmp_path / "runs.json"),
        timeout_s=20,
    )
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job.to_dict()))
    started = time.monotonic()
    try:
        with pytest.raises(TestbedError) as failure:
            run_torchrun_job(
                layout,
                ["hipipe.training.worker", str(job_path)],
                workdir=tmp_path / "nodes",
                event_mark=EVENT_MARK,
                deadline_s=300,
                on_event=on_event,
            )
        elapsed_s = time.monotonic() - started
        assert killed, "the test never saw step 1"
        message = str(failure.value)
        assert "\n" not in message and "failed" in message
        assert elapsed_s < 200  # the survivors notice within Gloo's timeout, no hang
        for node in range(layout.num_ranks):  # nothing of the job outlives it
            assert netns.run(["ip", "netns", "pids", layout.rank_netns(node)]).split() == []
    finally:
        netns.down(prefix, state_dir=state_dir)
    assert netns.existing_netns(prefix) == []
    assert not (tmp_path / "runs.json").exists()
