"""Refining the best plan by splitting its chunks: a larger K seeded from a smaller one.

The K ladder builds every K from scratch: orders from the families, sequences from the
list scheduler on *uniform* sizes. On those sequences the sizing LP cannot build the
small-first, small-last ramp that shrinks fill and drain: past some K it empties chunks
instead, and the ladder gets worse, not better (a 4-dim network at 64 GiB, where latency
is negligible: 0.965 of T_mix at K = 16, 0.913 at K = 24; the chunked floor allows 0.999).

Splitting chunks of the best plan keeps what it got right: each half keeps its chunk's
order and, on every dim, the two halves run back to back where the chunk ran. Giving one
half the whole chunk is the old schedule with each split op's latency paid twice (at zero
latency the split can never lose), and the LP can now shrink a first half (the ramp)
and grow the second; halves it empties are dropped. One re-sequencing round on the LP's sizes then lets the
list scheduler interleave the halves. Two splits are tried per step: the chunks at the
ends of some dim's sequence (they fill and drain the pipeline: a geometric ramp for the
price of a few latencies) and every chunk (more overlap everywhere, when latency is cheap).
"""

from dataclasses import replace

from hipipe.planners.hipipe.candidates import (
    SPLIT_SHARE,
    Candidate,
    SearchLog,
    SearchOptions,
    better,
    optimize_structure,
)
from hipipe.planners.hipipe.structure import Structure
from hipipe.topology import Topology


def split_structure(structure: Structure, split: set[int]) -> Structure:
    """Chunks in ``split`` become two adjacent chunks (same order), back to back on every dim."""
    chain_length = structure.chain_length
    pieces: list[tuple[int, ...]] = []
    count = 0
    for j in range(structure.num_chunks):
        width = 2 if j in split else 1
        pieces.append(tuple(range(count, count + width)))
        count += width
    sequences = tuple(
        tuple(
            piece * chain_length + op % chain_length
            for op in sequence
            for piece in pieces[op // chain_length]
        )
        for sequence in structure.sequences
    )
    orders = tuple(structure.orders[j] for j, group in enumerate(pieces) for _ in group)
    return Structure(
        orders=orders, sequences=sequences, source=structure.source, collective=structure.collective
    )


def end_chunks(structure: Structure) -> set[int]:
    """Chunks whose op is first or last on some dim: the ones that fill and drain the pipeline."""
    chain_length = structure.chain_length
    return {sequence[i] // chain_length for sequence in structure.sequences if sequence for i in (0, -1)}


def refine_by_splitting(
    topology: Topology,
    message_bytes: int,
    start: Candidate,
    *,
    options: SearchOptions,
    unit_s: float,
    log: SearchLog,
    max_ops: int,
    floor_slack: float,
) -> Candidate:
    """Split the best plan's end chunks or all its chunks, step by step, while that helps.

    A split is tried only when its K has at most ``max_ops`` ops and the chunked latency
    floor at its K (:func:`hipipe.bounds.chunked_bound_s`) is more than ``floor_slack``
    below the best: otherwise no schedule with that many chunks can gain enough.
    """
    if start.lp_makespan_s is None:
        return start  # no sizing LP (the uniform ablation): nothing to re-size
    one_round = replace(options, max_rounds=1)
    log.allow(SPLIT_SHARE)  # the rest of the plan's budget; a step in progress is finished
    best = start
    while not log.over_budget:
        current = best
        selections = [end_chunks(current.structure), set(range(current.structure.num_chunks))]
        for split in selections[: 1 if selections[0] == selections[1] else 2]:
            structure = split_structure(current.structure, split)
            if structure.num_chunks * structure.chain_length > max_ops:
                continue
            floor_s = log.floor_s(topology, message_bytes, structure.num_chunks, options.collective)
            if floor_s >= best.makespan_s * (1 - floor_slack):
                continue
            candidate = optimize_structure(
                topology,
                message_bytes,
                structure.orders,
                [structure.sequences],
                source=f"{start.structure.source}-split",
                options=one_round,
                unit_s=unit_s,
                log=log,
                resequence=True,
            )
            if better(best, candidate):
                best = candidate
        if best is current:
            break
        log.improved(current, best, "split")
    return best
