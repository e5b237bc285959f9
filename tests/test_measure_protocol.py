"""The parent-worker protocol of the testbed: typed tasks and events survive JSON unchanged.

No privilege and no torch needed (except the one test that compares the torch-free
trace conversion with the executor's).
"""

import pytest

from hipipe.planners import plan
from hipipe.repeats import RepeatRule
from hipipe.schedule import Collective
from hipipe.testbed.fit import Sample
from hipipe.testbed.layout import TestbedError
from hipipe.testbed.protocol import (
    EVENT_MARK,
    CalibrateTask,
    CalibrationSamples,
    Job,
    JobDone,
    OverheadTimes,
    RunDone,
    RunKey,
    RunResult,
    ScheduleTask,
    TorchTask,
    event_from_line,
    event_to_line,
    job_from_json,
    job_to_json,
    measured_schedule,
)
from hipipe.topology_io import load_topology

SPEC = "switch:2:10MB/s:1us,switch:2:20MB/s:1us"


def test_a_job_round_trips_with_its_schedules() -> None:
    schedule = plan(load_topology(SPEC), 1 << 16, "themis")
    key = RunKey(planner="themis", message_bytes=1 << 16)
    job = Job(
        netns=("hp0000-r0", "hp0000-r1", "hp0000-r2", "hp0000-r3"),
        ifnames=("a", "b", "c", "d"),
        store_host="10.0.0.1",
        store_port=1234,
        sizes=(2, 2),
        timeout_s=30.0,
        tasks=(
            CalibrateTask(
                sizes_bytes=(4096, 65536),
                repeats=2,
                overhead_message_bytes=65536,
                overhead_max_repeats=9,
                overhead_precision=0.03,
            ),
            ScheduleTask(
                key=key, schedule=schedule, warmup=1, repeats=3, max_repeats=12, precision=0.02, trace=True
            ),
            TorchTask(key=RunKey(planner="torch", message_bytes=1 << 16), warmup=0, repeats=1, dtype="int32"),
        ),
    )
    again = job_from_json(job_to_json(job))
    assert again == job
    assert again.world_size == 4
    task = again.tasks[1]
    assert isinstance(task, ScheduleTask)
    assert task.collective is Collective.ALL_REDUCE
    assert task.schedule.ops == schedule.ops and task.schedule.sequences == schedule.sequences
    assert task.rule == RepeatRule(repeats=3, max_repeats=12, precision=0.02)
    calibrate, torch_task = again.tasks[0], again.tasks[2]
    assert isinstance(calibrate, CalibrateTask) and isinstance(torch_task, TorchTask)
    assert calibrate.overhead_rule == RepeatRule(repeats=2, max_repeats=9, precision=0.03)
    assert torch_task.rule == RepeatRule.fixed(1)  # no cap given: exactly `repeats`


def test_tasks_refuse_what_cannot_run() -> None:
    schedule = plan(load_topology(SPEC), 1 << 16, "themis")
    with pytest.raises(TestbedError, match="is for 65536 bytes"):
        ScheduleTask(key=RunKey(planner="themis", message_bytes=4096), schedule=schedule, warmup=0, repeats=1)
    with pytest.raises(TestbedError, match="computes all_reduce, the task asks for all_gather"):
        ScheduleTask(
            key=RunKey(planner="themis", message_bytes=1 << 16),
            schedule=schedule,
            warmup=0,
            repeats=1,
            collective=Collective.ALL_GATHER,
        )
    with pytest.raises(TestbedError, match="whole number of float64"):
        TorchTask(key=RunKey(planner="torch", message_bytes=12), warmup=0, repeats=1, dtype="float64")


def test_every_event_round_trips_through_its_line() -> None:
    key = RunKey(planner="hipipe", message_bytes=4 << 20)
    events = [
        RunDone(key=key, index=2, warmup=False, time_s=0.25),
        RunResult(key=key, times_s=(0.5, 0.25), op_times_s=((0.0, 0.1), (0.1, 0.3))),
        RunResult(key=key, times_s=(0.5,)),
        RunResult(key=key, times_s=(0.5, 0.25), host_cpu_s=(0.95, 0.47)),
        CalibrationSamples(samples=(Sample(dim=1, phase="AG", full_bytes=4096, time_s=0.01),)),
        CalibrationSamples(
            samples=(
                Sample(dim=0, phase="RS", full_bytes=4096, time_s=0.01, host_cpu_s=0.018),
                Sample(dim=0, phase="RS", full_bytes=4096, time_s=0.02, concurrent=True, host_busy_cores=1.9),
            )
        ),
        OverheadTimes(message_bytes=4096, times_s=(0.2, 0.3)),
        OverheadTimes(
            message_bytes=4096, times_s=(0.2, 0.3), host_cpu_s=(0.38, 0.55), memory_bytes_per_s=4e10
        ),
        JobDone(),
    ]
    for event in events:
        line = event_to_line(event)
        assert line.startswith(EVENT_MARK) and "\n" not in line
        assert event_from_line(line) == event
    assert event_from_line("Gloo chatter") is None


def test_measured_schedule_matches_the_executors_conversion() -> None:
    torch_executor = pytest.importorskip("hipipe.torch.executor")
    planned = plan(load_topology(SPEC), 1 << 16, "pipelined", num_chunks=4)
    pairs = tuple((0.01 * i, 0.01 * i + 0.005) for i in range(len(planned.ops)))
    trace = torch_executor.Trace(
        rank=0,
        ops=tuple(torch_executor.OpTiming(index=i, start_s=a, end_s=b) for i, (a, b) in enumerate(pairs)),
        total_s=pairs[-1][1],
    )
    assert measured_schedule(planned, pairs, rank=0) == torch_executor.trace_to_schedule(planned, trace)
    with pytest.raises(TestbedError, match="the trace has 1 ops"):
        measured_schedule(planned, pairs[:1], rank=0)
