"""The report's plots: matplotlib figures drawn from a `ReportData`.

matplotlib is imported when a figure is first drawn, never at module import; no pyplot, so no
global state.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting.model import SPLIT_KEYS, ReportData, Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SPLIT_COLORS = ("#d62728", "#1f77b4", "#bbbbbb")
UTIL_FIELDS = ("utilization_percent", "sm_activity_percent", "tensor_activity_percent", "memory_busy_percent")
MEMORY_FIELDS = ("memory_used_mib", "allocator_memory_mib", "allocator_peak_memory_mib", "memory_total_mib")


def available() -> bool:
    """Whether matplotlib can be imported (the plots need it; the rest of the report does not)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(data: ReportData) -> dict[str, Figure]:
    """The report's plots by name (``gpu_<i>``, ``host``, ``step_time``, ``oom``, ``training``).

    A plot is drawn only where the run has data for it.
    """
    figs: dict[str, Figure] = {}
    plotted = {m.group(1) for k in data.series if (m := schema.GPU_KEY_RE.match(k))}
    for index in data.gpu_indices():
        if index in plotted:
            figs[f"gpu_{index}"] = _gpu_figure(data, index)
    if any(k.startswith(schema.HOST_PREFIX) for k in data.series):
        figs["host"] = _host_figure(data)
    if data.split_x and any(v is not None for k, _ in SPLIT_KEYS for v in data.split.get(k, [])):
        figs["step_time"] = _split_figure(data)
    if data.oom_count() or any(
        v > 1 for k, s in data.oom_series.items() if k.endswith("micro_batches") for v in s.values
    ):
        figs["oom"] = _oom_figure(data)  # not for a run without a single OOM
    if data.training:
        figs["training"] = _training_figure(data)
    for fig in figs.values():
        _literal(fig)
    return figs


def sampled_note(series: list[Series | None]) -> str:
    """What a plot leaves out of long series ("": nothing): evenly spaced points of each, the last one too."""
    long = [s for s in series if s is not None and s.sampled]
    if not long:
        return ""
    n = max(s.n for s in long)
    shown = max(len(s.values) for s in long)
    return f"{shown} of {n} points shown (evenly spaced); the table's figures cover every point"


def _note_sampled(fig: Figure, series: list[Series | None]) -> None:
    note = sampled_note(series)
    if note:
        fig.text(0.01, 0.0, note, fontsize=7, color="#777", ha="left", va="bottom")


def png(fig: Figure) -> bytes:
    """`fig` as a PNG file's bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _literal(fig: Figure) -> None:
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


def _new_figure(rows: int = 1, height: float = 2.6, width: float = 8.0) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * rows), dpi=100, layout="constrained")
    axes = [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]
    return fig, axes


def _seconds(data: ReportData, s: Series) -> list[float]:
    t0 = data.t0 or (s.wall[0] if s.wall else 0.0)
    return [w - t0 for w in s.wall]


def _legend_right(ax: Axes) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _gpu_figure(data: ReportData, index: str) -> Figure:
    fig, (ax_u, ax_m) = _new_figure(2)
    name = next((g["name"] for g in data.gpus if g.get("index") == index), "")
    fig.suptitle(f"GPU {index}" + (f": {name}" if name else ""), fontsize=11)
    plotted = False
    for field in UTIL_FIELDS:
        s = data.series.get(schema.gpu_key(index, field))
        if s and s.values:
            ax_u.plot(_seconds(data, s), s.values, label=field, linewidth=1.4 if field in UTIL_FIELDS[:2] else 0.9)
            plotted = True
    ax_u.set_ylabel("%")
    ax_u.set_ylim(0, 105)
    ax_u.set_title("utilization", fontsize=9, loc="left")
    if plotted:
        _legend_right(ax_u)
    plotted = False
    for field in MEMORY_FIELDS:
        s = data.series.get(schema.gpu_key(index, field))
        if s and s.values:
            style = "--" if field == "memory_total_mib" else "-"
            ax_m.plot(_seconds(data, s), s.values, style, label=field, linewidth=1.2)
            plotted = True
    ax_m.set_ylabel("MiB")
    ax_m.set_xlabel("seconds since the first sample")
    ax_m.set_title("memory", fontsize=9, loc="left")
    if plotted:
        _legend_right(ax_m)
    _note_sampled(fig, [data.series.get(schema.gpu_key(index, f)) for f in UTIL_FIELDS + MEMORY_FIELDS])
    return fig


def _host_figure(data: ReportData) -> Figure:
    fig, (ax_c, ax_m) = _new_figure(2, height=2.0)
    fig.suptitle("Host", fontsize=11)
    for key in (schema.HOST_CPU_PERCENT, schema.HOST_SYSTEM_CPU_PERCENT):
        s = data.series.get(key)
        if s and s.values:
            ax_c.plot(_seconds(data, s), s.values, label=key.split("/")[1], linewidth=1.2)
    ax_c.set_ylabel("%")
    ax_c.set_title("CPU", fontsize=9, loc="left")
    _legend_right(ax_c)
    s = data.series.get(schema.HOST_RSS_MIB)
    if s and s.values:
        ax_m.plot(_seconds(data, s), s.values, label="rss_mib", color="#2ca02c", linewidth=1.2)
        _legend_right(ax_m)
    ax_m.set_ylabel("MiB")
    ax_m.set_xlabel("seconds since the first sample")
    ax_m.set_title("resident memory", fontsize=9, loc="left")
    _note_sampled(
        fig,
        [data.series.get(k) for k in (schema.HOST_CPU_PERCENT, schema.HOST_SYSTEM_CPU_PERCENT, schema.HOST_RSS_MIB)],
    )
    return fig


BARS_AT_MOST = 60  # windows drawn as bars; more are drawn as stacked steps (a bar per window is slow to draw)


def _split_figure(data: ReportData) -> Figure:
    fig, (ax,) = _new_figure(1, height=3.0)
    n = len(data.split_x)
    if n > BARS_AT_MOST:
        return _split_steps(fig, ax, data)
    pos = list(range(n))
    bottom = [0.0] * n
    for (key, label), color in zip(SPLIT_KEYS, SPLIT_COLORS):
        vals = [v or 0.0 for v in data.split.get(key, [None] * n)]
        ax.bar(pos, vals, bottom=bottom, label=label, color=color, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i in range(n):  # a split the detector could not measure: say so, do not draw 0
        if all((data.split.get(k) or [None] * n)[i] is None for k, _ in SPLIT_KEYS):
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8, color="#777")
    ax.set_xticks(pos)
    ax.set_xticklabels([f"{x:g}" for x in data.split_x], fontsize=8)
    if n > 20:
        for i, t in enumerate(ax.get_xticklabels()):
            t.set_visible(i % max(1, n // 10) == 0)
    ax.set_xlabel("epoch" if data.split_axis == "epoch" else "training step (end of window)")
    ax.set_ylabel("ms per step")
    ax.set_title("Step time: input wait, compute, other", fontsize=10, loc="left")
    ax.set_ylim(0, max(bottom + [0.0]) * 1.25 or 1.0)
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    return fig


def _split_steps(fig: Figure, ax, data: ReportData) -> Figure:
    """Many windows: each part of the step stacked over the steps (or epochs) its window covered."""
    x = [float(v) for v in data.split_x]
    bottom = [0.0] * len(x)
    for (key, label), color in zip(SPLIT_KEYS, SPLIT_COLORS):
        top = [b + (v or 0.0) for b, v in zip(bottom, data.split.get(key, [None] * len(x)))]
        ax.fill_between(x, bottom, top, step="pre", label=label, color=color, linewidth=0)
        bottom = top
    ax.set_xlabel("epoch" if data.split_axis == "epoch" else "training step (end of window)")
    ax.set_ylabel("ms per step")
    ax.set_title(f"Step time: input wait, compute, other ({len(x)} windows)", fontsize=10, loc="left")
    ax.set_ylim(0, max(bottom + [0.0]) * 1.25 or 1.0)
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    return fig


def _oom_figure(data: ReportData) -> Figure:
    from matplotlib.ticker import MaxNLocator

    fig, (ax,) = _new_figure(1, height=2.4)
    for key, s in data.oom_series.items():
        if s.values:
            ax.plot(s.steps, s.values, label=key, linewidth=1.4, marker="o", markersize=4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch" if all(w == 0.0 for s in data.oom_series.values() for w in s.wall) else "training step")
    ax.set_title("Out of memory: events and micro-batches", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    return fig


def _training_figure(data: ReportData) -> Figure:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = sorted({k[4:] if k.startswith("val_") else k for k in data.training})
    names = [n for n in names if n != "learning_rate"] or names
    cols = min(len(names), 2)
    rows = -(-len(names) // cols)
    fig = Figure(figsize=(8.0, 2.4 * rows + 0.3), dpi=100, layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(len(names))]
    for ax, name in zip(axes, names):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch", fontsize=8)
        for key, style in ((name, "-"), (f"val_{name}", "--")):
            s = data.training.get(key)
            if s and s.values:
                ax.plot(s.steps, s.values, style, marker="o", markersize=3, label=key)
        ax.set_title(name, fontsize=9, loc="left")
        ax.legend(fontsize=7)
    fig.suptitle("Training curves", fontsize=11)
    return fig
