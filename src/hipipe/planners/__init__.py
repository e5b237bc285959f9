"""Planners: functions ``(topology, message_bytes, *, num_chunks=None, collective) -> Schedule``.

Every planner returns the same :class:`~hipipe.schedule.Schedule`; no consumer knows
which planner made one.
"""

from collections.abc import Callable
from dataclasses import dataclass

from hipipe.errors import HipipeError
from hipipe.planners.baselines import (
    plan_hierarchical,
    plan_pipelined,
    plan_ring,
    plan_themis,
    plan_themis_ideal,
)
from hipipe.planners.exact import plan_exact
from hipipe.planners.hipipe import (
    explain,
    plan_hipipe,
    plan_hipipe_fixed_order,
    plan_hipipe_k64,
    plan_hipipe_uniform,
)
from hipipe.schedule import Collective, Schedule
from hipipe.topology import Topology

PlannerFn = Callable[..., Schedule]


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerSpec:
    name: str
    function: PlannerFn
    description: str
    baseline: bool
    explain: Callable[[Schedule], str] | None = None
    """Renders the planner's own ``Schedule.info``; reports fall back to a generic layout."""


PLANNERS: dict[str, PlannerSpec] = {
    spec.name: spec
    for spec in (
        PlannerSpec(name="ring", function=plan_ring, description="flat ring over all NPUs", baseline=True),
        PlannerSpec(
            name="hierarchical",
            function=plan_hierarchical,
            description="one chunk, ascending, no pipelining",
            baseline=True,
        ),
        PlannerSpec(
            name="pipelined",
            function=plan_pipelined,
            description="K=64 equal chunks, ascending, FIFO",
            baseline=True,
        ),
        PlannerSpec(
            name="themis",
            function=plan_themis,
            description="Themis as ASTRA-sim runs it: OfflineGreedy orders, K=64, its smallest-first list",
            baseline=True,
        ),
        PlannerSpec(
            name="themis-ideal",
            function=plan_themis_ideal,
            description="idealized Themis: fresh greedy orders, equal chunks, SCF FIFO among equals",
            baseline=True,
        ),
        PlannerSpec(
            name="hipipe",
            function=plan_hipipe,
            explain=explain,
            description="HiPIPE: order mix, LP chunk sizes, searched K",
            baseline=False,
        ),
        PlannerSpec(
            name="hipipe-uniform",
            function=plan_hipipe_uniform,
            explain=explain,
            description="ablation: hipipe with uniform chunk sizes",
            baseline=False,
        ),
        PlannerSpec(
            name="hipipe-k64",
            function=plan_hipipe_k64,
            explain=explain,
            description="ablation: hipipe with K fixed to 64",
            baseline=False,
        ),
        PlannerSpec(
            name="hipipe-fixed-order",
            function=plan_hipipe_fixed_order,
            explain=explain,
            description="ablation: hipipe with ascending order only",
            baseline=False,
        ),
    )
}
"""Name -> planner, baselines first."""

BASELINES: tuple[str, ...] = tuple(name for name, spec in PLANNERS.items() if spec.baseline)

REFERENCE_PLANNERS: dict[str, PlannerSpec] = {
    "exact": PlannerSpec(
        name="exact",
        function=plan_exact,
        description="MIP: the proven-best schedule with at most K chunks (needs K; small networks only)",
        baseline=False,
    )
}
"""Yardsticks, not planners for every instance: they need ``num_chunks``, refuse large
networks and may run up to a time limit, so sweeps over :data:`PLANNERS` leave them out.
:func:`plan` and :func:`get_planner` find them by name like any planner."""


def get_planner(name: str) -> PlannerSpec:
    spec = PLANNERS.get(name) or REFERENCE_PLANNERS.get(name)
    if spec is None:
        available = ", ".join([*PLANNERS, *REFERENCE_PLANNERS])
        raise HipipeError(f"unknown planner {name!r} (available: {available})")
    return spec


def plan(
    topology: Topology,
    message_bytes: int,
    planner: str = "hipipe",
    *,
    num_chunks: int | None = None,
    collective: Collective | str = Collective.ALL_REDUCE,
) -> Schedule:
    """Run one planner by name for one collective (``all_reduce`` by default).

    The one place the request is validated: the planner functions trust what they get.
    """
    spec = get_planner(planner)
    kind = Collective.parse(collective)
    validate_request(topology, message_bytes, num_chunks=num_chunks, collective=kind)
    return spec.function(topology, message_bytes, num_chunks=num_chunks, collective=kind)


def validate_request(
    topology: Topology, message_bytes: int, *, num_chunks: int | None, collective: Collective
) -> None:
    """One-line :class:`HipipeError` for a message or chunk number no planner can take.

    ReduceScatter and AllGather cut the buffer into N equal shards, one per rank, so their
    message must be a whole multiple of N bytes (torch's reduce_scatter_tensor and
    all_gather_into_tensor require the same of the element count).
    """
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, int) or message_bytes <= 0:
        raise HipipeError(f"message size must be a positive whole number of bytes, got {message_bytes!r}")
    if num_chunks is not None and (isinstance(num_chunks, bool) or num_chunks < 1):
        raise HipipeError(f"the number of chunks must be >= 1, got {num_chunks}")
    n = topology.num_npus
    if collective is not Collective.ALL_REDUCE and message_bytes % n:
        raise HipipeError(
            f"{collective.value} splits the message into {n} equal shards (one per rank): {message_bytes}"
            f" bytes is not a multiple of {n}; use e.g. {(message_bytes // n + 1) * n} bytes"
        )
