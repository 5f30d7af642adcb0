"""A throughput plan's figure: samples/s and peak memory against the batch size (matplotlib, no pyplot).

matplotlib is imported when the figure is drawn, never at module import.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.memory.throughput import Candidate


def figure(rows: Sequence[Candidate], chosen: int | None = None) -> Any:
    """A matplotlib `Figure` (shown as a picture in Jupyter): samples/s ± its uncertainty (left axis) and peak MiB (right axis) per batch; ``chosen`` marked."""
    from keras_gpu_tools.runtime.figure import ShownFigure

    fig = ShownFigure(figsize=(6.4, 3.0), dpi=100, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    measured = [r for r in rows if r.measured and r.samples_per_sec]
    ax.plot(
        [r.batch_size for r in measured],
        [r.samples_per_sec or 0.0 for r in measured],
        "-o",
        color="#1f77b4",
        label="samples/s",
    )
    bars = [r for r in measured if r.uncertainty]
    if bars:  # each figure's uncertainty (one standard error), as the choice counts it
        ax.errorbar(
            [r.batch_size for r in bars],
            [r.samples_per_sec or 0.0 for r in bars],
            yerr=[(r.samples_per_sec or 0.0) * (r.uncertainty or 0.0) for r in bars],
            fmt="none",
            ecolor="#1f77b4",
            capsize=3,
            linewidth=1,
        )
    for r in rows:
        if not r.measured:
            ax.axvline(r.batch_size, color="#bbbbbb", linestyle=":", linewidth=1)
    pick = next((r for r in measured if r.batch_size == chosen), None)
    if pick is not None:
        ax.plot([pick.batch_size], [pick.samples_per_sec or 0.0], "*", color="#d62728", markersize=14, label="plan")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (global)")
    ax.set_ylabel("samples/s", color="#1f77b4")
    peaks = [r for r in rows if r.peak_mib is not None]
    if peaks:
        mem = ax.twinx()
        mem.plot(
            [r.batch_size for r in peaks], [r.peak_mib or 0.0 for r in peaks], "--s", color="#ff7f0e", markersize=4
        )
        mem.set_ylabel("peak MiB per device", color="#ff7f0e")
    ax.set_title("Throughput plan: samples/s and memory against the batch", fontsize=10, loc="left")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def png(fig: Any) -> tuple[bytes, int, int]:
    """``fig`` as PNG bytes, with its width and height in pixels."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    width, height = (int(v) for v in fig.canvas.get_width_height())
    return buf.getvalue(), width, height


__all__ = ["figure", "png"]
