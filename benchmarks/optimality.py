"""How far from optimal: hipipe at K against the exact planner's proven optimum at K,
and hipipe against the best lower bound ``max(T_mix, T_pipe)``.

    python benchmarks/optimality.py [--quick | --preset NAME ... --size SIZE ...] [--time-limit 60]
        [--hard-time-limit 15] [--deeper-time-limit 300] [--floor-time-limit 600] [--floor-jobs 1]
        [--floor-leaf-time-limit S] [--optimum-time-limit 1200] [--proof-journals DIR]
        [--generated 40] [--seed 7] [--collective all_reduce] [--out DIR]

For every reference network and message (16 MiB .. 1 GiB): hipipe with its own K against
the best bound; then for K = 2..4, hipipe forced to K against ``exact`` at K (a MIP with a
per-solve time limit: ``--time-limit`` where the goal asks for a proof, K <= 3 on 2 or 3
dims, ``--hard-time-limit`` elsewhere; unproven solves report their gap). Where a cell misses the
bound goal, the exact MIPs are first asked whether any schedule with at most k chunks beats
T_pipe counting k + 1 (:data:`FLOOR_TIME_LIMIT_S`, ``--floor-time-limit``); if the goal is
still missed, exact runs at K = 5 and 6 for a tighter floor or a proof of hipipe's own K
(:data:`DEEPER_BOUND_CHUNKS`, ``--deeper-time-limit`` each); if it is missed still, the MIPs
are asked whether any schedule with at most hipipe's own K chunks beats hipipe's plan
(:data:`OPTIMUM_TIME_LIMIT_S`, ``--optimum-time-limit``). With ``--proof-journals DIR``
those proofs keep every region they answer in DIR and a later run resumes them from there
(:mod:`hipipe.planners.exact.journal`). Prints a card per network, the
goals, the cells where the exact planner found a better structure (orders and sizes side
by side), and ends with one JSON line. Then the same comparison on ``--generated`` random
networks (held out: 2-4 dims, one K in 2..4 each), where the goal is checked as users will.
``--collective`` plans ReduceScatter or AllGather instead of AllReduce (every planner, bound
and message of the run). With ``--out DIR`` it also writes
``optimality-<machine>-<date>.md`` (``optimality-<collective>-<machine>-<date>.md`` for the
other collectives).
"""

import argparse
import datetime
import functools
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hipipe import Dimension, Topology, plan
from hipipe.bounds import best_bound_s, order_mix_bound_s, pipeline_bound_s
from hipipe.planners.exact import MAX_CHUNKS, MAX_FLOOR_CHUNKS, floor_instance, plan_exact, prove_floor
from hipipe.planners.exact.first_dims import SplitProgress
from hipipe.presets import PRESETS
from hipipe.schedule import Collective, Schedule
from hipipe.units import parse_size_bytes

MIB = 1024**2
MESSAGES = (16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB)
QUICK_MESSAGES = (256 * MIB,)
QUICK_PRESETS = ("tpu-2d", "rfs-3d")
CHUNK_COUNTS = (2, 3, 4)
OPTIMUM_GOAL = 0.01
"""hipipe within 1% of the proven optimum at the same K."""
BOUND_GOAL = 0.05
"""hipipe within 5% of the best lower bound (or proven optimal at its K)."""
FLOOR_MARGIN = 1e-5
"""A floor proof asks a hair above what the goal needs: its proven floor is the floor less
the MIP's relative gap (1e-6)."""
DEEPER_BOUND_CHUNKS = tuple(range(max(CHUNK_COUNTS) + 1, MAX_CHUNKS + 1))
"""Where a cell misses the bound goal, the exact planner also runs at these K (up to its
``MAX_CHUNKS``) for its dual bound, with ``--deeper-time-limit``: a floor for every K as at K = 4
(:func:`_floor_s`), tighter where it proves a larger K. Skipped where T_pipe counting K + 1
chunks is already too low for that floor to meet the goal, and stopped once the goal is met.
On hgx-h100-32 at 256 MiB (ReduceScatter) it proves K = 5 in 1 s, and the floor rises from
0.6378 ms (K <= 4) to 0.6498 ms (K <= 5), with hipipe's 0.6746 ms 3.8% above it. From K = 5 on
3-4 dims the exact planner solves one MIP per multiset of first dims, which takes a minute or
two where the whole MIP would stall at a 20-25% gap (libra-4d at 256 MiB, ReduceScatter and
AllGather, K = 5: proven in 95 and 67 s): hence a limit of its own."""
DEEPER_TIME_LIMIT_S = 300.0
FLOOR_TIME_LIMIT_S = 600.0
"""Where a cell misses the bound goal with K <= 4, the exact MIPs are first asked a smaller
question (:func:`~hipipe.planners.exact.prove_floor`): is any schedule with at most k chunks
faster than T_pipe counting k + 1 chunks, for the smallest k whose T_pipe would meet the
goal? "No" makes that T_pipe a floor for every K. On rfs-3d at 256 MiB (AllReduce, k = 5)
the 21 first-dim MIPs answer in 7 s, where the K = 5 optimum stays at a 13% gap after 318 s."""
OPTIMUM_TIME_LIMIT_S = 1200.0
"""Where a cell still misses the bound goal after the floor proof and the deeper runs, the
goal's last clause is tried: is any schedule with at most hipipe's own K chunks faster than
hipipe's plan (less :data:`OPTIMUM_MARGIN`)? Asked as a floor
(:func:`~hipipe.planners.exact.prove_floor`, hipipe's makespan as every MIP's cutoff), not
as an optimum: the MIPs need not find a schedule nor close a gap from below, only prune
everything under the cutoff. On rfs-3d at 64 MiB (AllReduce, hipipe's K = 5, 0.5328 ms),
where the exact planner's K = 5 run stays at a 15% gap after 300 s, it is proven in 441 s with
two worker processes (457 s by a direct call; 27 regions, one split; 2-core host): hipipe is
optimal at its K there.
"Yes" names a faster schedule, which is a structure hipipe misses at its own K."""
OPTIMUM_MARGIN = 1e-6
"""The optimum proof asks about hipipe's makespan less this, so hipipe's own schedule (at the
cutoff, up to the MIP's feasibility tolerance) never counts as faster than itself; with
the MIP's relative gap, a proof puts hipipe within 2e-6 of the optimum at its K."""
MISSED_STRUCTURE = 1e-3
"""Cells where exact beats hipipe by more than this get their structures printed."""
GENERATED = 40
"""Generated networks (held out: the planner was never tuned on them), one K each."""
GENERATED_SEED = 7
COLLECTIVE_NAMES = {
    Collective.ALL_REDUCE: "AllReduce",
    Collective.REDUCE_SCATTER: "ReduceScatter",
    Collective.ALL_GATHER: "AllGather",
}


def _size(message_bytes: int) -> str:
    return f"{message_bytes // 1024**3} GiB" if message_bytes >= 1024**3 else f"{message_bytes // MIB} MiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def structure(schedule: Schedule) -> list[dict[str, Any]]:
    """Chunks as (order, fraction of the message), in index order; plus each dim's op sequence."""
    return [
        {"order": list(c.dims_order()), "fraction": round(c.size_bytes / schedule.message_bytes, 4)}
        for c in schedule.chunks
    ]


def sequences_text(schedule: Schedule) -> str:
    """Each dim's sequence as chunk/phase labels, e.g. ``d0: 0R 1R 0A 1A``."""
    return "; ".join(
        f"d{k}: " + " ".join(f"{schedule.ops[i].chunk}{schedule.ops[i].phase.value[0]}" for i in seq)
        for k, seq in enumerate(schedule.sequences)
    )


def run_cell(
    preset: str,
    message_bytes: int,
    time_limit_s: float,
    hard_time_limit_s: float,
    collective: Collective = Collective.ALL_REDUCE,
    deeper_time_limit_s: float = DEEPER_TIME_LIMIT_S,
    floor_time_limit_s: float = FLOOR_TIME_LIMIT_S,
    floor_jobs: int = 1,
    floor_leaf_time_limit_s: float | None = None,
    optimum_time_limit_s: float = OPTIMUM_TIME_LIMIT_S,
    proof_journals: Path | None = None,
) -> dict[str, Any]:
    topology = PRESETS[preset]()
    free = plan(topology, message_bytes, "hipipe", collective=collective)
    bound_s = best_bound_s(topology, message_bytes, collective)
    cell: dict[str, Any] = {
        "preset": preset,
        "message_bytes": message_bytes,
        "num_dims": topology.num_dims,
        "order_mix_bound_s": order_mix_bound_s(topology, message_bytes, collective),
        "pipeline_bound_s": pipeline_bound_s(topology, message_bytes, collective),
        "best_bound_s": bound_s,
        "hipipe_s": free.makespan_s,
        "hipipe_num_chunks": free.num_chunks,
        "hipipe_vs_bound": free.makespan_s / bound_s - 1,
        "per_k": {},
    }
    for k in CHUNK_COUNTS:
        hipipe_k = plan(topology, message_bytes, "hipipe", num_chunks=k, collective=collective)
        started = time.perf_counter()
        limit_s = time_limit_s if topology.num_dims <= 3 and k <= 3 else hard_time_limit_s
        exact = plan_exact(topology, message_bytes, num_chunks=k, time_limit_s=limit_s, collective=collective)
        solve_s = time.perf_counter() - started
        entry = {
            "hipipe_s": hipipe_k.makespan_s,
            "hipipe_num_chunks": hipipe_k.num_chunks,
            "exact_s": exact.makespan_s,
            "exact_num_chunks": exact.num_chunks,
            "proven": exact.info["proven_optimal"],
            "gap": exact.info["mip_gap"],
            "dual_bound_s": exact.info["mip_dual_bound_s"],
            "solve_s": solve_s,
            "time_limit_s": limit_s,
            "hipipe_vs_exact": hipipe_k.makespan_s / exact.makespan_s - 1,
            "exact_vs_bound": exact.makespan_s / bound_s - 1,
        }
        if entry["hipipe_vs_exact"] > MISSED_STRUCTURE:
            entry["hipipe_structure"] = structure(hipipe_k)
            entry["exact_structure"] = structure(exact)
            entry["hipipe_sequences"] = sequences_text(hipipe_k)
            entry["exact_sequences"] = sequences_text(exact)
        cell["per_k"][k] = entry
    cell["deeper"] = {}
    last = max(CHUNK_COUNTS)
    many_s = pipeline_bound_s(topology, message_bytes, collective, min_chunks=last + 1)
    floors = {last: _floor_s(cell["per_k"][last]["dual_bound_s"], many_s)}
    _judge(cell, bound_s, floors)
    prove = functools.partial(
        _prove,
        topology,
        message_bytes,
        collective,
        free,
        jobs=floor_jobs,
        leaf_time_limit_s=floor_leaf_time_limit_s,
        journal_dir=proof_journals,
    )
    cell["floor_proof"] = None
    if cell["bound_goal"] == "missed" and floor_time_limit_s > 0:
        cell["floor_proof"] = prove(floor_time_limit_s, question="floor")
        proof = cell["floor_proof"]
        if proof is not None and proof["proven"]:
            proven_s = _floor_s(proof["proven_floor_s"], proof["many_s"])
            floors[proof["max_chunks"]] = max(floors.get(proof["max_chunks"]) or 0.0, proven_s or 0.0)
            _judge(cell, bound_s, floors)
    for k in DEEPER_BOUND_CHUNKS:
        if cell["bound_goal"] != "missed":
            break
        many_s = pipeline_bound_s(topology, message_bytes, collective, min_chunks=k + 1)
        if many_s * (1 + BOUND_GOAL) < free.makespan_s and free.num_chunks != k:
            continue  # this K's floor cannot reach the goal, nor its proof be of hipipe's K
        started = time.perf_counter()
        exact = plan_exact(
            topology, message_bytes, num_chunks=k, time_limit_s=deeper_time_limit_s, collective=collective
        )
        cell["deeper"][k] = {
            "exact_s": exact.makespan_s,
            "exact_num_chunks": exact.num_chunks,
            "proven": exact.info["proven_optimal"],
            "gap": exact.info["mip_gap"],
            "dual_bound_s": exact.info["mip_dual_bound_s"],
            "solve_s": time.perf_counter() - started,
            "time_limit_s": deeper_time_limit_s,
            "method": exact.info["method"],
        }
        deeper_s = _floor_s(cell["deeper"][k]["dual_bound_s"], many_s)
        floors[k] = max((f for f in (floors.get(k), deeper_s) if f is not None), default=None)
        _judge(cell, bound_s, floors)
    cell["optimum_proof"] = None
    if cell["bound_goal"] == "missed" and optimum_time_limit_s > 0:
        cell["optimum_proof"] = prove(optimum_time_limit_s, question="optimum")
        _judge(cell, bound_s, floors)
    return cell


def _question(
    topology: Topology, message_bytes: int, collective: Collective, hipipe: Schedule, question: str
) -> tuple[float, int, str, float] | None:
    """What a proof asks, as ``(floor_s, max_chunks, asked, many_s)``; None where it cannot help.

    ``question="floor"``: is any schedule with at most k chunks below the floor the goal
    needs, for the smallest k (past K = 4, up to ``MAX_FLOOR_CHUNKS``) whose ``T_pipe``
    counting k + 1 chunks is within the goal of hipipe? A proof makes that floor hold for
    every K. The floor asked is the lower of that ``T_pipe`` and hipipe's makespan less the
    goal (``asked`` ``goal``: "does any schedule beat hipipe by more than 5%?"; a lower
    floor leaves the MIPs more room to prune, and is never above hipipe's own plan), or
    ``T_pipe``. None where no k up to the limit has such a ``T_pipe``.

    ``question="optimum"``: is any schedule with at most hipipe's own K chunks faster than
    hipipe's plan less :data:`OPTIMUM_MARGIN` (``asked`` ``hipipe``)? "No" proves hipipe
    optimal at its K (:data:`OPTIMUM_TIME_LIMIT_S`). None where K is beyond
    ``MAX_FLOOR_CHUNKS``."""
    if question not in ("floor", "optimum"):
        raise ValueError(f"unknown question {question!r} (floor or optimum)")
    if question == "optimum":
        k = hipipe.num_chunks
        if k > MAX_FLOOR_CHUNKS:
            return None
        many_s = pipeline_bound_s(topology, message_bytes, collective, min_chunks=k + 1)
        return hipipe.makespan_s * (1 - OPTIMUM_MARGIN), k, "hipipe", many_s
    for k in range(max(CHUNK_COUNTS) + 1, MAX_FLOOR_CHUNKS + 1):
        many_s = pipeline_bound_s(topology, message_bytes, collective, min_chunks=k + 1)
        if many_s * (1 + BOUND_GOAL) < hipipe.makespan_s:
            continue
        # A hair above hipipe / 1.05, so the proven floor (less the MIP gap) still meets it.
        target_s = min(many_s, hipipe.makespan_s / (1 + BOUND_GOAL) * (1 + FLOOR_MARGIN))
        return target_s, k, "goal" if target_s < many_s else "T_pipe", many_s
    return None


def _prove(
    topology: Topology,
    message_bytes: int,
    collective: Collective,
    hipipe: Schedule,
    time_limit_s: float,
    *,
    question: str,
    jobs: int = 1,
    leaf_time_limit_s: float | None = None,
    journal_dir: Path | None = None,
) -> dict[str, Any] | None:
    """Ask the exact MIPs the floor or optimum ``question`` (:func:`_question`) with
    :func:`~hipipe.planners.exact.prove_floor`, and keep the answer as the report does;
    None where the question cannot help. With ``journal_dir`` the proof keeps its answered
    regions there and resumes from an earlier run's (:func:`journal_path`)."""
    asked_about = _question(topology, message_bytes, collective, hipipe, question)
    if asked_about is None:
        return None
    floor_s, k, asked, many_s = asked_about
    journal = None
    if journal_dir is not None:
        journal = journal_path(journal_dir, topology, message_bytes, k, collective)
    what = f"{topology.name} {_size(message_bytes)} {question} proof (k = {k})"
    proof = prove_floor(
        topology,
        message_bytes,
        floor_s,
        max_chunks=k,
        collective=collective,
        time_limit_s=time_limit_s,
        leaf_time_limit_s=leaf_time_limit_s,
        jobs=jobs,
        journal_path=journal,
        progress=ProgressLine(what),
    )
    return {
        "max_chunks": k,
        "floor_s": floor_s,
        "asked": asked,
        "many_s": many_s,
        "proven": proof.proven,
        "proven_floor_s": proof.proven_floor_s,
        "faster_s": proof.faster_s,
        "method": proof.method,
        "subproblems": proof.subproblems,
        "settled": proof.settled,
        "refined": proof.refined,
        "timed_out": proof.timed_out,
        "nodes": proof.nodes,
        "solve_s": proof.solve_s,
        "time_limit_s": time_limit_s,
        "leaf_time_limit_s": leaf_time_limit_s,
        "jobs": jobs,
        "resumed": proof.resumed,
        "journal": None if journal is None else str(journal),
    }


PROGRESS_EVERY_S = 60.0
"""A long proof prints where it stands on stderr at most this often."""


class ProgressLine:
    """Prints a proof's :class:`~hipipe.planners.exact.first_dims.SplitProgress` on stderr,
    at most every :data:`PROGRESS_EVERY_S` (a proof can answer thousands of regions)."""

    def __init__(self, what: str, every_s: float = PROGRESS_EVERY_S) -> None:
        self.what = what
        self.every_s = every_s
        self.last_s = 0.0

    def __call__(self, progress: SplitProgress) -> None:
        if progress.elapsed_s - self.last_s < self.every_s:
            return
        self.last_s = progress.elapsed_s
        print(
            f"  {self.what}: {progress.multisets_searched} of {progress.multisets} first-dim"
            f" multisets searched, {progress.answered} regions answered ({progress.settled} settled,"
            f" {progress.refined} split, {progress.timed_out} at their limit, {progress.resumed} from"
            f" the journal) in {progress.elapsed_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def journal_path(
    directory: Path, topology: Topology, message_bytes: int, max_chunks: int, collective: Collective
) -> Path:
    """Where the proofs of one instance keep their journal: named by the cell and the most
    chunks, plus a digest of the whole instance (a changed topology starts a journal of its
    own instead of being refused by the old one). The floor and optimum questions of a cell
    with the same k share it: a region settled at hipipe's makespan is settled below it."""
    instance = floor_instance(topology, message_bytes, max_chunks, collective)
    digest = hashlib.sha256(json.dumps(instance, sort_keys=True).encode()).hexdigest()[:12]
    size = _size(message_bytes).replace(" ", "")
    return directory / f"{topology.name}-{collective.value}-{size}-k{max_chunks}-{digest}.jsonl"


def _floor_s(dual_s: float | None, many_s: float) -> float | None:
    """A floor for every K from the exact planner's dual bound ``dual_s`` at some K = k (its
    schedules have at most k chunks) and ``many_s``, T_pipe counting k + 1 chunks' latency:
    every schedule has at most k chunks (>= the dual bound) or at least k + 1 (>= ``many_s``),
    so the smaller of the two. None without a dual bound."""
    return None if dual_s is None else min(dual_s, many_s)


def _judge(cell: dict[str, Any], bound_s: float, floors: dict[int, float | None]) -> None:
    """The cell's exact-backed bound (the best of ``floors``, by the K of the exact run that
    gave each) and its bound goal: within 5% of the best bound or of the exact-backed one, or
    no schedule with at most hipipe's own K chunks faster (the exact planner proved it at
    that K, or the optimum proof, :func:`_prove`, did)."""
    known = {k: f for k, f in floors.items() if f is not None and f > bound_s}
    best_k = max(known, key=lambda k: known[k]) if known else None
    cell["exact_backed_bound_s"] = known[best_k] if best_k is not None else bound_s
    cell["exact_backed_k"] = best_k
    cell["hipipe_vs_exact_backed_bound"] = cell["hipipe_s"] / cell["exact_backed_bound_s"] - 1
    own_k = cell["hipipe_num_chunks"]
    own = cell["per_k"].get(own_k) or cell["deeper"].get(own_k)
    optimum = cell.get("optimum_proof")
    own_proven = (own is not None and own["proven"] and own["exact_s"] >= cell["hipipe_s"] * (1 - 1e-9)) or (
        optimum is not None and optimum["proven"] and optimum["max_chunks"] == own_k
    )
    cell["bound_goal"] = (
        "within 5%"
        if cell["hipipe_vs_bound"] <= BOUND_GOAL
        else f"within 5% of the exact-backed bound (K <= {best_k})"
        if cell["hipipe_vs_exact_backed_bound"] <= BOUND_GOAL
        else (f"proven optimal at K={own_k}" if own_proven else "missed")
    )


def generated_instances(count: int, seed: int) -> list[tuple[Topology, int, int, str]]:
    """``count`` random networks (2-4 dims of ring, switch or fully-connected links, 2-8
    ranks, 25-400 GB/s, 50 ns-5 us), each with a message of 16 MiB-1 GiB and a K in 2..4."""
    rng = random.Random(seed)
    kinds = ("ring", "switch", "fully_connected")
    instances = []
    for _ in range(count):
        num_dims = rng.choice([2, 3, 3, 4])
        specs = [
            (
                rng.choice(kinds),
                rng.choice([2, 4, 8]),
                rng.choice([25, 50, 100, 200, 400]),
                rng.choice([50, 500, 1000, 2000, 5000]),
            )
            for _ in range(num_dims)
        ]
        topology = Topology(dims=tuple(Dimension.make(kind, n, gbps, ns) for kind, n, gbps, ns in specs))
        message = rng.choice([16, 64, 256, 1024]) * MIB
        num_chunks = rng.choice([2, 3, 4])
        text = ", ".join(f"{kind} {n} @ {gbps} GB/s / {ns} ns" for kind, n, gbps, ns in specs)
        instances.append((topology, message, num_chunks, text))
    return instances


def run_generated(
    count: int,
    seed: int,
    time_limit_s: float,
    hard_time_limit_s: float,
    collective: Collective = Collective.ALL_REDUCE,
) -> list[dict[str, Any]]:
    """hipipe forced to K against exact at K on :func:`generated_instances`."""
    return run_instances(generated_instances(count, seed), time_limit_s, hard_time_limit_s, collective)


def run_instances(
    instances: list[tuple[Topology, int, int, str]],
    time_limit_s: float,
    hard_time_limit_s: float,
    collective: Collective,
) -> list[dict[str, Any]]:
    """hipipe forced to K against exact at K on each (network, message, K, description)."""
    entries = []
    count = len(instances)
    for index, (topology, message, k, text) in enumerate(instances):
        started = time.perf_counter()
        hipipe_k = plan(topology, message, "hipipe", num_chunks=k, collective=collective)
        plan_s = time.perf_counter() - started
        limit_s = time_limit_s if topology.num_dims <= 3 and k <= 3 else hard_time_limit_s
        exact = plan_exact(topology, message, num_chunks=k, time_limit_s=limit_s, collective=collective)
        entry = {
            "index": index,
            "network": text,
            "num_dims": topology.num_dims,
            "message_bytes": message,
            "k": k,
            "hipipe_s": hipipe_k.makespan_s,
            "hipipe_plan_s": plan_s,
            "exact_s": exact.makespan_s,
            "proven": exact.info["proven_optimal"],
            "gap": exact.info["mip_gap"],
            "hipipe_vs_exact": hipipe_k.makespan_s / exact.makespan_s - 1,
        }
        if entry["hipipe_vs_exact"] > MISSED_STRUCTURE:
            entry["hipipe_structure"] = structure(hipipe_k)
            entry["exact_structure"] = structure(exact)
        entries.append(entry)
        print(f"  generated {index + 1}/{count} done", file=sys.stderr)
    return entries


def summarize_generated(entries: list[dict[str, Any]]) -> dict[str, Any]:
    proven = [e for e in entries if e["proven"]]
    plan_times = [e["hipipe_plan_s"] for e in entries]
    return {
        "generated": len(entries),
        "generated_proven": len(proven),
        "generated_within_1pct_of_proven": sum(e["hipipe_vs_exact"] <= OPTIMUM_GOAL for e in proven),
        "generated_max_hipipe_vs_proven": max((e["hipipe_vs_exact"] for e in proven), default=0.0),
        "generated_exact_slower_than_hipipe": sum(e["exact_s"] > e["hipipe_s"] * (1 + 1e-9) for e in entries),
        "generated_plan_s_median": statistics.median(plan_times) if plan_times else 0.0,
        "generated_plan_s_max": max(plan_times, default=0.0),
    }


def generated_text(entries: list[dict[str, Any]], summary: dict[str, Any], seed: int) -> list[str]:
    """The goal line, then every instance hipipe misses by more than 1% (proven or not)."""
    met = summary["generated_within_1pct_of_proven"] == summary["generated_proven"]
    lines = [
        f"- generated networks (seed {seed}): hipipe within 1% of the proven optimum at the same K on"
        f" {summary['generated_within_1pct_of_proven']} of {summary['generated_proven']} proven"
        f" (of {summary['generated']}; worst {summary['generated_max_hipipe_vs_proven']:+.2%};"
        f" {'met' if met else 'MISSED'}); exact slower than hipipe on"
        f" {summary['generated_exact_slower_than_hipipe']}; hipipe plan time at K: median"
        f" {summary['generated_plan_s_median']:.2f} s, max {summary['generated_plan_s_max']:.2f} s",
    ]
    for e in entries:
        if e["hipipe_vs_exact"] <= OPTIMUM_GOAL:
            continue
        proof = "proven" if e["proven"] else f"gap {e['gap']:.1%}" if e["gap"] is not None else "gap ?"
        lines.append(
            f"  - #{e['index']} {e['network']}; {_size(e['message_bytes'])}, K={e['k']}: hipipe"
            f" {_ms(e['hipipe_s'])} ms, exact {_ms(e['exact_s'])} ms ({proof}, {e['hipipe_vs_exact']:+.2%})"
        )
        lines += structure_lines(e, "    ")
    return lines


def card(console: Console, preset: str, cells: list[dict[str, Any]]) -> None:
    table = Table(title=f"{preset}: hipipe at K vs exact at K (ms; * = proven optimal)", title_justify="left")
    for column in ("message", "best bound", "exact-backed", "hipipe (K)", "vs bounds"):
        table.add_column(column, justify="right")
    for k in CHUNK_COUNTS:
        table.add_column(f"K={k} hipipe / exact", justify="right")
    for cell in cells:
        row = [
            _size(cell["message_bytes"]),
            _ms(cell["best_bound_s"]),
            _ms(cell["exact_backed_bound_s"]),
            f"{_ms(cell['hipipe_s'])} ({cell['hipipe_num_chunks']})",
            f"{cell['hipipe_vs_bound']:+.1%} / {cell['hipipe_vs_exact_backed_bound']:+.1%}",
        ]
        for k in CHUNK_COUNTS:
            e = cell["per_k"][k]
            mark = "*" if e["proven"] else f" gap {e['gap']:.1%}" if e["gap"] is not None else " gap ?"
            row.append(f"{_ms(e['hipipe_s'])} / {_ms(e['exact_s'])}{mark} ({e['hipipe_vs_exact']:+.2%})")
        table.add_row(*row)
    console.print(table)


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    entries = [(c, k, e) for c in cells for k, e in c["per_k"].items()]
    proven = [(c, k, e) for c, k, e in entries if e["proven"]]
    small = [(c, k, e) for c, k, e in entries if c["num_dims"] <= 3 and k <= 3]
    return {
        "instances": len(entries),
        "proven": len(proven),
        "hipipe_within_1pct_of_proven": sum(e["hipipe_vs_exact"] <= OPTIMUM_GOAL for _, _, e in proven),
        "max_hipipe_vs_proven": max((e["hipipe_vs_exact"] for _, _, e in proven), default=0.0),
        "exact_slower_than_hipipe": sum(e["exact_s"] > e["hipipe_s"] * (1 + 1e-9) for _, _, e in entries),
        "small_instances": len(small),
        "small_proven_within_60s": sum(e["proven"] and e["solve_s"] <= 60 for _, _, e in small),
        "max_small_solve_s": max((e["solve_s"] for _, _, e in small), default=0.0),
        "cells": len(cells),
        "cells_bound_goal_met": sum(c["bound_goal"] != "missed" for c in cells),
        "k_search_misses": [
            f"{c['preset']} {_size(c['message_bytes'])}: own K={c['hipipe_num_chunks']} {_ms(c['hipipe_s'])} ms,"
            f" K={k} {_ms(e['hipipe_s'])} ms"
            for c in cells
            for k, e in c["per_k"].items()
            if e["hipipe_s"] < c["hipipe_s"] * (1 - 1e-6)
        ],
        "cells_missed": [
            f"{c['preset']} {_size(c['message_bytes'])}" for c in cells if c["bound_goal"] == "missed"
        ],
    }


def goals_text(summary: dict[str, Any], limits: str) -> list[str]:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    return [
        f"- hipipe within 1% of the proven optimum at the same K: {summary['hipipe_within_1pct_of_proven']}"
        f" of {summary['proven']} proven instances (worst {summary['max_hipipe_vs_proven']:+.2%};"
        f" {verdict(summary['hipipe_within_1pct_of_proven'] == summary['proven'])});"
        f" {summary['instances'] - summary['proven']} of {summary['instances']} not proven within {limits}",
        f"- exact no slower than hipipe at the same K: {summary['instances'] - summary['exact_slower_than_hipipe']}"
        f" of {summary['instances']} ({verdict(summary['exact_slower_than_hipipe'] == 0)})",
        f"- hipipe within 5% of max(T_mix, T_pipe) or of the exact-backed bound, or proven optimal at its K:"
        f" {summary['cells_bound_goal_met']}"
        f" of {summary['cells']} cells ({verdict(not summary['cells_missed'])})"
        + (f"; missed: {', '.join(summary['cells_missed'])}" if summary["cells_missed"] else ""),
        f"- exact proves K <= 3 on 2- and 3-dim networks within a minute: {summary['small_proven_within_60s']}"
        f" of {summary['small_instances']} (slowest {summary['max_small_solve_s']:.1f} s;"
        f" {verdict(summary['small_proven_within_60s'] == summary['small_instances'])})",
        f"- hipipe's own K search worse than hipipe forced to some K in 2..4: {summary['k_search_misses']}",
    ]


def missed_text(cells: list[dict[str, Any]]) -> list[str]:
    """Where exact found a better structure than hipipe at the same K."""
    lines = []
    for cell in cells:
        for k, e in cell["per_k"].items():
            if "exact_structure" not in e:
                continue
            lines.append(
                f"- {cell['preset']} {_size(cell['message_bytes'])} K={k}: hipipe {_ms(e['hipipe_s'])} ms,"
                f" exact {_ms(e['exact_s'])} ms{' (proven)' if e['proven'] else ''} ({e['hipipe_vs_exact']:+.2%})"
            )
            lines += structure_lines(e, "  ")
    return lines


def deeper_text(cells: list[dict[str, Any]]) -> list[str]:
    """The exact runs beyond K = 4 (``DEEPER_BOUND_CHUNKS``): what each proved and the floor it gave."""
    lines = []
    for cell in cells:
        for k, e in cell["deeper"].items():
            proof = "proven" if e["proven"] else f"gap {e['gap']:.1%}" if e["gap"] is not None else "gap ?"
            dual = _ms(e["dual_bound_s"]) if e["dual_bound_s"] is not None else "?"
            method = f", {e['method']}" if "method" in e else ""
            lines.append(
                f"- {cell['preset']} {_size(cell['message_bytes'])} K={k}: exact {_ms(e['exact_s'])} ms"
                f" ({proof}, {e['solve_s']:.1f} s{method}), dual bound {dual} ms; hipipe {_ms(cell['hipipe_s'])} ms"
                f" (K={cell['hipipe_num_chunks']})"
            )
    return lines


def floor_proof_text(cells: list[dict[str, Any]], key: str = "floor_proof") -> list[str]:
    """The proofs of :func:`_prove` kept under ``key`` (``floor_proof`` or
    ``optimum_proof``): what each asked and what it answered."""
    lines = []
    for cell in cells:
        proof = cell.get(key)
        if proof is None:
            continue
        answer = (
            "proven"
            if proof["proven"]
            else f"disproved: a schedule of {_ms(proof['faster_s'])} ms"
            if proof["faster_s"] is not None
            else "open (time limit)"
        )
        lines.append(
            f"- {cell['preset']} {_size(cell['message_bytes'])}: no schedule with at most {proof['max_chunks']}"
            f" chunks below {_ms(proof['floor_s'])} ms ({_floor_asked(proof)}): {answer};"
            f" {proof['settled']} of {proof['subproblems']} MIPs settled, {proof.get('refined', 0)} split by"
            f" the next dim, {proof.get('timed_out', 0)} at their time limit ({proof['method']},"
            f" {proof['nodes']} nodes, {proof['solve_s']:.1f} s on {proof.get('jobs', 1)} process(es)"
            f"{_resumed_text(proof)}); hipipe {_ms(cell['hipipe_s'])} ms (K={cell['hipipe_num_chunks']})"
        )
    return lines


def _resumed_text(proof: dict[str, Any]) -> str:
    """How much of a proof an earlier run's journal answered (nothing when none did)."""
    resumed = proof.get("resumed", 0)
    if not resumed:
        return ""
    return f"; {resumed} of the regions answered by earlier runs, journal {Path(proof['journal']).name}"


def _floor_asked(proof: dict[str, Any]) -> str:
    """Which floor a proof asked: T_pipe counting k + 1 chunks, hipipe less the goal, or
    hipipe itself (the optimum proof)."""
    many = f"T_pipe counting {proof['max_chunks'] + 1}"
    if proof.get("asked") == "hipipe":
        return f"hipipe's makespan less {OPTIMUM_MARGIN:g}"
    if proof.get("asked") == "goal":
        return f"hipipe less the {BOUND_GOAL:.0%} goal; {many}: {_ms(proof['many_s'])} ms"
    return many


def structure_lines(entry: dict[str, Any], indent: str) -> list[str]:
    """hipipe's and exact's chunks (order, fraction) of one instance, with their per-dim
    sequences where recorded."""
    lines = []
    for who in ("hipipe", "exact"):
        chunks = ", ".join(f"{tuple(c['order'])} {c['fraction']:.3f}" for c in entry[f"{who}_structure"])
        sequences = entry.get(f"{who}_sequences")
        lines.append(f"{indent}- {who}: {chunks}" + (f"; {sequences}" if sequences else ""))
    return lines


def write_markdown(
    path: Path,
    cells: list[dict[str, Any]],
    summary: dict[str, Any],
    machine: str,
    limits: str,
    argv: str,
    generated: list[str],
    collective: Collective,
) -> None:
    lines = [
        f"# Optimality benchmark ({machine}, {datetime.date.today().isoformat()})",
        "",
        f"Generated by `python benchmarks/optimality.py {argv}`.",
        f"Simulated times under the alpha-beta cost model ({COLLECTIVE_NAMES[collective]}). `exact` is the MIP planner:",
        "the best schedule with at most K chunks, `*` when HiGHS proved it optimal within the",
        "per-solve time limit (otherwise its final gap). The best bound is `max(T_mix, T_pipe)`;",
        "the exact-backed bound is `max(best bound, min(dual bound of exact at K = 4, T_pipe for K >= 5))`,",
        "a floor for every K (a schedule has at most 4 chunks or at least 5); where a cell misses the",
        "goal with it, the exact MIPs first try to prove a larger floor (below), then, if it is still missed,",
        f"exact also runs at K = {', '.join(map(str, DEEPER_BOUND_CHUNKS))} and the same floor with"
        " that K counts where T_pipe counting K + 1 chunks leaves it room (`K <= k` in the goal column names the K"
        " that gave the floor)",
        f"(1-minute load average when the run ended: {os.getloadavg()[0]:.1f}).",
        "",
        "## Goals",
        "",
        *goals_text(summary, limits),
        *generated,
        "",
        "## Structures hipipe misses (exact better by more than 0.1% at the same K)",
        "",
        "Chunks as (RS order) fraction of the message; sequences as chunk + R(S)/A(G) per dim.",
        "",
        *(missed_text(cells) or ["none"]),
        "",
        "## Floors proven beyond K = 4",
        "",
        "Where a cell misses the goal with K <= 4: is any schedule with at most k chunks faster than T_pipe",
        "counting k + 1 chunks (the smallest k past 4 whose T_pipe would meet the goal)? A proof makes that",
        "T_pipe a floor for every K (`K <= k` in the goal column).",
        "",
        *(floor_proof_text(cells) or ["none (no cell missed the goal where one could help)"]),
        "",
        "## Exact runs beyond K = 4 for the bound",
        "",
        *(deeper_text(cells) or ["none (no cell missed the goal where they could help)"]),
        "",
        "## hipipe's own K proven optimal",
        "",
        "Where a cell misses the goal after all of the above: is any schedule with at most hipipe's own K",
        f"chunks faster than hipipe's plan (less {OPTIMUM_MARGIN:g})? A proof meets the goal's last clause",
        "(`proven optimal at K=k` in the goal column); a schedule found is a structure hipipe misses.",
        "",
        *(
            floor_proof_text(cells, "optimum_proof")
            or ["none (no cell missed the goal where one could help)"]
        ),
        "",
    ]
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for cell in cells:
        by_preset.setdefault(cell["preset"], []).append(cell)
    for preset, group in by_preset.items():
        lines += [f"## {preset}", ""]
        header = "| message | T_mix ms | T_pipe ms | exact-backed ms | hipipe ms (K) | vs best / exact-backed | bound goal |"
        header += "".join(f" K={k}: hipipe / exact ms |" for k in CHUNK_COUNTS)
        lines += [header, "|---" * (7 + len(CHUNK_COUNTS)) + "|"]
        for cell in group:
            row = (
                f"| {_size(cell['message_bytes'])} | {_ms(cell['order_mix_bound_s'])} | {_ms(cell['pipeline_bound_s'])}"
                f" | {_ms(cell['exact_backed_bound_s'])} | {_ms(cell['hipipe_s'])} ({cell['hipipe_num_chunks']})"
                f" | {cell['hipipe_vs_bound']:+.1%} / {cell['hipipe_vs_exact_backed_bound']:+.1%}"
                f" | {cell['bound_goal']} |"
            )
            for k in CHUNK_COUNTS:
                e = cell["per_k"][k]
                proof = "*" if e["proven"] else f" gap {e['gap']:.1%}" if e["gap"] is not None else " gap ?"
                row += (
                    f" {_ms(e['hipipe_s'])} / {_ms(e['exact_s'])}{proof} ({e['hipipe_vs_exact']:+.2%},"
                    f" {e['solve_s']:.1f} s) |"
                )
            lines.append(row)
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 networks x 1 message")
    parser.add_argument(
        "--preset",
        action="append",
        choices=tuple(PRESETS),
        help="only this reference network (repeat for more; default: every one)",
    )
    parser.add_argument(
        "--size",
        action="append",
        type=parse_size_bytes,
        help="only this message size, e.g. 256MiB (repeat for more; default: 16 MiB .. 1 GiB)",
    )
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds per exact solve, K <= 3 on <= 3 dims"
    )
    parser.add_argument(
        "--hard-time-limit", type=float, default=15.0, help="seconds per exact solve, the other instances"
    )
    parser.add_argument(
        "--deeper-time-limit",
        type=float,
        default=DEEPER_TIME_LIMIT_S,
        help="seconds per exact solve beyond K = 4, where a cell misses the bound goal",
    )
    parser.add_argument(
        "--floor-time-limit",
        type=float,
        default=FLOOR_TIME_LIMIT_S,
        help="seconds for the floor proof of a cell that misses the bound goal (0: no floor proofs)",
    )
    parser.add_argument(
        "--floor-jobs",
        type=int,
        default=1,
        help="processes a floor proof solves its MIPs in (one region each, at once)",
    )
    parser.add_argument(
        "--floor-leaf-time-limit",
        type=float,
        help="seconds a floor proof gives one fixed-order MIP (default: the rest of its time limit)",
    )
    parser.add_argument(
        "--optimum-time-limit",
        type=float,
        default=OPTIMUM_TIME_LIMIT_S,
        help="seconds for proving hipipe optimal at its own K where a cell misses the bound goal"
        " after the floor proof and the deeper runs (0: none; --floor-jobs and"
        " --floor-leaf-time-limit apply)",
    )
    parser.add_argument(
        "--proof-journals",
        type=Path,
        help="keep every floor and optimum proof's answered regions in this directory, and"
        " resume the proofs from what earlier runs left there (one file per cell and most chunks)",
    )
    parser.add_argument(
        "--generated", type=int, default=GENERATED, help="generated networks, one K each (0: none)"
    )
    parser.add_argument("--seed", type=int, default=GENERATED_SEED, help="seed of the generated networks")
    parser.add_argument(
        "--collective",
        type=Collective.parse,
        default=Collective.ALL_REDUCE,
        help="all_reduce (default), reduce_scatter or all_gather",
    )
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args(argv)
    if args.floor_jobs < 1:
        parser.error(f"--floor-jobs must be 1 or more, got {args.floor_jobs}")
    if args.floor_leaf_time_limit is not None and not args.floor_leaf_time_limit > 0:
        parser.error(
            f"--floor-leaf-time-limit must be a positive number of seconds, got {args.floor_leaf_time_limit}"
        )
    for flag, value in (
        ("--floor-time-limit", args.floor_time_limit),
        ("--optimum-time-limit", args.optimum_time_limit),
    ):
        if not (math.isfinite(value) and value >= 0):
            parser.error(f"{flag} must be a number of seconds (0: none), got {value}")
    if args.proof_journals is not None:
        try:
            args.proof_journals.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            parser.error(f"--proof-journals: cannot use {args.proof_journals}: {error.strerror}")
    if args.quick and (args.preset or args.size):
        parser.error("--quick picks its own networks and sizes: drop --preset and --size")
    presets = QUICK_PRESETS if args.quick else tuple(args.preset or PRESETS)
    messages = QUICK_MESSAGES if args.quick else tuple(args.size or MESSAGES)
    console = Console(width=220)
    started = time.perf_counter()
    cells: list[dict[str, Any]] = []
    for preset in presets:
        group = []
        for message in messages:
            group.append(
                run_cell(
                    preset,
                    message,
                    args.time_limit,
                    args.hard_time_limit,
                    args.collective,
                    deeper_time_limit_s=args.deeper_time_limit,
                    floor_time_limit_s=args.floor_time_limit,
                    floor_jobs=args.floor_jobs,
                    floor_leaf_time_limit_s=args.floor_leaf_time_limit,
                    optimum_time_limit_s=args.optimum_time_limit,
                    proof_journals=args.proof_journals,
                )
            )
            print(
                f"  {preset} {_size(message)} done at {time.perf_counter() - started:.0f} s", file=sys.stderr
            )
        cells.extend(group)
        card(console, preset, group)
    entries = run_generated(args.generated, args.seed, args.time_limit, args.hard_time_limit, args.collective)
    summary = summarize(cells)
    summary.update(summarize_generated(entries))
    summary["wall_s"] = time.perf_counter() - started
    console.print("Goals:")
    limits = f"{args.time_limit:g} s (K <= 3 on <= 3 dims) / {args.hard_time_limit:g} s (the others)"
    generated = generated_text(entries, summary, args.seed) if entries else []
    for line in [*goals_text(summary, limits), *generated]:
        console.print(line, highlight=False)
    console.print("Structures hipipe misses:")
    for line in missed_text(cells) or ["none"]:
        console.print(line, highlight=False)
    machine = f"{os.cpu_count()}cpu"
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = (
            "optimality"
            if args.collective is Collective.ALL_REDUCE
            else f"optimality-{args.collective.value}"
        )
        path = args.out / f"{name}-{machine}-{datetime.date.today().isoformat()}.md"
        command = " ".join(sys.argv[1:] if argv is None else argv)
        write_markdown(path, cells, summary, machine, limits, command, generated, args.collective)
        console.print(f"wrote {path}")
    sys.stdout.flush()
    document = {
        "benchmark": "optimality",
        "machine": machine,
        "collective": args.collective.value,
        "summary": summary,
        "cells": cells,
    }
    print(json.dumps({**document, "generated": entries}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
