"""What the parent and the testbed workers say to each other: typed tasks, events and jobs.

The parent writes one :class:`Job` (JSON) that every rank reads; rank 0 answers with
:data:`Event` lines on stdout. Runs are named by a :class:`RunKey` ``(planner,
message_bytes)`` end to end, never by a string to split again. Schedules travel inside
the job, planned once by the parent. A measured trace comes back as op
``(start_s, end_s)`` pairs and becomes a schedule with :func:`measured_schedule`, so the
parent never needs torch to draw it.

One value the workers need mid-job is answered through the parent's ``TCPStore``: the
calibration's overhead schedule depends on the samples just measured, so the parent
fits them when :class:`CalibrationSamples` arrives, plans the schedule once and
publishes it under :data:`OVERHEAD_SCHEDULE_KEY`; the workers wait for that key.

Torch-free: the parent imports this module; only the worker and the rank-side
measurement import torch.
"""

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hipipe.repeats import RepeatRule
from hipipe.schedule import Collective, Schedule, schedule_from_dict, schedule_to_dict
from hipipe.testbed.fit import Sample
from hipipe.testbed.layout import TestbedError
from hipipe.units import format_size

EVENT_MARK = "@hipipe-event "
"""Prefix of rank 0's machine-readable stdout lines (anything else is a library's chatter)."""

OVERHEAD_SCHEDULE_KEY = "hipipe/overhead-schedule"
"""Store key under which the parent publishes the calibration's overhead schedule (JSON)."""

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
}
"""Element sizes of the dtypes a task may use, known without importing torch."""


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class RunKey:
    """Names one measured row: which planner (or reference) and which message size."""

    planner: str
    message_bytes: int

    def describe(self) -> str:
        return f"{self.planner} {format_size(self.message_bytes)}"

    def to_dict(self) -> dict[str, Any]:
        return {"planner": self.planner, "message_bytes": self.message_bytes}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "RunKey":
        return RunKey(planner=str(data["planner"]), message_bytes=int(data["message_bytes"]))


def _check_dtype(dtype: str, message_bytes: int) -> None:
    if dtype not in DTYPE_BYTES:
        raise TestbedError(f"unknown dtype {dtype!r} (use {', '.join(DTYPE_BYTES)})")
    if message_bytes <= 0 or message_bytes % DTYPE_BYTES[dtype]:
        raise TestbedError(f"{message_bytes} bytes is not a positive whole number of {dtype} elements")


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrateTask:
    """Ring RS/AG per dimension at several sizes, then (optionally) the overhead schedule."""

    sizes_bytes: tuple[int, ...]
    repeats: int
    concurrent_window_s: float = 0.0
    overhead_message_bytes: int = 0
    """0: no overhead run. Otherwise the ranks wait for :data:`OVERHEAD_SCHEDULE_KEY`."""
    overhead_max_repeats: int = 0
    """Cap on the overhead run's timed repeats (0: exactly ``repeats``); the per-op cost is
    fitted to their median, so it gets the same rule as a bench row."""
    overhead_precision: float = 0.0

    @property
    def overhead_rule(self) -> RepeatRule:
        return _rule(self.repeats, self.overhead_max_repeats, self.overhead_precision)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleTask:
    """The executor on one schedule: warm-up runs (checked), then timed repeats."""

    key: RunKey
    schedule: Schedule
    warmup: int
    repeats: int
    max_repeats: int = 0
    """Cap on the timed repeats when the median is not yet settled (0: exactly ``repeats``)."""
    precision: float = 0.0
    """Relative standard error of the median at which to stop (:class:`~hipipe.repeats.RepeatRule`)."""
    dtype: str = "float32"
    collective: Collective = Collective.ALL_REDUCE
    """What the run computes; must be the schedule's own collective."""
    trace: bool = False
    """Also return rank 0's op times of the last repeat."""

    def __post_init__(self) -> None:
        if self.key.message_bytes != self.schedule.message_bytes:
            raise TestbedError(
                f"{self.key.describe()}: the schedule is for {self.schedule.message_bytes} bytes"
            )
        if self.collective is not self.schedule.collective:
            raise TestbedError(
                f"{self.key.describe()}: the schedule computes {self.schedule.collective.value},"
                f" the task asks for {self.collective.value}"
            )
        _check_dtype(self.dtype, self.key.message_bytes)

    @property
    def rule(self) -> RepeatRule:
        return _rule(self.repeats, self.max_repeats, self.precision)


def _rule(repeats: int, max_repeats: int, precision: float) -> RepeatRule:
    return RepeatRule(repeats=repeats, max_repeats=max(repeats, max_repeats), precision=precision)


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchTask:
    """The reference: torch.distributed's own collective on the same message."""

    key: RunKey
    warmup: int
    repeats: int
    max_repeats: int = 0
    """As :attr:`ScheduleTask.max_repeats`."""
    precision: float = 0.0
    dtype: str = "float32"
    collective: Collective = Collective.ALL_REDUCE

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.key.message_bytes)

    @property
    def rule(self) -> RepeatRule:
        return _rule(self.repeats, self.max_repeats, self.precision)


Task = CalibrateTask | ScheduleTask | TorchTask


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """Everything a worker needs: where it lives, where the store is, what to run."""

    netns: tuple[str, ...]
    ifnames: tuple[str, ...]
    store_host: str
    store_port: int
    sizes: tuple[int, ...]
    timeout_s: float
    tasks: tuple[Task, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return len(self.netns)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunDone:
    """One run of a task finished (progress)."""

    key: RunKey
    index: int
    warmup: bool
    time_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """A task's timed repeats (the slowest rank's time each), and rank 0's trace if asked."""

    key: RunKey
    times_s: tuple[float, ...]
    op_times_s: tuple[tuple[float, float], ...] | None = None
    """``(start_s, end_s)`` of each op of the schedule, on rank 0, in the last repeat."""
    host_cpu_s: tuple[float, ...] = ()
    """The busy CPU seconds of rank 0's host during each timed repeat (every rank on it;
    empty where the host's CPU time cannot be read): whether a run was bound by the CPU."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationSamples:
    """The per-dimension samples (maxima over ranks), sent before any overhead run."""

    samples: tuple[Sample, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class OverheadTimes:
    """The overhead schedule's timed repeats, one traced run on rank 0, the memory bandwidth."""

    message_bytes: int
    times_s: tuple[float, ...]
    op_times_s: tuple[tuple[float, float], ...] = ()
    """``(start_s, end_s)`` of each op on rank 0 in one more (traced) run: the per-op
    hand-off, concurrency and jitter are fitted from it (:mod:`hipipe.testbed.fit`)."""
    memory_bytes_per_s: float = 0.0
    """Rank 0's memory bandwidth for the local reduction (0: not measured)."""
    host_cpu_s: tuple[float, ...] = ()
    """The host's busy CPU seconds per timed repeat, read by rank 0 (empty: not read)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobDone:
    """Every task ran on every rank."""


Event = RunDone | RunResult | CalibrationSamples | OverheadTimes | JobDone

_TASK_TAGS: dict[type, str] = {CalibrateTask: "calibrate", ScheduleTask: "schedule", TorchTask: "torch"}
_EVENT_TAGS: dict[type, str] = {
    RunDone: "run",
    RunResult: "result",
    CalibrationSamples: "calibration",
    OverheadTimes: "overhead",
    JobDone: "done",
}


def _task_to_dict(task: Task) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": _TASK_TAGS[type(task)]}
    for f in dataclasses.fields(task):
        value = getattr(task, f.name)
        if isinstance(value, RunKey):
            value = value.to_dict()
        elif isinstance(value, Schedule):
            value = schedule_to_dict(value)
        elif isinstance(value, Collective):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _task_from_dict(data: dict[str, Any]) -> Task:
    kind = data.get("kind")
    fields = {k: v for k, v in data.items() if k != "kind"}
    if "key" in fields:
        fields["key"] = RunKey.from_dict(fields["key"])
    if "collective" in fields:
        fields["collective"] = Collective.parse(fields["collective"])
    if kind == "calibrate":
        fields["sizes_bytes"] = tuple(int(s) for s in fields["sizes_bytes"])
        return CalibrateTask(**fields)
    if kind == "schedule":
        fields["schedule"] = schedule_from_dict(fields["schedule"])
        return ScheduleTask(**fields)
    if kind == "torch":
        return TorchTask(**fields)
    raise TestbedError(f"unknown task kind {kind!r}")


def job_to_json(job: Job) -> str:
    return json.dumps(
        {
            "netns": list(job.netns),
            "ifnames": list(job.ifnames),
            "store_host": job.store_host,
            "store_port": job.store_port,
            "sizes": list(job.sizes),
            "timeout_s": job.timeout_s,
            "tasks": [_task_to_dict(t) for t in job.tasks],
        }
    )


def job_from_json(text: str) -> Job:
    data = json.loads(text)
    return Job(
        netns=tuple(data["netns"]),
        ifnames=tuple(data["ifnames"]),
        store_host=str(data["store_host"]),
        store_port=int(data["store_port"]),
        sizes=tuple(int(s) for s in data["sizes"]),
        timeout_s=float(data["timeout_s"]),
        tasks=tuple(_task_from_dict(t) for t in data["tasks"]),
    )


def event_to_line(event: Event) -> str:
    """One stdout line: :data:`EVENT_MARK` and the event as JSON."""
    body: dict[str, Any] = {"event": _EVENT_TAGS[type(event)]}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, RunKey):
            value = value.to_dict()
        elif f.name == "samples":
            value = [dataclasses.asdict(s) for s in value]
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        body[f.name] = value
    return EVENT_MARK + json.dumps(body)


def event_from_line(line: str) -> Event | None:
    """The event on a worker's stdout line; None for any other line."""
    if not line.startswith(EVENT_MARK):
        return None
    data = json.loads(line[len(EVENT_MARK) :])
    tag = data.pop("event")
    if tag == "run":
        return RunDone(
            key=RunKey.from_dict(data["key"]),
            index=int(data["index"]),
            warmup=bool(data["warmup"]),
            time_s=float(data["time_s"]),
        )
    if tag == "result":
        op_times = data.get("op_times_s")
        return RunResult(
            key=RunKey.from_dict(data["key"]),
            times_s=tuple(float(t) for t in data["times_s"]),
            op_times_s=None if op_times is None else tuple((float(a), float(b)) for a, b in op_times),
            host_cpu_s=tuple(float(c) for c in data.get("host_cpu_s", ())),
        )
    if tag == "calibration":
        return CalibrationSamples(samples=tuple(Sample(**s) for s in data["samples"]))
    if tag == "overhead":
        return OverheadTimes(
            message_bytes=int(data["message_bytes"]),
            times_s=tuple(float(t) for t in data["times_s"]),
            op_times_s=tuple((float(a), float(b)) for a, b in data.get("op_times_s", ())),
            memory_bytes_per_s=float(data.get("memory_bytes_per_s", 0.0)),
            host_cpu_s=tuple(float(c) for c in data.get("host_cpu_s", ())),
        )
    if tag == "done":
        return JobDone()
    raise TestbedError(f"unknown worker event {tag!r}")


def measured_schedule(planned: Schedule, op_times_s: Sequence[tuple[float, float]], *, rank: int) -> Schedule:
    """``planned`` with the measured op times of one rank, for a Gantt chart beside the plan.

    The same result as :func:`hipipe.torch.executor.trace_to_schedule`, from plain pairs,
    so whoever holds a trace from a worker does not need torch to draw it.
    """
    if len(op_times_s) != len(planned.ops):
        raise TestbedError(f"the trace has {len(op_times_s)} ops, the schedule {len(planned.ops)}")
    ops = tuple(
        dataclasses.replace(op, start_s=start_s, end_s=end_s)
        for op, (start_s, end_s) in zip(planned.ops, op_times_s, strict=True)
    )
    return dataclasses.replace(
        planned,
        ops=ops,
        makespan_s=max((end_s for _, end_s in op_times_s), default=0.0),
        info={**dict(planned.info), "measured": True, "rank": rank},
    )
