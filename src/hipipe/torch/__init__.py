"""Run hipipe schedules for real on torch.distributed (the optional ``torch`` extra).

The core package never imports this module; importing it imports torch. On every
rank, after ``init_process_group(..., timeout=...)``::

    schedule = hipipe.plan(topology, tensor.numel() * tensor.element_size(), "hipipe")
    groups = dimension_groups(topology.sizes, timeout_s=60)   # or pass a DeviceMesh
    allreduce = HierarchicalAllReduce(None, schedule, groups=groups, timeout_s=60)
    trace = allreduce.run(tensor, op="sum", trace=True)       # in place
    measured = trace_to_schedule(schedule, trace)             # draw beside the plan

- :class:`HierarchicalCollective` -- the schedule's collective, with torch's signatures:
  ``all_reduce(tensor)`` (in place; also ``run``), ``reduce_scatter(output, input)``,
  ``all_gather(output, input)``; :class:`HierarchicalAllReduce` is the same class
- :func:`dimension_groups`, :func:`group_for_dims` -- process groups per dim (dim 0 fastest)
- :func:`rings_for_layout` -- those groups with the ring order every member agrees on
- :func:`ring_reduce_scatter`, :func:`ring_all_gather` -- one dim's ring collectives
  (exact bytes, distinct tags; usable alone for calibration); ``native_*`` for NCCL
- :func:`trace_to_schedule` -- measured op times as a schedule, for the Gantt chart
- :mod:`hipipe.torch.comm_hook` -- DDP communication hook; :mod:`hipipe.torch.launch` --
  N local processes (``hipipe run --nproc``, tests)
"""

from hipipe.torch.collectives import (
    ReduceOp,
    native_all_gather,
    native_reduce_scatter,
    ring_all_gather,
    ring_reduce_scatter,
    split,
)
from hipipe.torch.executor import (
    CollectiveError,
    HierarchicalAllReduce,
    HierarchicalCollective,
    OpTiming,
    Trace,
    element_bounds,
    trace_to_schedule,
)
from hipipe.torch.groups import (
    DEFAULT_TIMEOUT_S,
    Ring,
    dimension_groups,
    group_for_dims,
    rings_for_layout,
    rings_from_mesh,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CollectiveError",
    "HierarchicalAllReduce",
    "HierarchicalCollective",
    "OpTiming",
    "ReduceOp",
    "Ring",
    "Trace",
    "dimension_groups",
    "element_bounds",
    "group_for_dims",
    "native_all_gather",
    "native_reduce_scatter",
    "ring_all_gather",
    "ring_reduce_scatter",
    "rings_for_layout",
    "rings_from_mesh",
    "split",
    "trace_to_schedule",
]
