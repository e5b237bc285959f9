"""hipipe: plan, simulate, check and run pipelined hierarchical collectives.

The pipeline is a chain of plain functions over data::

    topology -> planner -> Schedule -> {check, simulate, executor, report}

Public API (everything else is an implementation detail):

- :func:`load_topology` -- preset name, one-line spec, hipipe or ASTRA-sim YAML
- :func:`plan` -- run a planner by name, get a :class:`Schedule`
- :func:`simulate` -- replay a schedule under the cost model
- :func:`check` -- prove that a schedule is an AllReduce (knows nothing of planners)
- :func:`compare` -- several planners over several message sizes, against the bounds
- :func:`lower_bound_s`, :func:`order_mix_bound_s` -- the physical and the order-mix limits
"""

from hipipe.bounds import order_mix_bound_s
from hipipe.checker import CheckReport, check, check_or_raise
from hipipe.compare import Comparison, compare
from hipipe.cost import lower_bound_s, utilization
from hipipe.errors import HipipeError, ScheduleError, SolverError, TopologyError
from hipipe.planners import BASELINES, PLANNERS, plan
from hipipe.presets import PRESETS
from hipipe.schedule import Chunk, Collective, Op, Phase, Schedule
from hipipe.simulator import Policy, simulate, simulate_chunks
from hipipe.topology import Algorithm, Dimension, Kind, Topology
from hipipe.topology_io import load_topology

__all__ = [
    "BASELINES",
    "PLANNERS",
    "PRESETS",
    "Algorithm",
    "CheckReport",
    "Chunk",
    "Collective",
    "Comparison",
    "Dimension",
    "HipipeError",
    "Kind",
    "Op",
    "Phase",
    "Policy",
    "Schedule",
    "ScheduleError",
    "SolverError",
    "Topology",
    "TopologyError",
    "check",
    "check_or_raise",
    "compare",
    "load_topology",
    "lower_bound_s",
    "order_mix_bound_s",
    "plan",
    "simulate",
    "simulate_chunks",
    "utilization",
]
