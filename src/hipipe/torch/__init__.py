"""Run hipipe schedules for real on torch.distributed (the optional ``torch`` extra).

The core package never imports this module; importing it imports torch.

- :class:`HierarchicalAllReduce` -- in-place AllReduce following a schedule
- :func:`dimension_groups`, :func:`group_for_dims` -- process groups per dim (dim 0 fastest)
- :func:`ring_reduce_scatter`, :func:`ring_all_gather` -- one dim's ring collectives
- :func:`trace_to_schedule` -- measured op times as a schedule, for the Gantt chart
"""

from hipipe.torch.collectives import ReduceOp, ring_all_gather, ring_reduce_scatter, split
from hipipe.torch.executor import (
    CollectiveError,
    HierarchicalAllReduce,
    OpTiming,
    Trace,
    element_bounds,
    trace_to_schedule,
)
from hipipe.torch.groups import DEFAULT_TIMEOUT_S, Ring, dimension_groups, group_for_dims

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CollectiveError",
    "HierarchicalAllReduce",
    "OpTiming",
    "ReduceOp",
    "Ring",
    "Trace",
    "dimension_groups",
    "element_bounds",
    "group_for_dims",
    "ring_all_gather",
    "ring_reduce_scatter",
    "split",
    "trace_to_schedule",
]
