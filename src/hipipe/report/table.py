"""Terminal tables (rich) for comparisons and single plans."""

from rich.console import Console
from rich.table import Table

from hipipe.compare import Comparison
from hipipe.cost import lower_bound_s
from hipipe.predict import predict
from hipipe.schedule import Schedule
from hipipe.units import format_size, format_time


def _utilization_style(value: float) -> str:
    if value >= 0.9:
        return "bold green"
    if value >= 0.6:
        return "yellow"
    return "red"


def comparison_tables(comparison: Comparison) -> list[Table]:
    """One table per message size: time, utilization, speed-up vs the slowest planner."""
    tables = []
    for bound in comparison.bounds:
        rows = comparison.for_size(bound.size_bytes)
        slowest_s = max(r.time_s for r in rows)
        fastest_s = min(r.time_s for r in rows)
        table = Table(
            title=(
                f"{comparison.topology.label()} · {comparison.collective.value} · {format_size(bound.size_bytes)} · "
                f"T* {format_time(bound.lower_bound_s)} · T_mix {format_time(bound.order_mix_bound_s)} · "
                f"T_pipe {format_time(bound.pipeline_bound_s)} · best bound {format_time(bound.best_bound_s)}"
            ),
            title_justify="left",
        )
        table.add_column("planner", no_wrap=True)
        table.add_column("time", justify="right")
        predicted = any(r.predicted_s is not None for r in rows)
        if predicted:
            table.add_column("predicted (p10-p90)", justify="right")
        table.add_column("T*/T", justify="right")
        table.add_column("T_mix/T", justify="right")
        table.add_column("bound/T", justify="right")
        table.add_column("speed-up", justify="right")
        table.add_column("chunks", justify="right")
        table.add_column("plan time", justify="right")
        for r in rows:
            best = r.time_s == fastest_s
            cells = [
                f"[bold]{r.planner}[/bold]" if best else r.planner,
                f"[bold]{format_time(r.time_s)}[/bold]" if best else format_time(r.time_s),
            ]
            if predicted:
                cells.append(_predicted_cell(r.predicted_s, r.predicted_low_high_s))
            table.add_row(
                *cells,
                f"[{_utilization_style(r.utilization)}]{r.utilization:.1%}[/]",
                f"{r.mix_utilization:.1%}",
                f"{r.best_bound_utilization:.1%}",
                f"{slowest_s / r.time_s:.2f}x",
                str(r.num_chunks),
                format_time(r.plan_time_s),
            )
        tables.append(table)
    return tables


def _predicted_cell(median_s: float | None, low_high_s: tuple[float, float] | None) -> str:
    if median_s is None or low_high_s is None:
        return "-"
    return f"{format_time(median_s)} ({format_time(low_high_s[0])}-{format_time(low_high_s[1])})"


def print_comparison(comparison: Comparison, console: Console) -> None:
    console.print(comparison.topology.describe(), style="dim")
    for table in comparison_tables(comparison):
        console.print(table)


def schedule_summary(schedule: Schedule) -> Table:
    """Key numbers of one schedule."""
    bound_s = lower_bound_s(schedule.topology, schedule.message_bytes, schedule.collective)
    table = Table(show_header=False, title=f"{schedule.planner} plan", title_justify="left")
    table.add_column("what")
    table.add_column("value")
    table.add_row("collective", schedule.collective.value)
    table.add_row("topology", f"{schedule.topology.label()} ({schedule.topology.num_npus} NPUs)")
    table.add_row("message", format_size(schedule.message_bytes))
    table.add_row("chunks", str(schedule.num_chunks))
    table.add_row("ops", str(len(schedule.ops)))
    table.add_row("time", format_time(schedule.makespan_s))
    if not schedule.topology.overheads.is_linear:
        prediction = predict(schedule)
        table.add_row(
            "predicted (p10-p90)",
            _predicted_cell(prediction.median_s, (prediction.low_s, prediction.high_s))
            + " with concurrency and jitter",
        )
    table.add_row("lower bound T*", format_time(bound_s))
    table.add_row("utilization", f"{bound_s / schedule.makespan_s:.1%}")
    for k, dim in enumerate(schedule.topology.dims):
        busy_s = sum(op.duration_s for op in schedule.ops_on(k))
        table.add_row(f"dim {k} busy", f"{busy_s / schedule.makespan_s:.1%} ({dim.kind.value} {dim.size})")
    return table
