"""The HiPIPE planner (HIPIPE.md section 5) and its ablations.

- :mod:`.structure` -- chunk orders and per-dimension sequences (a schedule without sizes)
- :mod:`.sequencing` -- list scheduling that derives sequences from sizes
- :mod:`.sizing` -- the makespan LP over chunk sizes, HiGHS, warm-started
- :mod:`.search` -- chunk-number ladder, re-sequencing rounds, baseline seeds
- :mod:`.planner` -- the registry functions; the simulator times the result
- :mod:`.explain` -- ``Schedule.info`` as readable text
"""

from hipipe.planners.hipipe.explain import explain
from hipipe.planners.hipipe.planner import (
    plan_hipipe,
    plan_hipipe_fixed_order,
    plan_hipipe_k64,
    plan_hipipe_uniform,
)

__all__ = ["explain", "plan_hipipe", "plan_hipipe_fixed_order", "plan_hipipe_k64", "plan_hipipe_uniform"]
