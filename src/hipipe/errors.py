"""User-facing error types.

Every error a user can cause (bad topology, bad size, unreadable file, a schedule
that is not an AllReduce) is a :class:`HipipeError`. The CLI prints its message on
one line and exits with code 2; anything else is a bug and keeps its traceback.
"""


class HipipeError(ValueError):
    """A problem with the user's input, explained in one line."""


class TopologyError(HipipeError):
    """A topology (preset, spec or file) is malformed or physically impossible."""


class ScheduleError(HipipeError):
    """A schedule is malformed, or does not fit the topology or message it claims."""


class SolverError(HipipeError):
    """The LP solver did not return an optimal solution; the status is in the message."""
