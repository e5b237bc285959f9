"""The ``exact`` planner: a mixed-integer program that proves the best K-chunk schedule.

- :mod:`.model` -- variables, rows, MIP starts and decoding
- :mod:`.first_dims` -- the same MIP split into one per multiset of the chunks' first dims
- :mod:`.regions` -- one region of a split MIP, solved here or in worker processes
- :mod:`.planner` -- limits, seeds, HiGHS, the simulator's re-timing and the checker
- :mod:`.floor` -- the same MIPs asked whether any schedule beats a given time (a proven floor)
- :mod:`.journal` -- the regions a floor proof answered, kept on disk so a later run resumes
"""

from hipipe.planners.exact.floor import MAX_FLOOR_CHUNKS, FloorProof, floor_instance, prove_floor
from hipipe.planners.exact.planner import DEFAULT_TIME_LIMIT_S, MAX_CHUNKS, MAX_DIMS, METHODS, plan_exact

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "MAX_CHUNKS",
    "MAX_DIMS",
    "MAX_FLOOR_CHUNKS",
    "METHODS",
    "FloorProof",
    "floor_instance",
    "plan_exact",
    "prove_floor",
]
