"""The table ``hipipe tune`` prints: every candidate measured, the kept one marked."""

from rich.table import Table

from hipipe.tuning.cache import TunedEntry
from hipipe.units import format_size, format_time


def tuning_table(entry: TunedEntry) -> Table:
    """One row per candidate: chunks, predicted, measured median, its runs and range, the choice.

    Candidates take different numbers of timed runs (each repeats until its median is
    settled: a 64-chunk schedule spreads far more than a few-chunk one), so each row says
    how many."""
    key = entry.key
    table = Table(
        title=(
            f"{entry.topology_name or key.topology}, {key.collective.value} of {format_size(key.message_bytes)}"
            f" {key.dtype}"
        ),
        title_justify="left",
    )
    for column in ("candidate", "chunks", "predicted", "measured median", "runs", "min - max", "kept"):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for m in entry.measurements:
        kept = m.name == entry.chosen
        table.add_row(
            f"[bold]{m.name}[/bold]" if kept else m.name,
            str(m.num_chunks),
            format_time(m.predicted_s),
            format_time(m.median_s),
            str(len(m.times_s)),
            f"{format_time(min(m.times_s))} - {format_time(max(m.times_s))}",
            "yes" if kept else "",
        )
    return table
