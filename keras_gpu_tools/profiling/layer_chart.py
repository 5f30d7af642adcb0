"""A layer table's bar chart: ms per step of the heaviest layers (matplotlib, no pyplot, imported when drawn)."""

from __future__ import annotations

import io

from keras_gpu_tools.profiling.capture import steps_name
from keras_gpu_tools.profiling.layer_table import SHOWN_ROWS, LayerTable


def chart_png(table: LayerTable, limit: int = SHOWN_ROWS) -> tuple[bytes, int, int]:
    """The chart as PNG bytes, its width and height in pixels (raises ImportError without matplotlib)."""
    from matplotlib.figure import Figure

    rows = table.rows[:limit][::-1]  # the heaviest at the top
    height = 1.0 + 0.28 * len(rows)
    fig = Figure(figsize=(6.4, height), dpi=100, layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    pos = list(range(len(rows)))
    ax.barh(pos, [r.forward_ms for r in rows], color="#1f77b4", label="forward")
    ax.barh(pos, [r.backward_ms for r in rows], left=[r.forward_ms for r in rows], color="#ff7f0e", label="backward")
    for y, r in zip(pos, rows):
        ax.text(r.ms_per_step, y, f" {100 * r.share:.0f}%", va="center", fontsize=7)
    ax.set_yticks(pos)
    ax.set_yticklabels([r.path for r in rows], fontsize=7)
    for label in ax.get_yticklabels():
        label.set_usetex(False)
        label.set_parse_math(False)  # layer names may hold "$" or "_": shown as written
    ax.set_xlabel(f"ms per step ({table.source})")
    ax.set_title(f"Time per layer, {steps_name(table.start_step, table.num_steps)}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    w, h = fig.get_size_inches() * 100
    return buf.getvalue(), int(w), int(h)
