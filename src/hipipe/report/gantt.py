"""Gantt charts of schedules: one lane per dimension, one colour per chunk.

RS ops are drawn solid and AG ops hatched, so the two phases of a chunk on the same
dimension are told apart; bar widths show the (possibly uneven) chunk sizes at work.
Several schedules (e.g. planned vs measured) are drawn as stacked panels sharing the
time axis, which is what makes a comparison readable at a glance.
"""

from collections.abc import Sequence
from io import BytesIO
from pathlib import Path

from hipipe.files import atomic_write_bytes
from hipipe.schedule import Phase, Schedule
from hipipe.units import format_size, format_time

_MAX_LABELLED_CHUNKS = 24


def _time_unit(makespan_s: float) -> tuple[float, str]:
    if makespan_s >= 1:
        return 1.0, "s"
    if makespan_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def render_gantt_png(panels: Sequence[tuple[str, Schedule]], *, width_in: float = 12.0) -> bytes:
    """Draw each ``(title, schedule)`` as a panel; return the PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not panels:
        raise ValueError("nothing to draw")
    horizon_s = max(s.makespan_s for _, s in panels) or 1.0
    scale, unit = _time_unit(horizon_s)
    heights = [0.55 * s.topology.num_dims + 1.0 for _, s in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(width_in, sum(heights) + 0.6),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    cmap = plt.get_cmap("tab20")
    for ax, (title, schedule) in zip(axes[:, 0], panels, strict=True):
        num_dims = schedule.topology.num_dims
        for op in schedule.ops:
            colour = cmap(op.chunk % 20)
            for k in op.dims:
                ax.broken_barh(
                    [(op.start_s * scale, max(op.duration_s * scale, horizon_s * scale * 1e-4))],
                    (k - 0.38, 0.76),
                    facecolors=colour,
                    edgecolors="black",
                    linewidth=0.3,
                    hatch="////" if op.phase is Phase.AG else None,
                )
                if schedule.num_chunks <= _MAX_LABELLED_CHUNKS and op.duration_s > horizon_s / 40:
                    ax.text(
                        (op.start_s + op.duration_s / 2) * scale,
                        k,
                        f"{op.chunk}",
                        ha="center",
                        va="center",
                        fontsize=7,
                    )
        ax.set_yticks(range(num_dims))
        ax.set_yticklabels(
            [f"dim {k}\n{d.kind.value} {d.size}" for k, d in enumerate(schedule.topology.dims)], fontsize=8
        )
        ax.set_ylim(num_dims - 0.5, -0.5)
        ax.set_title(
            f"{title}: {schedule.planner} on {schedule.topology.label()}, {format_size(schedule.message_bytes)},"
            f" {schedule.num_chunks} chunks, {format_time(schedule.makespan_s)}",
            fontsize=9,
            loc="left",
        )
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    axes[-1, 0].set_xlim(0, horizon_s * scale * 1.01)
    axes[0, 0].legend(
        handles=[
            Patch(facecolor="lightgray", edgecolor="black", label="ReduceScatter"),
            Patch(facecolor="lightgray", edgecolor="black", hatch="////", label="AllGather"),
        ],
        loc="upper right",
        fontsize=7,
        framealpha=0.8,
    )
    fig.tight_layout()
    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def write_gantt(path: str | Path, panels: Sequence[tuple[str, Schedule]]) -> None:
    """Render and write atomically (no half-written PNG on failure)."""
    atomic_write_bytes(path, render_gantt_png(panels))
