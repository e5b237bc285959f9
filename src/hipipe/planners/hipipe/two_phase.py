"""An AllReduce built as a ReduceScatter plan followed by its mirror.

An AllReduce chunk is a ReduceScatter chain followed by an AllGather chain of the same
order, so any ReduceScatter schedule followed by the same schedule read backwards in
time (its AllGather mirror, :mod:`.mirror`) is an AllReduce schedule: each dim runs its
ReduceScatter sequence, then that sequence reversed as AllGathers. With the sizing LP
on those sequences the halves may overlap where one dim finishes its ReduceScatters
before another, so the AllReduce takes at most twice the ReduceScatter's makespan.

Why the planner needs it: the AllReduce search lets each chunk turn back up as soon as
it has gone down, and its list schedules interleave the two halves on every dim. Where
many chunks pipeline (bandwidth-bound messages) that spreads each dim's idle time over
both halves, and the plain two-phase schedule is faster: on rfs-3d at 256 MiB the
search's 17-chunk AllReduce took 1.914 ms, its 13-chunk ReduceScatter (0.9368 ms) followed
by the mirror 1.874 ms.
"""

from collections.abc import Callable
from dataclasses import replace

from hipipe.bounds import OrderMix
from hipipe.planners.hipipe.candidates import (
    Candidate,
    SearchLog,
    SearchOptions,
    Trial,
    optimize_structure,
)
from hipipe.planners.hipipe.structure import Structure
from hipipe.schedule import Collective
from hipipe.topology import Topology

SearchFunction = Callable[..., tuple[Candidate, dict[str, float]]]
""":func:`.search.search`'s signature (passed in: that module imports this one)."""

MIN_CHUNKS = 6
"""Built only when the AllReduce search's plan has at least this many chunks, where the
pipeline is long and its halves are where the search leaves time. At 5 chunks the
ReduceScatter search runs the 5-chunk MIPs (6-15 s) and on the reference grid gained 0.13%
once (rfs-3d at 64 MiB); below, the search's own MIPs reach the proven optima."""


def two_phase_sequences(structure: Structure) -> tuple[tuple[int, ...], ...]:
    """Each dim's AllReduce sequence: ``structure``'s ReduceScatter sequence, then the
    same ops as AllGathers in reverse.

    A ReduceScatter chunk ``j`` owns ops ``j D .. j D + D - 1`` (step = level); as an
    AllReduce chunk it owns ``2 j D .. 2 j D + 2 D - 1``, with the ReduceScatter at
    ``step`` and the AllGather of the same level at ``2 D - 1 - step``.
    """
    if structure.collective is not Collective.REDUCE_SCATTER:
        raise ValueError(
            f"two-phase sequences start from a ReduceScatter plan, not {structure.collective.value}"
        )
    num_dims = len(structure.sequences)

    def scattered(op: int) -> int:
        chunk, step = divmod(op, num_dims)
        return 2 * num_dims * chunk + step

    def gathered(op: int) -> int:
        chunk, step = divmod(op, num_dims)
        return 2 * num_dims * chunk + 2 * num_dims - 1 - step

    return tuple(
        tuple(scattered(op) for op in sequence) + tuple(gathered(op) for op in reversed(sequence))
        for sequence in structure.sequences
    )


def two_phase_candidate(
    topology: Topology,
    message_bytes: int,
    mix: OrderMix,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    search: SearchFunction,
) -> Candidate:
    """The ReduceScatter search's plan (same options but the collective, its own log),
    followed by its mirror, re-sized by the LP and re-sequenced as any AllReduce candidate
    (``options`` plan the AllReduce). Its trial and LP work are added to ``log``."""
    scatter_log = SearchLog(budget=options.lp_work_budget, solved_mips=log.solved_mips)
    scatter, _ = search(
        topology,
        message_bytes,
        mix,
        options=replace(options, collective=Collective.REDUCE_SCATTER, baseline_seeds=False),
        log=scatter_log,
    )
    log.add_work(scatter_log)
    candidate = optimize_structure(
        topology,
        message_bytes,
        scatter.structure.orders,
        [two_phase_sequences(scatter.structure)],
        source="two-phase",
        options=options,
        unit_s=unit_s,
        log=log,
        resequence=True,
    )
    log.tried.append(
        Trial(
            num_chunks=scatter.structure.num_chunks,
            kept_chunks=candidate.structure.num_chunks,
            source="two-phase",
            makespan_s=candidate.makespan_s,
        )
    )
    return candidate
