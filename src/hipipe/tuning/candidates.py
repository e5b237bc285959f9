"""What ``hipipe tune`` measures, and how it picks. Pure and torch-free.

Candidates: hipipe's own plan, hipipe re-planned at the next-best numbers of chunks its
search found (``Schedule.info["candidates"]``: the model ranks them close, the network
may not), and every baseline. The model is right about most things and wrong about a
few (per-op overheads, contention on shared cores); measuring a handful of good plans
on the real network and keeping the fastest is what autotuners in BLAS libraries and
NCCL do.

Selection is the smallest median of the timed repeats (a median, not a mean: one
descheduled rank must not decide); on a tie, the earlier candidate, so hipipe's own
plan wins ties.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hipipe.errors import HipipeError
from hipipe.planners import BASELINES, plan, validate_request
from hipipe.planners.hipipe import HipipePlans
from hipipe.predict import predicted_s
from hipipe.schedule import Collective, Schedule
from hipipe.topology import Topology
from hipipe.tuning.cache import Measurement, TunedEntry, TuningError, TuningKey

DEFAULT_BEST_FEW = 3
"""hipipe plans per tuning: its own, and re-plans at the next-best K of its search."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One schedule to measure, under a name unique within the tuning."""

    name: str
    schedule: Schedule


def best_chunk_counts(schedule: Schedule, best_few: int) -> list[int]:
    """The requested K of the best ``best_few`` distinct Ks hipipe's search timed, best first.

    Read from ``info["candidates"]`` (entries with a ``makespan_s``). The re-plans share
    the first plan's sequence MIPs (:class:`~hipipe.planners.hipipe.HipipePlans`), which
    makes them cheap.
    """
    best_per_k: dict[int, float] = {}
    for entry in schedule.info.get("candidates", []):
        if "makespan_s" not in entry:
            continue
        k = int(entry["num_chunks"])
        best_per_k[k] = min(best_per_k.get(k, float("inf")), float(entry["makespan_s"]))
    return sorted(best_per_k, key=lambda k: (best_per_k[k], k))[:best_few]


def tuning_candidates(
    topology: Topology,
    message_bytes: int,
    *,
    collective: Collective | str = Collective.ALL_REDUCE,
    best_few: int = DEFAULT_BEST_FEW,
    baselines: Sequence[str] = BASELINES,
) -> list[Candidate]:
    """hipipe's best few distinct plans (its own first), then every baseline."""
    if best_few < 1:
        raise TuningError("need at least one hipipe candidate (--best-few >= 1)")
    kind = Collective.parse(collective)  # as plan() takes it: a Collective or its name
    validate_request(topology, message_bytes, num_chunks=None, collective=kind)
    hipipe = HipipePlans(topology, message_bytes, collective=kind)  # one set of MIPs
    chosen = hipipe.plan()
    out = [Candidate(name="hipipe", schedule=chosen)]
    # A K whose plan equals one already kept (often the search's own best) is skipped;
    # look a few Ks further so that up to best_few distinct hipipe plans remain.
    for k in best_chunk_counts(chosen, best_few + 3):
        if len(out) >= best_few:
            break
        try:
            schedule = hipipe.plan(num_chunks=k)
        except HipipeError:
            continue  # a K the search tried may still fail alone (LP): skip it, the others stand
        if not any(same_plan(schedule, c.schedule) for c in out):
            out.append(Candidate(name=f"hipipe K={k}", schedule=schedule))
    # Every baseline is measured under its own name, even when hipipe found the same plan:
    # the report then answers "how does X do here" for each of them.
    out += [
        Candidate(name=name, schedule=plan(topology, message_bytes, name, collective=kind))
        for name in baselines
    ]
    return out


def same_plan(a: Schedule, b: Schedule) -> bool:
    """Same chunk orders, sizes to the byte, and sequences: measuring both says nothing new."""
    if a.sequences != b.sequences or len(a.chunks) != len(b.chunks):
        return False
    return all(
        x.order == y.order and round(x.size_bytes) == round(y.size_bytes)
        for x, y in zip(a.chunks, b.chunks, strict=True)
    )


def select_fastest(measurements: Sequence[Measurement]) -> Measurement:
    """The measurement with the smallest median; the earliest on a tie."""
    if not measurements:
        raise TuningError("nothing was measured")
    return min(enumerate(measurements), key=lambda item: (item[1].median_s, item[0]))[1]


def tuned_entry(
    key: TuningKey,
    candidates: Sequence[Candidate],
    times_s: Mapping[str, Sequence[float]],
    *,
    warmup: int,
    source: str,
    topology_name: str = "",
) -> TunedEntry:
    """Measurements of every candidate (``times_s`` by name) and the fastest one's schedule."""
    measurements = tuple(
        Measurement(
            name=c.name,
            planner=c.schedule.planner,
            num_chunks=c.schedule.num_chunks,
            predicted_s=predicted_s(c.schedule),
            times_s=tuple(times_s[c.name]),
        )
        for c in candidates
    )
    fastest = select_fastest(measurements)
    schedule = next(c.schedule for c in candidates if c.name == fastest.name)
    return TunedEntry(
        key=key,
        chosen=fastest.name,
        schedule=schedule,
        measurements=measurements,
        warmup=warmup,
        source=source,
        topology_name=topology_name,
    )
