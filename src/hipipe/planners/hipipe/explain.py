"""``explain(schedule)``: what the planner decided and why, as readable text.

Reads only ``Schedule.info`` (plus the schedule's own numbers), so it also works on a
schedule loaded back from JSON. Used by ``hipipe plan --explain``.
"""

from typing import Any

from hipipe.schedule import Schedule


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def _order(order: list[int]) -> str:
    return "(" + " ".join(str(k) for k in order) + ")"


def explain(schedule: Schedule) -> str:
    """A few lines per decision: K and the candidates, the order mix, LP vs simulator, bounds."""
    info: dict[str, Any] = dict(schedule.info)
    lines = [
        f"planner {schedule.planner}, {schedule.collective.value}: {schedule.message_bytes} B on"
        f" {schedule.topology.label()}"
        f" ({schedule.topology.num_npus} NPUs) -> {_time(schedule.makespan_s)}",
    ]
    if "num_chunks" not in info:
        lines.append("no planner decisions recorded (this schedule carries no HiPIPE info)")
        return "\n".join(lines)
    lines.append(
        f"chunks: K = {info['num_chunks']} (structure from {info.get('structure_source', '?')};"
        f" {info.get('lp_solves', 0)} LP solves, {info.get('simplex_iterations', 0)} simplex iterations)"
    )
    candidates = info.get("candidates", [])
    failed = [c for c in candidates if "error" in c]
    pruned = [c for c in candidates if "pruned" in c]
    candidates = [c for c in candidates if "makespan_s" in c]
    if candidates:
        best = min(c["makespan_s"] for c in candidates)
        tried = ", ".join(
            f"{c['num_chunks']}"
            f"{'' if c.get('kept_chunks', c['num_chunks']) == c['num_chunks'] else '->' + str(c['kept_chunks'])}"
            f"{'' if c['source'] in ('mix', 'ascending') else ' ' + c['source']}"
            f"={_time(c['makespan_s'])}{' *' if c['makespan_s'] == best else ''}"
            for c in candidates
        )
        lines.append(f"candidates tried (K[->kept after dropping empty chunks]=time): {tried}")
    for entry in pruned:
        lines.append(f"stopped at K={entry['num_chunks']}: {entry['pruned']}")
    for entry in failed:
        lines.append(f"skipped K={entry['num_chunks']} {entry['source']}: {entry['error']}")
    mix = info.get("order_mix", [])
    if mix:
        lines.append(
            "order mix (fluid LP): " + ", ".join(f"{_order(m['order'])} {m['weight']:.1%}" for m in mix)
        )
    used = info.get("orders_used", [])
    if used:
        lines.append(
            "orders used: "
            + ", ".join(
                f"{_order(u['order'])} x{u['chunks']} = {u['fraction_of_bytes']:.1%} of bytes" for u in used
            )
        )
    sizes = [c.size_bytes for c in schedule.chunks]
    if sizes:
        lines.append(f"chunk sizes: min {min(sizes):.6g} B, max {max(sizes):.6g} B")
    lp = info.get("lp_makespan_s")
    if lp is None:
        lines.append(f"makespan: simulated {_time(info.get('simulated_makespan_s'))} (sizes not from the LP)")
    else:
        lines.append(
            f"makespan: LP {_time(lp)}, simulated {_time(info.get('simulated_makespan_s'))}"
            f" (relative difference {info.get('lp_vs_simulated_relative', 0.0):.1e})"
        )
    lines.append(
        f"bounds: T* = {_time(info.get('lower_bound_s'))} (utilization {info.get('utilization', 0.0):.4f}),"
        f" T_mix = {_time(info.get('order_mix_bound_s'))} (of the mix bound {info.get('utilization_of_mix_bound', 0.0):.4f})"
    )
    baselines = info.get("baselines_makespan_s", {})
    if baselines:
        lines.append(
            "baselines: "
            + ", ".join(
                f"{name} {_time(t)} ({1 - schedule.makespan_s / t:+.1%} reduction)"
                for name, t in baselines.items()
            )
        )
    return "\n".join(lines)
