"""The training benchmark as a table and a chart: step times and losses of both runs."""

from pathlib import Path
from typing import Any

from rich.table import Table

from hipipe.files import atomic_write_bytes


def training_table(document: dict[str, Any]) -> Table:
    """One row per implementation: median step, speed-up, communication share, final loss."""
    testbed = document["testbed"]
    title = (
        f"{document['workload'].upper()} on {testbed['shape']} at {'/'.join(testbed['rates'])}:"
        f" {document['model']['gradient_bytes'] / 2**20:.1f} MiB of gradients, {document['steps']} steps"
    )
    table = Table(title=title, title_justify="left")
    for column in ("collectives", "median step s", "speed-up", "exposed comm", "first loss", "last loss"):
        table.add_column(column, justify="right")
    torch_median = next(r["median_step_s"] for r in document["rows"] if r["name"] == "torch")
    for row in document["rows"]:
        table.add_row(
            row["name"],
            f"{row['median_step_s']:.3f}",
            f"{torch_median / row['median_step_s']:.2f}x",
            f"{row['communication_share']:.0%}",
            f"{row['losses'][0]:.6f}",
            f"{row['losses'][-1]:.6f}",
        )
    table.caption = (
        f"largest relative loss difference between the runs: {document['max_loss_relative_difference']:.2e}"
        f" (median from step {document['rows'][0]['timed_from_step']} on: the first steps plan schedules)"
    )
    return table


def write_training_chart(path: Path, document: dict[str, Any]) -> None:
    """Step time per step (left) and loss per step (right), one line per implementation."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (times_axis, loss_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for row in document["rows"]:
        steps = range(len(row["step_times_s"]))
        times_axis.plot(
            steps,
            row["step_times_s"],
            marker="o",
            label=f"{row['name']} (median {row['median_step_s']:.2f} s)",
        )
        loss_axis.plot(steps, row["losses"], marker="o", label=row["name"])
    testbed = document["testbed"]
    times_axis.set_title(
        f"{document['workload'].upper()} step time, {testbed['shape']} at {'/'.join(testbed['rates'])}"
    )
    times_axis.set_xlabel("step")
    times_axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss_axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    times_axis.set_ylabel("seconds (slowest rank)")
    times_axis.set_ylim(bottom=0)
    times_axis.legend()
    loss_axis.set_title("loss (mean over ranks)")
    loss_axis.set_xlabel("step")
    loss_axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
