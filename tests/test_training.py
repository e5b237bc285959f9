"""The training benchmark's pieces: the model, its data, the job file and the torchrun command."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hipipe.errors import HipipeError  # noqa: E402
from hipipe.testbed.layout import Layout  # noqa: E402
from hipipe.testbed.torchrun import RENDEZVOUS_PORT, torchrun_argv  # noqa: E402
from hipipe.topology_io import load_topology  # noqa: E402
from hipipe.training.model import ModelConfig, TinyLM, config_for_bytes, synthetic_batch  # noqa: E402
from hipipe.training.train import TrainingConfig, TrainingRun, Workload  # noqa: E402
from hipipe.training.worker import TrainingJob  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("mib", [1, 16, 64])
def test_model_fills_its_gradient_budget(mib: int) -> None:
    budget = mib << 20
    config = config_for_bytes(budget)
    model = TinyLM(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == config.num_parameters
    assert 4 * count <= budget
    # One more multiple of the head count in width would not fit.
    wider = ModelConfig(
        width=config.width + config.num_heads,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        context_tokens=config.context_tokens,
    )
    assert 4 * wider.num_parameters > budget


def test_synthetic_batches_depend_on_seed_step_and_rank_only() -> None:
    config = config_for_bytes(1 << 20)
    inputs, targets = synthetic_batch(config, batch_size=2, step=3, rank=1, seed=7)
    again, _ = synthetic_batch(config, batch_size=2, step=3, rank=1, seed=7)
    assert torch.equal(inputs, again)
    assert inputs.shape == (2, config.context_tokens) and targets.shape == inputs.shape
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens
    for other in ({"step": 4, "rank": 1}, {"step": 3, "rank": 2}):
        different, _ = synthetic_batch(config, batch_size=2, seed=7, **other)
        assert not torch.equal(inputs, different)


def test_model_runs_forward_and_backward() -> None:
    model = TinyLM(config_for_bytes(1 << 20))
    inputs, targets = synthetic_batch(model.config, batch_size=2, step=0, rank=0, seed=0)
    logits = model(inputs)
    assert logits.shape == (2, model.config.context_tokens, model.config.vocab_size)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_training_config_refuses_too_few_steps() -> None:
    with pytest.raises(HipipeError, match="at least 3 steps"):
        TrainingConfig(workload=Workload.DDP, model=config_for_bytes(1 << 20), steps=1)


def test_run_statistics_leave_the_first_step_out() -> None:
    run = TrainingRun(
        name="hipipe",  # type: ignore[arg-type]
        workload=Workload.FSDP,
        step_times_s=(9.0, 8.0, 2.0, 3.0, 4.0),
        losses=(1.0, 0.9, 0.8, 0.7, 0.6),
        compute_step_s=1.5,
    )
    assert run.median_step_s == 3.0  # median of 2, 3, 4: steps 0 and 1 planned the schedules
    assert run.communication_share == pytest.approx(0.5)
    assert run.to_dict()["timed_from_step"] == 2


def test_job_round_trips() -> None:
    job = TrainingJob(
        topology=load_topology("ring:2:1GB/s:1us,ring:2:1GB/s:1us"),
        workload=Workload.FSDP,
        model_bytes=1 << 20,
        steps=3,
        implementations=("torch", "hipipe"),  # type: ignore[arg-type]
        output_path="/tmp/runs.json",
    )
    again = TrainingJob.from_dict(job.to_dict())
    assert again.to_dict() == job.to_dict()
    assert again.config().model == config_for_bytes(1 << 20)


def test_torchrun_command_is_one_node_per_namespace() -> None:
    layout = Layout(prefix="hpabcd", sizes=(2, 2), rates_bits_per_s=(1e8, 1e8))
    worker = ["hipipe.training.worker", "job.json"]
    host = torchrun_argv(layout, 0, worker, rendezvous_id="x", join_timeout_s=60, log_dir=Path("w/n0"))
    other = torchrun_argv(layout, 3, worker, rendezvous_id="x", join_timeout_s=60, log_dir=Path("w/n3"))
    assert host[:4] == ["ip", "netns", "exec", layout.rank_netns(0)]
    assert other[:4] == ["ip", "netns", "exec", layout.rank_netns(3)]
    endpoint = f"--rdzv-endpoint={layout.rank_address(0)}:{RENDEZVOUS_PORT}"
    assert endpoint in host and endpoint in other
    assert "--rdzv-conf=is_host=1,join_timeout=60" in host
    assert "--rdzv-conf=is_host=0,join_timeout=60" in other
    assert f"--local-addr={layout.rank_address(3)}" in other
    assert "--nnodes=4" in other and "--node-rank=3" in other
    assert "--log-dir=w/n3" in other  # not a torchelastic_* directory left in /tmp per node
    assert f"GLOO_SOCKET_IFNAME={layout.rank_ifname(3)}" in other
    assert other[-3:] == ["-m", "hipipe.training.worker", "job.json"]


def _torchrun_locally(tmp_path, job: TrainingJob, timeout_s: float):  # type: ignore[no-untyped-def]
    """The job under torchrun --standalone with 4 ranks on loopback; the finished process."""
    import json
    import subprocess
    import sys

    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job.to_dict()))
    return subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"),
            f"--log-dir={tmp_path / 'torchrun'}",
            *("-m", "hipipe.training.worker", str(job_path)),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _run_locally(tmp_path, workload: str, planner: str) -> dict:  # type: ignore[no-untyped-def]
    """Both implementations, 3 steps, 4 ranks on a 2x2 topology; rank 0's runs document."""
    import json

    job = TrainingJob(
        topology=load_topology("ring:2:1GB/s:1us,ring:2:1GB/s:1us"),
        workload=workload,  # type: ignore[arg-type]
        model_bytes=1 << 20,
        steps=3,
        implementations=("torch", "hipipe"),  # type: ignore[arg-type]
        output_path=str(tmp_path / "runs.json"),
        planner=planner,
        timeout_s=60,
    )
    done = _torchrun_locally(tmp_path, job, timeout_s=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((tmp_path / "runs.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "planner"), [("ddp", "hipipe"), ("fsdp", "hipipe")])
def test_hipipe_trains_like_torch(tmp_path, workload: str, planner: str) -> None:  # type: ignore[no-untyped-def]
    document = _run_locally(tmp_path, workload, planner)
    assert document["format"] == "hipipe.training.runs"
    torch_run, hipipe_run = document["rows"]
    assert (torch_run["name"], hipipe_run["name"]) == ("torch", "hipipe")
    assert torch_run["workload"] == hipipe_run["workload"] == workload
    assert len(torch_run["losses"]) == len(hipipe_run["losses"]) == 3
    for a, b in zip(torch_run["losses"], hipipe_run["losses"], strict=True):
        assert b == pytest.approx(a, rel=1e-4)  # the same training, with other collectives
    assert torch_run["losses"][0] > 5.0  # byte-level cross-entropy starts near ln(256) = 5.55
    for run in (torch_run, hipipe_run):
        assert len(run["step_times_s"]) == 3 and all(t > 0 for t in run["step_times_s"])
        assert 0.0 <= run["communication_share"] < 1.0


def test_a_torch_without_the_fsdp2_interface_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.fsdp as fsdp_package

    from hipipe.torch import fsdp

    monkeypatch.delattr(fsdp_package.FSDPModule, "set_custom_reduce_scatter")
    with pytest.raises(
        HipipeError, match=r"cannot install custom FSDP2 collectives .* use torch 2.13"
    ) as info:
        fsdp.use_hipipe(torch.nn.Linear(2, 2), load_topology("ring:2:1GB/s:1us"))
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_a_world_that_is_not_the_topology_fails_every_rank_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = TrainingJob(
        topology=load_topology("ring:2:1GB/s:1us,ring:4:1GB/s:1us"),  # 8 NPUs for a 4-rank job
        workload="fsdp",  # type: ignore[arg-type]
        model_bytes=1 << 20,
        steps=3,
        implementations=("hipipe",),  # type: ignore[arg-type]
        output_path=str(tmp_path / "runs.json"),
        timeout_s=30,
    )
    done = _torchrun_locally(tmp_path, job, timeout_s=300)
    assert done.returncode != 0
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("rank ")]
    assert len(errors) == 4, errors  # every rank, one line each
    assert all("the job has 4 ranks but the topology 2x4 has 8 NPUs" in line for line in errors), errors
    assert not (tmp_path / "runs.json").exists()


_TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=====================================================
hipipe.training.worker FAILED
-----------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_08:11:48
  host      : localhost
  rank      : {rank} (local_rank: 0)
  exitcode  : {exitcode} (pid: 7990) {signal}
  error_file: <N/A>
  traceback : {traceback}
====================================================="""


def _node_log(before: str, *, rank: int, exitcode: int, signal: str = "", traceback: str = "") -> list[str]:
    """A failed torchrun node's log (as torch 2.13 writes it), stripped like the reader strips it."""
    agent = (
        "E1203 08:11:48.251000 7829 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        f"(exitcode: {exitcode}) local_rank: 0 (pid: 7990) of binary: python\n"
        "Traceback (most recent call last):\n"
        '  File "torch/distributed/launcher/api.py", line 383, in launch_agent\n'
        "    raise ChildFailedError(\n"
    )
    summary = _TORCHRUN_SUMMARY.format(rank=rank, exitcode=exitcode, signal=signal, traceback=traceback)
    return [line.strip() for line in (before + agent + summary).splitlines() if line.strip()]


def test_a_failed_node_is_told_by_its_workers_line_not_torchruns_border() -> None:
    from hipipe.testbed.torchrun import node_failure_reason

    worker_said = "rank 2: the AllReduce timed out after 60 s waiting for rank 3\n"
    lines = _node_log(worker_said, rank=2, exitcode=1, traceback="To enable traceback see: https://x")
    assert lines[-1].startswith("=====")  # what the last line alone would have said
    assert node_failure_reason(lines) == worker_said.strip()


def test_a_node_whose_worker_could_not_say_why_is_told_from_torchruns_summary() -> None:
    from hipipe.testbed.torchrun import node_failure_reason

    uncaught = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "worker.py", line 3, in <module>\n'
        "[rank1]: TypeError: unsupported operand type(s) for +: 'int' and 'str'\n"
    )
    lines = _node_log(uncaught, rank=1, exitcode=1, traceback="To enable traceback see: https://x")
    assert node_failure_reason(lines) == (
        "rank 1 exited with code 1: TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    )
    aborted = (
        "terminate called after throwing an instance of 'gloo::IoException'\n"
        "  what():  [gloo/transport/tcp/pair.cc:600] Connection closed by peer [10.0.0.2]:1234\n"
        "Fatal Python error: Aborted\n"
        "Thread 0x00007f (most recent call first):\n"
        '  File "threads.py", line 120 in walk\n'
    )
    lines = _node_log(
        aborted, rank=0, exitcode=-6, signal=" (SIGABRT)", traceback="Signal 6 (SIGABRT) received by PID 7990"
    )
    assert node_failure_reason(lines) == (
        "rank 0 was killed by SIGABRT: what():  [gloo/transport/tcp/pair.cc:600] "
        "Connection closed by peer [10.0.0.2]:1234"
    )
    silent = _node_log("", rank=3, exitcode=-9, signal=" (SIGKILL)", traceback="Signal 9 (SIGKILL) received")
    assert node_failure_reason(silent) == (
        "rank 3 was killed by SIGKILL (no error line before torchrun's summary)"
    )


def test_a_node_whose_agent_failed_is_told_by_its_last_line() -> None:
    from hipipe.testbed.torchrun import node_failure_reason

    lines = [
        "Traceback (most recent call last):",
        'File "torch/distributed/elastic/rendezvous/api.py", line 9, in next_rendezvous',
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: the join timed out",
    ]
    assert node_failure_reason(lines) == lines[-1]
    assert node_failure_reason([]) == ""


def test_an_unexpected_worker_exception_is_one_line_with_its_traceback_kept(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    import json

    from hipipe.training import worker

    job = TrainingJob(
        topology=load_topology("ring:2:1GB/s:1us"),
        workload="ddp",  # type: ignore[arg-type]
        model_bytes=1 << 20,
        steps=3,
        implementations=("hipipe",),  # type: ignore[arg-type]
        output_path=str(tmp_path / "runs.json"),
        timeout_s=30,
    )
    (tmp_path / "job.json").write_text(json.dumps(job.to_dict()))

    def broken(job: TrainingJob) -> None:
        raise TypeError("a bug\nwith a second line")

    monkeypatch.setattr(worker, "run_job", broken)
    monkeypatch.setenv("RANK", "5")
    assert worker.main([str(tmp_path / "job.json")]) == 1
    stderr = capsys.readouterr().err
    assert stderr.splitlines()[-1] == "rank 5: TypeError: a bug"
    assert "Traceback (most recent call last)" in stderr  # the bug's traceback stays in the log
