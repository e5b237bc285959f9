"""Render a schedule's ``info`` (what its planner decided and why) as readable text.

Generic on purpose: the report never knows which planner made a schedule, so planners
explain themselves through JSON-serializable ``info`` and this module only lays it out.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from hipipe.bounds import order_mix_bound_s, pipeline_bound_s
from hipipe.cost import lower_bound_s
from hipipe.schedule import Schedule
from hipipe.units import format_time


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key.endswith("_s"):
            return format_time(value)
        return f"{value:.6g}"
    return str(value)


def _lines(value: Any, key: str, indent: int) -> list[str]:
    pad = "  " * indent
    if isinstance(value, Mapping):
        out = [f"{pad}{key}:"] if key else []
        for k, v in value.items():
            # children of a ``..._s`` mapping are times too (e.g. ``baselines_makespan_s``)
            child_key = f"{k}_s" if key.endswith("_s") and not str(k).endswith("_s") else str(k)
            out.extend(_line_with_name(v, child_key, str(k), indent + (1 if key else 0)))
        return out
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) > 0 and all(isinstance(v, Mapping) for v in value):
            out = [f"{pad}{key}:"]
            for item in value:
                out.append(pad + "  - " + ", ".join(f"{k}={_format_value(k, v)}" for k, v in item.items()))
            return out
        return [f"{pad}{key}: {', '.join(_format_value(key, v) for v in value)}"]
    return [f"{pad}{key}: {_format_value(key, value)}"]


def _line_with_name(value: Any, key: str, name: str, indent: int) -> list[str]:
    """Format by ``key`` (which carries the unit) but print ``name``."""
    lines = _lines(value, key, indent)
    if lines and key != name:
        pad = "  " * indent
        lines[0] = lines[0].replace(f"{pad}{key}:", f"{pad}{name}:", 1)
    return lines


def _best_bound_line(schedule: Schedule) -> str:
    """``T_mix``, ``T_pipe`` and how close the schedule is to the larger (the best floor known)."""
    moves = schedule.collective.moves_per_byte
    mix_s = order_mix_bound_s(schedule.topology, schedule.message_bytes) * moves / 2
    pipe_s = pipeline_bound_s(schedule.topology, schedule.message_bytes, schedule.collective)
    best_s = max(mix_s, pipe_s)
    return (
        f"order-mix bound T_mix {format_time(mix_s)}, pipeline bound T_pipe {format_time(pipe_s)}:"
        f" best bound {format_time(best_s)}, reached {best_s / schedule.makespan_s:.2%}"
    )


def explain(schedule: Schedule) -> str:
    """Header with the bounds and chunks, then the planner's decisions.

    A registered planner with its own renderer explains its ``info`` itself; any other
    schedule (another planner, a hand-written JSON) gets the generic layout of ``info``.
    """
    from hipipe.planners import PLANNERS

    spec = PLANNERS.get(schedule.planner)
    bound_s = lower_bound_s(schedule.topology, schedule.message_bytes, schedule.collective)
    header = [
        f"{schedule.planner} {schedule.collective.value}: {schedule.num_chunks} chunks,"
        f" makespan {format_time(schedule.makespan_s)}",
        f"lower bound T* {format_time(bound_s)}, utilization {bound_s / schedule.makespan_s:.2%}",
        _best_bound_line(schedule),
        "chunks (size, order):",
    ]
    shown = schedule.chunks[:16]
    for chunk in shown:
        order = " -> ".join("+".join(str(k) for k in group) for group in chunk.order)
        header.append(f"  {chunk.index:3d}: {chunk.size_bytes:14.1f} B  dims {order}")
    if len(schedule.chunks) > len(shown):
        header.append(f"  ... {len(schedule.chunks) - len(shown)} more")
    if spec is not None and spec.explain is not None:
        header.append(spec.explain(schedule))
    elif schedule.info:
        header.append("planner decisions:")
        header.extend(_lines(dict(schedule.info), "", 1))
    return "\n".join(header)
