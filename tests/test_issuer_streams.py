"""The CUDA path's stream and event wiring, checked on CPU with recording stand-ins.

There is no GPU here, so ``torch.cuda``'s streams and events are replaced by objects
that log what the issuer asks of them, and the transfers by a log entry. The log must
show: ops issued in the schedule's global order from one thread, each on its lowest
dim's stream, after a GPU-side wait for its chain predecessor and for the previous op
of each of its dims (unless that ran on the same stream), and no host wait at all.
"""

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hipipe.issue_order import issue_order
from hipipe.planners import plan
from hipipe.schedule import Chunk, Collective, Schedule
from hipipe.simulator import simulate_chunks
from hipipe.topology_io import load_topology

torch = pytest.importorskip("torch")

from hipipe.torch import issuer, threads  # noqa: E402
from hipipe.torch.collectives import ReduceOp  # noqa: E402
from hipipe.torch.threads import OpPlan  # noqa: E402

SPEC = "ring:2:4GB/s:1us,ring:2:2GB/s:1us,switch:2:1GB/s:1us"


class Recorder:
    """Stand-ins for torch.cuda's streams and events; every call lands in ``log``."""

    def __init__(self, num_streams: int) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.streams = [FakeStream(self, f"dim{k}") for k in range(num_streams)]
        self.caller = FakeStream(self, "caller")
        self.current = self.caller
        self.threads: set[int] = set()

    def event(self) -> "FakeEvent":
        return FakeEvent(self)

    @contextlib.contextmanager
    def use(self, stream: "FakeStream") -> Iterator[None]:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def run_plan(self, plan: OpPlan, *args: Any) -> None:
        self.threads.add(threading.get_ident())
        self.log.append(("run", plan.op.index, self.current.name))


class FakeStream:
    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def wait_event(self, event: "FakeEvent") -> None:
        self.recorder.log.append(("wait", self.name, id(event)))


class FakeEvent:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.stream = ""

    def record(self, stream: FakeStream) -> None:
        self.stream = stream.name
        self.recorder.log.append(("record", id(self), stream.name))

    def synchronize(self) -> None:
        self.recorder.log.append(("host-wait", id(self)))


def issue(schedule: Schedule, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Run the issuer over ``schedule`` with everything CUDA recorded instead of done."""
    recorder = Recorder(schedule.topology.num_dims)
    monkeypatch.setattr(torch.cuda, "Event", recorder.event)
    monkeypatch.setattr(torch.cuda, "stream", recorder.use)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: recorder.current)
    monkeypatch.setattr(threads, "run_plan", recorder.run_plan)  # the transfers of RunState.run_timed
    plans = [OpPlan(op=op, ring=None, start=0, stop=0, native=True) for op in schedule.ops]
    run = issuer.OrderedIssue(
        plans=plans,
        order=issue_order(schedule),
        num_dims=schedule.topology.num_dims,
        flat=torch.zeros(1),
        op=ReduceOp.SUM,
        tag_offset=0,
        tag_stride=1,
        rank=0,
        streams=recorder.streams,  # type: ignore[arg-type]
        sync_for_trace=False,
        deadline_s=float("inf"),
    )
    run.execute(60.0)
    return recorder


def check_log(schedule: Schedule, recorder: Recorder) -> None:
    log = recorder.log
    runs = [entry for entry in log if entry[0] == "run"]
    assert [index for _, index, _ in runs] == list(issue_order(schedule))
    assert len(recorder.threads) == 1, "one issuing thread"
    assert not [entry for entry in log if entry[0] == "host-wait"], "no host wait between ops"
    # Every stream first waits for the caller's stream (the tensor's producer).
    ready = next(entry for entry in log if entry[0] == "record")
    assert ready[2] == "caller"
    assert {e[1] for e in log[: 1 + len(recorder.streams)] if e[0] == "wait"} == {
        s.name for s in recorder.streams
    }
    at_run = {entry[1]: position for position, entry in enumerate(log) if entry[0] == "run"}
    event_of: dict[int, tuple[int, str]] = {}  # op -> (event id, stream it was recorded on)
    for position, entry in enumerate(log):
        if entry[0] == "record" and position > 0 and log[position - 1][0] == "run":
            event_of[log[position - 1][1]] = (entry[1], entry[2])

    def waited(later: int, earlier: int) -> bool:
        """``later``'s stream waited on ``earlier``'s event before ``later`` ran (or shares its stream)."""
        event, stream = event_of[earlier]
        mine = f"dim{min(schedule.ops[later].dims)}"
        if stream == mine:
            return True
        return any(log[p] == ("wait", mine, event) for p in range(at_run[earlier], at_run[later]))

    for op in schedule.ops:
        assert runs[[r[1] for r in runs].index(op.index)][2] == f"dim{min(op.dims)}"
        if op.step > 0:
            assert waited(op.index, op.index - 1), f"op {op.index} does not wait for its chain predecessor"
    for k, sequence in enumerate(schedule.sequences):
        for earlier, later in itertools.pairwise(sequence):
            assert waited(later, earlier), f"dim {k}: op {later} does not wait for op {earlier}"


@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("planner", ["ring", "hierarchical", "pipelined", "themis"])
def test_wiring_for_every_baseline(
    planner: str, collective: Collective, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = plan(load_topology(SPEC), 1 << 20, planner, num_chunks=None, collective=collective)
    check_log(schedule, issue(schedule, monkeypatch))


def test_wiring_with_grouped_dims(monkeypatch: pytest.MonkeyPatch) -> None:
    topology = load_topology(SPEC)
    orders = [((0, 1), (2,)), ((2,), (0, 1)), ((1,), (0, 2)), ((0, 1, 2),)]
    chunks = [Chunk(index=j, size_bytes=1000.0 * (j + 1), order=order) for j, order in enumerate(orders)]
    for collective in Collective:
        schedule = simulate_chunks(topology, 10000, chunks, collective=collective)
        check_log(schedule, issue(schedule, monkeypatch))


def test_a_missing_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not a rubber stamp: drop the chain waits and it fails."""
    schedule = plan(load_topology(SPEC), 1 << 20, "pipelined", num_chunks=4)
    recorder = issue(schedule, monkeypatch)
    chain_events = set()
    for position, entry in enumerate(recorder.log):
        if entry[0] == "record" and recorder.log[position - 1][0] == "run":
            chain_events.add(entry[1])
    recorder.log = [e for e in recorder.log if not (e[0] == "wait" and e[2] in chain_events)]
    with pytest.raises(AssertionError, match="does not wait"):
        check_log(schedule, recorder)
