"""The ``exact`` planner: a mixed-integer program that proves the best K-chunk schedule.

- :mod:`.model` -- variables, rows, MIP starts and decoding
- :mod:`.first_dims` -- the same MIP split into one per multiset of the chunks' first dims
- :mod:`.planner` -- limits, seeds, HiGHS, the simulator's re-timing and the checker
"""

from hipipe.planners.exact.planner import DEFAULT_TIME_LIMIT_S, MAX_CHUNKS, MAX_DIMS, METHODS, plan_exact

__all__ = ["DEFAULT_TIME_LIMIT_S", "MAX_CHUNKS", "MAX_DIMS", "METHODS", "plan_exact"]
