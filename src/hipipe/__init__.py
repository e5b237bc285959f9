"""hipipe: plan, simulate, check and run pipelined hierarchical AllReduce.

The pipeline is a chain of plain functions over data::

    topology -> planner -> Schedule -> {check, simulate, executor, report}

Public API (everything else is an implementation detail):

- :func:`load_topology` -- preset name, one-line spec, hipipe or ASTRA-sim YAML
- :func:`plan` -- run a planner by name, get a :class:`Schedule`
- :func:`simulate` -- replay a schedule under the cost model
- :func:`lower_bound_s` -- the physical limit ``2 (N-1)/N * M / sum B_k``
"""

from hipipe.cost import lower_bound_s, utilization
from hipipe.errors import HipipeError, ScheduleError, SolverError, TopologyError
from hipipe.planners import BASELINES, PLANNERS, plan
from hipipe.presets import PRESETS
from hipipe.schedule import Chunk, Op, Phase, Schedule
from hipipe.simulator import Policy, simulate, simulate_chunks
from hipipe.topology import Algorithm, Dimension, Kind, Topology
from hipipe.topology_io import load_topology

__all__ = [
    "BASELINES",
    "PLANNERS",
    "PRESETS",
    "Algorithm",
    "Chunk",
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
    "load_topology",
    "lower_bound_s",
    "plan",
    "simulate",
    "simulate_chunks",
    "utilization",
]
