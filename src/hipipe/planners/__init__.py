"""Planners: functions ``(topology, message_bytes, *, num_chunks=None, collective) -> Schedule``.

Every planner returns the same :class:`~hipipe.schedule.Schedule`; no consumer knows
which planner made one.
"""

from collections.abc import Callable
from dataclasses import dataclass

from hipipe.errors import HipipeError
from hipipe.planners.baselines import plan_hierarchical, plan_pipelined, plan_ring, plan_themis
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
            description="Themis: greedy orders, K=64, smallest-chunk-first",
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
    """Run one planner by name for one collective (``all_reduce`` by default)."""
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, int) or message_bytes <= 0:
        raise HipipeError(f"message size must be a positive whole number of bytes, got {message_bytes!r}")
    if num_chunks is not None and num_chunks < 1:
        raise HipipeError(f"the number of chunks must be >= 1, got {num_chunks}")
    kind = Collective.parse(collective)
    return get_planner(planner).function(topology, message_bytes, num_chunks=num_chunks, collective=kind)
