"""ReduceScatter and AllGather are each other's schedules read backwards in time.

A ReduceScatter chunk of order ``pi`` runs ``RS(pi[0]), RS(pi[1]), ...`` on shrinking
pieces; the AllGather chunk of the same order runs ``AG(pi[-1]), ..., AG(pi[0])`` on
growing ones, the same ops with their wide sides swapped. Reverse time in a ReduceScatter
schedule (every chain and every dim's sequence read backwards) and it is an AllGather
schedule of the same chunks. Under the alpha-beta model both phases of an op cost the
same, so the mirrored schedule is no slower (the simulator starts every op as soon as its
predecessors allow, which can only move ends earlier); with a local reduction cost
(``memory_bytes_per_s``) the ReduceScatter side pays it and the AllGather side does not,
so a mirror is re-timed under its own collective before it is compared.

Why the planner needs it: the search does not treat the two collectives alike (its list
schedules start every chunk at once and leave the ends ragged, which suits ReduceScatter),
and on the reference grid its plans for the two differed by up to 1.0% (rfs-3d at 64 MiB:
AllGather 0.2648 ms, ReduceScatter 0.2674 ms; libra-4d at 1 GiB: ReduceScatter 2.555 ms,
AllGather 2.573 ms), although the best schedule of either is the mirror of the other's.
"""

from hipipe.schedule import Collective, Schedule
from hipipe.simulator import Policy, simulate_chunks

MIRRORED: dict[Collective, Collective] = {
    Collective.REDUCE_SCATTER: Collective.ALL_GATHER,
    Collective.ALL_GATHER: Collective.REDUCE_SCATTER,
}
"""The collectives whose schedules mirror each other; AllReduce is its own mirror already."""


def mirrored_sequences(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """Each dim's sequence read backwards, as op indices of the mirrored collective.

    Ops are numbered chunk-major in both collectives with the same chain lengths, so op
    ``step`` of a chunk of ``L`` ops becomes op ``L - 1 - step`` of the same chunk.
    """
    if schedule.collective not in MIRRORED:
        raise ValueError(
            f"only ReduceScatter and AllGather schedules mirror, not {schedule.collective.value}"
        )
    mirror = [op.index - op.step + schedule.chain_length(op.chunk) - 1 - op.step for op in schedule.ops]
    return tuple(tuple(mirror[index] for index in reversed(sequence)) for sequence in schedule.sequences)


def mirrored(schedule: Schedule) -> Schedule:
    """``schedule`` read backwards in time: the same chunks as the other collective,
    re-timed by the simulator (``fixed`` policy) under the schedule's topology."""
    return simulate_chunks(
        schedule.topology,
        schedule.message_bytes,
        schedule.chunks,
        policy=Policy.FIXED,
        sequences=mirrored_sequences(schedule),
        planner=schedule.planner,
        collective=MIRRORED[schedule.collective],
    )
