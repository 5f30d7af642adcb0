"""The report's bar chart: each measured change's speed-up, with its uncertainty; and the report to TensorBoard.

matplotlib is imported when the figure is drawn, never at module import.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.speedups.rows import BASELINE, PAID, UNSAFE, SpeedupRow, noise

logger = logging.getLogger("keras_gpu_tools")


def figure(rows: Sequence[SpeedupRow]) -> Any:
    """A matplotlib `Figure`: one bar per measured change (its speed-up ± the ratio's uncertainty), 1x marked."""
    from keras_gpu_tools.runtime.figure import ShownFigure

    measured = [r for r in rows if r.kind != BASELINE and r.speedup is not None]
    fig = ShownFigure(figsize=(6.4, 0.4 + 0.35 * max(1, len(measured))), dpi=100, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    names = [r.change[:48] for r in measured]
    values = [r.speedup or 0.0 for r in measured]
    errors = [(r.speedup or 0.0) * noise(r.before_uncertainty, r.after_uncertainty) for r in measured]
    colors = ["#2ca02c" if r.status == PAID else "#d62728" if r.status == UNSAFE else "#7f7f7f" for r in measured]
    ax.barh(range(len(measured)), values, xerr=errors, color=colors, capsize=3)
    ax.set_yticks(range(len(measured)), names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xlabel("speed-up over the fit as given (green: paid)")
    ax.set_title("find_speedups: what each change is worth", fontsize=10, loc="left")
    return fig


def write(report: Any, log_dir: str) -> None:
    """Writes ``report`` to ``log_dir/speedups``: its table as text, its rows as JSON, the bar chart, a scalar per row."""
    from keras_gpu_tools.logdir.writer import EventWriter

    writer = EventWriter(os.path.join(os.fspath(log_dir), schema.SPEEDUPS_RUN))
    try:
        writer.text(schema.SPEEDUPS_SUMMARY, report.to_markdown(), 0)
        writer.json(schema.SPEEDUPS_SUMMARY_DATA, report.as_dict(), 0)
        for i, row in enumerate(r for r in report.rows if r.speedup is not None):
            writer.scalars({schema.SPEEDUPS_SPEEDUP: row.speedup}, i)
        if not writer.figure(schema.SPEEDUPS_FIGURE, lambda: figure(report.rows), 0):
            logger.info("keras_gpu_tools: no matplotlib; the speed-ups' figure is left out")  # the table says the same
    finally:
        writer.close()


__all__ = ["figure", "write"]
