"""The HiPIPE planner and its ablations (the model: docs/MODEL.md).

- :mod:`.structure` -- chunk orders and per-dimension sequences (a schedule without sizes)
- :mod:`.sequencing` -- list scheduling that derives sequences from sizes
- :mod:`.sizing` -- the makespan LP over chunk sizes, HiGHS, warm-started
- :mod:`.candidates` -- one structure: list-scheduled sequences, LP sizes, rounds
- :mod:`.families` -- which chunk orders to try for a given number of chunks
- :mod:`.search` -- the chunk-number ladder, floors and the plan-time budget
- :mod:`.local_search` -- order climbing for few-chunk plans
- :mod:`.enumeration` -- every order multiset of K <= 3 chunks where there are few enough,
  screened without LPs
- :mod:`.sequence_mip` -- optimal per-dim sequences for fixed orders (a small MIP, K <= 4)
- :mod:`.splitting` -- larger K seeded from the best plan by splitting its chunks (the ramp)
- :mod:`.seeds` -- the baselines' own structures, re-sized (never worse than them)
- :mod:`.planner` -- the registry functions; the simulator times the result
- :mod:`.explain` -- ``Schedule.info`` as readable text
"""

from hipipe.planners.hipipe.explain import explain
from hipipe.planners.hipipe.planner import (
    HipipePlans,
    plan_hipipe,
    plan_hipipe_fixed_order,
    plan_hipipe_k64,
    plan_hipipe_uniform,
)

__all__ = [
    "HipipePlans",
    "explain",
    "plan_hipipe",
    "plan_hipipe_fixed_order",
    "plan_hipipe_k64",
    "plan_hipipe_uniform",
]
