"""The ``hipipe`` planner and its ablations, with the registry signature.

Each one runs the search (:mod:`.search`), then hands the winning chunks and sequences
to the simulator with the ``fixed`` policy: the simulator, not the LP, is the source of
the reported makespan, and the two must agree (else the LP was wrong: we raise).
"""

import math
from collections import defaultdict
from dataclasses import replace
from typing import Any

from hipipe.bounds import OrderMix, half_chain_scale, order_mix
from hipipe.cost import lower_bound_s
from hipipe.errors import SolverError
from hipipe.planners.hipipe.candidates import (
    CHUNK_LADDER,
    Candidate,
    SearchLog,
    SearchOptions,
    SolvedMip,
    drop_empty_chunks,
    time_unit_s,
)
from hipipe.planners.hipipe.mirror import MIRRORED, mirrored
from hipipe.planners.hipipe.search import search
from hipipe.planners.hipipe.structure import to_chunks
from hipipe.predict import predicted_s
from hipipe.schedule import Collective, Schedule
from hipipe.simulator import Policy, simulate_chunks
from hipipe.topology import Topology

AGREEMENT_RELATIVE = 1e-6
"""LP makespan and simulated makespan must agree to this (HiGHS' tolerances are far tighter)."""

ABLATION_NUM_CHUNKS = 64
"""``hipipe-k64`` fixes K to the baselines' usual split count."""


RETIMED_CHUNK_COUNTS = 4
"""With non-linear overheads: how many of the search's best chunk counts are planned and
re-timed under the full cost model (:mod:`hipipe.predict`)."""


def _plan(
    topology: Topology,
    message_bytes: int,
    *,
    planner: str,
    options: SearchOptions,
    num_chunks: int | None,
    collective: Collective,
    mirror: bool = False,
    solved_mips: dict[tuple[object, ...], SolvedMip] | None = None,
) -> Schedule:
    """:func:`_plan_linear`, then, on a topology with non-linear overheads (concurrency,
    jitter), the choice of K by the full cost model. ``mirror``: see :func:`_plan_linear`.
    ``solved_mips``: the sequence MIPs other plans of the same request solved (filled in
    by this one; :class:`HipipePlans`), or None for a plan of its own.

    The LP charges the linear terms exactly but cannot see what grows with the number of
    ops in flight, and K is the decision that trades latency against exactly that. So
    the best few chunk counts of the search are each planned and replayed
    (:func:`hipipe.predict.predict`), and the one predicted fastest is kept.
    """
    if solved_mips is None:
        solved_mips = {}
    best = _plan_linear(
        topology,
        message_bytes,
        planner=planner,
        options=options,
        num_chunks=num_chunks,
        collective=collective,
        mirror=mirror,
        solved_mips=solved_mips,
    )
    if topology.overheads.is_linear or num_chunks is not None or not options.lp_sizes:
        return best
    by_k: dict[int, float] = {}
    for trial in best.info.get("candidates", []):
        k, makespan = trial.get("kept_chunks") or trial.get("num_chunks"), trial.get("makespan_s")
        if k and makespan is not None:
            by_k[k] = min(makespan, by_k.get(k, math.inf))
    others = [k for k in sorted(by_k, key=by_k.__getitem__) if k != best.num_chunks][
        : RETIMED_CHUNK_COUNTS - 1
    ]
    candidates = [best] + [
        _plan_linear(
            topology,
            message_bytes,
            planner=planner,
            options=options,
            num_chunks=k,
            collective=collective,
            mirror=mirror,
            solved_mips=solved_mips,
        )
        for k in others
    ]
    predicted = [predicted_s(schedule) for schedule in candidates]
    chosen = min(range(len(candidates)), key=lambda i: (predicted[i], candidates[i].makespan_s))
    retimed = [
        {"num_chunks": c.num_chunks, "lp_makespan_s": c.makespan_s, "predicted_s": p}
        for c, p in zip(candidates, predicted, strict=True)
    ]
    return replace(candidates[chosen], info={**candidates[chosen].info, "retimed": retimed})


def _plan_linear(
    topology: Topology,
    message_bytes: int,
    *,
    planner: str,
    options: SearchOptions,
    num_chunks: int | None,
    collective: Collective,
    mirror: bool,
    solved_mips: dict[tuple[object, ...], SolvedMip],
) -> Schedule:
    """:func:`_searched`; with ``mirror``, for ReduceScatter or AllGather, also the other
    collective's plan read backwards in time (:mod:`.mirror`), and the faster of the two.
    Both searches share ``solved_mips`` (:attr:`.candidates.SearchLog.solved_mips`).

    The best schedule of either collective is the mirror of the other's, but the search
    does not find both equally well (its plans differed by up to 1.0% on the reference
    grid): searching both directions costs twice the plan time and makes the two agree.
    ``info["mirror"]`` records the other direction's makespan and which one was kept.
    """
    direct = _searched(
        topology,
        message_bytes,
        planner=planner,
        options=options,
        num_chunks=num_chunks,
        collective=collective,
        solved_mips=solved_mips,
    )
    if not mirror or collective not in MIRRORED:
        return direct
    other = _searched(
        topology,
        message_bytes,
        planner=planner,
        options=options,
        num_chunks=num_chunks,
        collective=MIRRORED[collective],
        solved_mips=solved_mips,
    )
    reflected = mirrored(other)
    used = reflected.makespan_s < direct.makespan_s * (1 - MIRROR_GAIN_RELATIVE)
    record = {
        "searched_as": MIRRORED[collective].value,
        "mirrored_makespan_s": reflected.makespan_s,
        "direct_makespan_s": direct.makespan_s,
        "kept": "mirrored" if used else "direct",
    }
    if not used:
        return replace(direct, info={**direct.info, "mirror": record})
    makespan = reflected.makespan_s
    info = dict(other.info)
    lp_s = info.get("lp_makespan_s")
    info.update(
        simulated_makespan_s=makespan,
        lp_vs_simulated_relative=None if lp_s is None else abs(makespan - lp_s) / makespan,
        utilization=info["lower_bound_s"] / makespan,
        utilization_of_mix_bound=info["order_mix_bound_s"] / makespan,
        baselines_makespan_s=direct.info["baselines_makespan_s"],
        mirror=record,
    )
    return replace(reflected, info=info)


MIRROR_GAIN_RELATIVE = 1e-9
"""A mirrored plan is kept only when faster by more than this (float noise keeps the direct one)."""


def _searched(
    topology: Topology,
    message_bytes: int,
    *,
    planner: str,
    options: SearchOptions,
    num_chunks: int | None,
    collective: Collective,
    solved_mips: dict[tuple[object, ...], SolvedMip],
) -> Schedule:
    """The search, then the simulator's timing of its winner. The request (message size,
    K, collective) was validated once by :func:`hipipe.planners.plan`; ``solved_mips``
    holds the sequence MIPs the plan has solved so far (shared by its searches)."""
    options = replace(options, collective=collective)
    if num_chunks is not None:
        options = replace(options, forced_chunks=num_chunks)
    mix = order_mix(topology)
    log = SearchLog(budget=options.lp_work_budget, solved_mips=solved_mips)
    best, baselines = search(topology, message_bytes, mix, options=options, log=log)
    if options.lp_sizes:
        unit_s = time_unit_s(topology, message_bytes, mix, collective)
        best = drop_empty_chunks(topology, message_bytes, best, unit_s=unit_s, log=log)
    schedule = simulate_chunks(
        topology,
        message_bytes,
        to_chunks(best.structure.orders, best.sizes_bytes),
        policy=Policy.FIXED,
        sequences=best.structure.sequences,
        planner=planner,
        collective=collective,
    )
    lp_s = best.lp_makespan_s
    if lp_s is not None and abs(schedule.makespan_s - lp_s) > AGREEMENT_RELATIVE * schedule.makespan_s:
        raise SolverError(
            f"the chunk-size LP predicted {lp_s:.9g} s but the simulator times its plan at "
            f"{schedule.makespan_s:.9g} s: the LP solution is not trustworthy"
        )
    info = _info(topology, message_bytes, schedule, best, mix_orders=mix, baselines=baselines, log=log)
    return replace(schedule, info=info)


def _info(
    topology: Topology,
    message_bytes: int,
    schedule: Schedule,
    best: Candidate,
    *,
    mix_orders: OrderMix,
    baselines: dict[str, float],
    log: SearchLog,
) -> dict[str, Any]:
    """Why the schedule looks the way it does; plain JSON types only."""
    t_star = lower_bound_s(topology, message_bytes, schedule.collective)
    t_mix = mix_orders.time_per_byte_s * half_chain_scale(schedule.collective) * message_bytes
    used: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [0, 0.0])
    for chunk in schedule.chunks:
        entry = used[chunk.dims_order()]
        entry[0] += 1
        entry[1] += chunk.size_bytes / message_bytes
    makespan = schedule.makespan_s
    lp_s = best.lp_makespan_s
    return {
        "num_chunks": schedule.num_chunks,
        "structure_source": best.structure.source,
        "candidates": [trial.to_info() for trial in log.tried],
        "order_mix": [
            {"order": list(order), "weight": weight}
            for order, weight in zip(mix_orders.orders, mix_orders.weights, strict=True)
        ],
        "orders_used": [
            {"order": list(order), "chunks": int(count), "fraction_of_bytes": fraction}
            for order, (count, fraction) in sorted(used.items(), key=lambda item: -item[1][1])
        ],
        "lp_makespan_s": lp_s,
        "simulated_makespan_s": makespan,
        "lp_vs_simulated_relative": None if lp_s is None else abs(makespan - lp_s) / makespan,
        "lower_bound_s": t_star,
        "order_mix_bound_s": t_mix,
        "utilization": t_star / makespan,
        "utilization_of_mix_bound": t_mix / makespan,
        "baselines_makespan_s": baselines,
        "lp_solves": log.lp_solves,
        "simplex_iterations": log.simplex_iterations,
        "lp_work_op_solves": log.lp_work,
    }


def plan_hipipe(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """HiPIPE: fluid order mix, list-scheduled sequences, LP chunk sizes, searched K, baseline
    seeds; a ReduceScatter or AllGather is also searched as its mirror (:mod:`.mirror`)."""
    return HipipePlans(topology, message_bytes, collective=collective).plan(num_chunks)


class HipipePlans:
    """``hipipe`` plans of one request at several chunk counts, sharing their sequence MIPs.

    ``hipipe tune`` plans the searched K and then the search's next-best Ks forced; a
    forced search meets most of the MIPs the first one solved (on a calibrated 2x2x2
    testbed at 4 MiB, three forced plans took 20.8 s alone and 1.2 s after the searched
    one). Each plan is the one :func:`plan_hipipe` returns for the same request. Mutable
    (the solved MIPs); the request is not validated here (:func:`hipipe.planners.plan` is
    the place for that).
    """

    def __init__(self, topology: Topology, message_bytes: int, *, collective: Collective) -> None:
        self.topology = topology
        self.message_bytes = message_bytes
        self.collective = collective
        self._solved_mips: dict[tuple[object, ...], SolvedMip] = {}

    def plan(self, num_chunks: int | None = None) -> Schedule:
        """:func:`plan_hipipe` of the request, at ``num_chunks`` (None: searched)."""
        return _plan(
            self.topology,
            self.message_bytes,
            planner="hipipe",
            options=SearchOptions(),
            num_chunks=num_chunks,
            collective=self.collective,
            mirror=True,
            solved_mips=self._solved_mips,
        )


def plan_hipipe_uniform(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """Ablation: as ``hipipe`` but every chunk the same size (no sizing LP, no seeds)."""
    options = SearchOptions(lp_sizes=False, baseline_seeds=False, climb=False)
    return _plan(
        topology,
        message_bytes,
        planner="hipipe-uniform",
        options=options,
        num_chunks=num_chunks,
        collective=collective,
    )


def plan_hipipe_k64(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """Ablation: as ``hipipe`` but K fixed to 64 (no chunk-number search, no seeds)."""
    options = SearchOptions(
        forced_chunks=num_chunks or ABLATION_NUM_CHUNKS, baseline_seeds=False, climb=False
    )
    return _plan(
        topology, message_bytes, planner="hipipe-k64", options=options, num_chunks=None, collective=collective
    )


def plan_hipipe_fixed_order(
    topology: Topology,
    message_bytes: int,
    *,
    num_chunks: int | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> Schedule:
    """Ablation: as ``hipipe`` but every chunk in ascending order (no order mix, no seeds)."""
    options = SearchOptions(ascending_only=True, baseline_seeds=False, climb=False)
    return _plan(
        topology,
        message_bytes,
        planner="hipipe-fixed-order",
        options=options,
        num_chunks=num_chunks,
        collective=collective,
    )


__all__ = [
    "CHUNK_LADDER",
    "plan_hipipe",
    "plan_hipipe_fixed_order",
    "plan_hipipe_k64",
    "plan_hipipe_uniform",
]
