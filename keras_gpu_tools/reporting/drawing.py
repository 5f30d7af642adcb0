"""What the sections' plots share: a new figure, its axes, the labels shown as written, PNG bytes.

matplotlib is imported when a figure is first drawn, never at module import; no pyplot, so no
global state. The figures are `ShownFigure`s: Jupyter shows them as pictures without pyplot.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from keras_gpu_tools.reporting.model import ReportData, Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def available() -> bool:
    """Whether matplotlib can be imported (the plots need it; the rest of the report does not)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def sampled_note(series: list[Series | None]) -> str:
    """What a plot leaves out of long series ("": nothing): evenly spaced points of each, the last one too."""
    long = [s for s in series if s is not None and s.sampled]
    if not long:
        return ""
    n = max(s.n for s in long)
    shown = max(len(s.values) for s in long)
    return f"{shown} of {n} points shown (evenly spaced); the table's figures cover every point"


def note_sampled(fig: Figure, series: list[Series | None]) -> None:
    note = sampled_note(series)
    if note:
        fig.text(0.01, 0.0, note, fontsize=7, color="#777", ha="left", va="bottom")


def png(fig: Figure) -> bytes:
    """`fig` as a PNG file's bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def literal(fig: Figure) -> None:
    """Makes every label, title and legend entry of `fig` show its text as written.

    They hold tag, metric and GPU names, in which matplotlib would read
    "$...$" as mathtext (and fail to draw "$a_b_c$": a double subscript) or
    hand the text to LaTeX under `text.usetex`. Tick labels are left to
    matplotlib: they are numbers, which its formatters may write as mathtext.
    """
    from matplotlib.text import Text

    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks.add(axis.get_offset_text())
            ticks.update(axis.get_ticklabels(which="both"))
    for t in fig.findobj(Text):
        if t not in ticks:
            t.set_usetex(False)
            t.set_parse_math(False)


def new_figure(rows: int = 1, height: float = 2.6, width: float = 8.0) -> tuple[Figure, list[Axes]]:
    from keras_gpu_tools.runtime.figure import ShownFigure

    fig = ShownFigure(figsize=(width, height * rows), dpi=100, layout="constrained")
    axes = [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]
    return fig, axes


def seconds(data: ReportData, s: Series) -> list[float]:
    """The wall times of `s` in seconds since the report's first GPU or host point."""
    t0 = data.t0 or (s.wall[0] if s.wall else 0.0)
    return [w - t0 for w in s.wall]


def legend_right(ax: Axes) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
