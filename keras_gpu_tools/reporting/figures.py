"""The report's plots: matplotlib figures drawn from a `ReportData`.

matplotlib is imported when a figure is first drawn, never at module import; no pyplot, so no
global state. The figures are `ShownFigure`s: Jupyter shows them as pictures without pyplot.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting import health
from keras_gpu_tools.reporting.model import SPLIT_KEYS, ReportData, Series
from keras_gpu_tools.runtime.units import format_number

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
    """The report's plots by name (``gpu_<i>``, ``health_<i>``, ``host``, ``step_time``, ``oom``, ``memory``,
    ``training``, ``plan``, ``speedups``).

    A plot is drawn only where the run has data for it.
    """
    figs: dict[str, Figure] = {}
    plotted = {m.group(1) for k in data.series if (m := schema.GPU_KEY_RE.match(k))}
    for index in data.gpu_indices():
        if index in plotted:
            figs[f"gpu_{index}"] = _gpu_figure(data, index)
    if health.has_health(data):  # the GPUs whose health deserves attention
        for g in health.gpu_health(data):
            if g.attention and g.epochs:
                figs[f"health_{g.label}"] = _health_figure(data, g.label)
    if any(k.startswith(schema.HOST_PREFIX) for k in data.series):
        figs["host"] = _host_figure(data)
    if data.split_x and any(v is not None for k, _ in SPLIT_KEYS for v in data.split.get(k, [])):
        figs["step_time"] = _split_figure(data)
    if data.oom_count() or any(
        v > 1 for k, s in data.oom_series.items() if k.endswith("micro_batches") for v in s.values
    ):
        figs["oom"] = _oom_figure(data)  # not for a run without a single OOM
    if data.memory_series or (data.memory_verdict and len(data.memory_verdict["fits"]) > 1):
        figs["memory"] = _memory_figure(data)
    if data.training:
        figs["training"] = _training_figure(data)
    if data.plan is not None and any(c.measured for c in data.plan["candidates"]):
        figs["plan"] = _plan_figure(data)
    if data.speedups is not None and any(r.speedup is not None for r in data.speedups.rows):
        figs["speedups"] = data.speedups.plot()
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
    from keras_gpu_tools.runtime.figure import ShownFigure

    fig = ShownFigure(figsize=(width, height * rows), dpi=100, layout="constrained")
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


def _health_figure(data: ReportData, label: str) -> Figure:
    """A GPU's health per epoch: the share of time of each throttle reason, the SM clock against its maximum, power."""
    from matplotlib.ticker import MaxNLocator

    fig, (ax_t, ax_c, ax_p) = _new_figure(3, height=1.9)
    name = next((g["name"] for g in data.gpus if g.get("index") == label), "")
    fig.suptitle(f"GPU {label} health" + (f": {name}" if name else ""), fontsize=11)

    def plot(ax: Axes, field: str, style: str = "-", **kw) -> bool:
        ys = health.values(data, label, field)
        xs = [i + 1 for i, v in enumerate(ys) if v is not None]
        if xs:
            ax.plot(xs, [v for v in ys if v is not None], style, marker="o", markersize=3, label=field, **kw)
        return bool(xs)

    for field in health.THROTTLE_WORDS:
        if any(health.values(data, label, field)):  # a reason never active is left out of the legend
            plot(ax_t, field)
    ax_t.set_ylim(0, 105)
    ax_t.set_ylabel("% of the time")
    ax_t.set_title("throttle reasons active", fontsize=9, loc="left")
    for ax, fields, unit, title in (
        (ax_c, ("sm_clock_mhz", "sm_clock_max_mhz"), "MHz", "SM clock against its maximum"),
        (ax_p, ("power_watts", "power_limit_watts"), "W", "power against its limit"),
    ):
        shown = [plot(ax, f, "--" if i else "-", linewidth=1.0 if i else 1.4) for i, f in enumerate(fields)]
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=9, loc="left")
        if any(shown):
            _legend_right(ax)
    if ax_t.lines:
        _legend_right(ax_t)
    for ax in (ax_t, ax_c, ax_p):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_p.set_xlabel("epoch")
    return fig


# The host's CPU figures, each on an axis of its own: the process's is in % of one core (400% is four
# cores busy), the machine's in % of all its cores (at most 100%); one "%" axis would mix the two.
HOST_CPU_AXES = (
    (schema.HOST_CPU_PERCENT, "% of one core", "CPU of this process (100% = one core busy)"),
    (schema.HOST_SYSTEM_CPU_PERCENT, "% of all cores", "CPU of the whole machine (100% = every core busy)"),
)


def _host_figure(data: ReportData) -> Figure:
    shown = [(k, unit, title) for k, unit, title in HOST_CPU_AXES if (s := data.series.get(k)) and s.values]
    shown = shown or list(HOST_CPU_AXES[:1])  # an empty CPU axis says what was not recorded
    fig, axes = _new_figure(len(shown) + 1, height=2.0)
    ax_m = axes[-1]
    fig.suptitle("Host", fontsize=11)
    for ax_c, (key, unit, title) in zip(axes, shown):
        s = data.series.get(key)
        if s and s.values:
            ax_c.plot(_seconds(data, s), s.values, label=key.split("/")[1], linewidth=1.2)
            _legend_right(ax_c)
        if key == schema.HOST_SYSTEM_CPU_PERCENT:
            ax_c.set_ylim(0, 105)
        ax_c.set_ylabel(unit)
        ax_c.set_title(title, fontsize=9, loc="left")
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


def window_spans(data: ReportData) -> list[tuple[float, float]]:
    """The span of each window of the step-time split on its axis: (start, end), the window covering (start, end].

    On the step axis a window ending at step ``s_i`` covers ``(s_{i-1}, s_i]``; the first starts
    ``input/steps`` (its step count) before its end, or at step 0 where that is not known. A
    window whose count leaves at least half of itself uncovered after the one before starts where
    its count says: the steps between went unrecorded (a window with no figures is not written)
    and are left blank. A smaller difference is a step or two counted outside any window. On the
    epoch axis epoch ``e`` covers ``(e-1, e]``.
    """
    ends = [float(x) for x in data.split_x]
    if data.split_axis == "epoch":
        return [(e - 1.0, e) for e in ends]
    counts = data.split.get(schema.INPUT_STEPS) or [None] * len(ends)
    spans: list[tuple[float, float]] = []
    previous = 0.0
    for i, (end, count) in enumerate(zip(ends, counts)):
        start = end - count if count is not None and count > 0 else previous
        if i > 0 and start - previous < 0.5 * (end - start):
            start = previous
        spans.append((min(start, end), end))
        previous = end
    return spans


def _split_parts(data: ReportData) -> tuple[list[list[float]], list[bool]]:
    """Each part's ms per step by window (0 where unknown), and which windows had no part measured."""
    n = len(data.split_x)
    columns = [data.split.get(key) or [None] * n for key, _ in SPLIT_KEYS]
    unmeasured = [all(c[i] is None for c in columns) for i in range(n)]
    return [[v or 0.0 for v in c] for c in columns], unmeasured


def _split_figure(data: ReportData) -> Figure:
    """The split of each window stacked over the steps (or epochs) the window covered."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, (ax,) = _new_figure(1, height=3.0)
    spans = window_spans(data)
    parts, unmeasured = _split_parts(data)
    n = len(spans)
    if n > BARS_AT_MOST:
        top = _split_steps(ax, spans, parts, unmeasured)
    else:
        top = _split_bars(ax, spans, parts, unmeasured)
    if data.split_axis == "epoch":  # one bar per epoch, labelled at its middle
        ax.set_xticks([b - 0.5 for _, b in spans])
        ax.set_xticklabels([format_number(b) for _, b in spans], fontsize=8)
        if n > 20:
            for i, t in enumerate(ax.get_xticklabels()):
                t.set_visible(i % max(1, n // 10) == 0)
        ax.set_xlabel("epoch")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_number(x)))
        ax.set_xlabel("training step (each window over the steps it covered)")
    if spans and spans[0][0] < spans[-1][1]:
        ax.set_xlim(spans[0][0], spans[-1][1])
    missing = sum(unmeasured)
    title = "Step time: input wait, compute, other"
    if n > BARS_AT_MOST:
        title += f" ({n} windows" + (f", {missing} not measured: left blank)" if missing else ")")
    ax.set_ylabel("ms per step")
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_ylim(0, top * 1.25 or 1.0)
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    return fig


def _split_bars(ax: Axes, spans: list[tuple[float, float]], parts: list[list[float]], unmeasured: list[bool]) -> float:
    """A bar per window and part, as wide as the window; "n/a" where the window's split was not measured."""
    starts = [a for a, _ in spans]
    widths = [b - a for a, b in spans]
    bottom = [0.0] * len(spans)
    for (_, label), color, vals in zip(SPLIT_KEYS, SPLIT_COLORS, parts):
        ax.bar(starts, vals, width=widths, bottom=bottom, align="edge", label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for (a, b), missing in zip(spans, unmeasured):
        if missing:  # say so, do not draw 0
            ax.text((a + b) / 2, 0, "n/a", ha="center", va="bottom", fontsize=8, color="#777")
    return max(bottom + [0.0])


def _split_steps(ax: Axes, spans: list[tuple[float, float]], parts: list[list[float]], unmeasured: list[bool]) -> float:
    """Many windows: one filled outline per part (a bar per window is slow to draw), blank where not measured."""
    nan = float("nan")
    xs: list[float] = []
    keep: list[int] = []  # each vertex's window; -1: a break (a gap, or a window not measured)
    previous = None
    for i, (a, b) in enumerate(spans):
        if unmeasured[i] or (previous is not None and a > previous):
            xs.append(a)
            keep.append(-1)
        if not unmeasured[i]:
            xs += [a, b]
            keep += [i, i]
        previous = b
    bottom = [0.0] * len(xs)
    for (_, label), color, vals in zip(SPLIT_KEYS, SPLIT_COLORS, parts):
        top = [lo + (vals[i] if i >= 0 else nan) for lo, i in zip(bottom, keep)]
        ax.fill_between(xs, bottom, top, label=label, color=color, linewidth=0)
        bottom = top
    return max([t for t in bottom if t == t] + [0.0])


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


MEMORY_KEYS = (schema.MEMORY_HOST_RSS_MIB, schema.MEMORY_DEVICE_IN_USE_MIB, schema.MEMORY_DEVICE_RESERVED_MIB)


def _memory_figure(data: ReportData) -> Figure:
    """Memory at each epoch's end (MemoryLeakDetector's step: epochs of every fit, in order), and at each fit's end."""
    from matplotlib.ticker import MaxNLocator

    fits = data.memory_verdict["fits"] if data.memory_verdict else []
    fig, axes = _new_figure(2 if len(fits) > 1 else 1, height=2.2)
    for a in axes:  # epochs and fits are counted: no tick at epoch 1.5
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax = axes[0]
    for key in MEMORY_KEYS:
        s = data.memory_series.get(key)
        if s and s.values:
            ax.plot(s.steps, s.values, marker="o", markersize=3, linewidth=1.2, label=key.split("/", 1)[1])
    ax.set_ylabel("MiB")
    ax.set_xlabel("epoch (every fit's, in order)")
    ax.set_title("memory at each epoch's end", fontsize=9, loc="left")
    if ax.lines:
        _legend_right(ax)
    if len(fits) > 1:
        ax_f = axes[1]
        for field in ("host_rss_mib", "device_in_use_mib"):
            pts = [(f["fit"], f[field]) for f in fits if f.get(field) is not None]
            if pts:
                ax_f.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", markersize=3, label=field)
        ax_f.set_ylabel("MiB")
        ax_f.set_xlabel("fit() in this process")
        ax_f.set_title("memory at each fit's end", fontsize=9, loc="left")
        if ax_f.lines:
            _legend_right(ax_f)
    fig.suptitle("Memory over time", fontsize=11)
    return fig


def _training_figure(data: ReportData) -> Figure:
    from matplotlib.ticker import MaxNLocator

    from keras_gpu_tools.runtime.figure import ShownFigure

    names = sorted({k[4:] if k.startswith("val_") else k for k in data.training})
    names = [n for n in names if n != "learning_rate"] or names
    cols = min(len(names), 2)
    rows = -(-len(names) // cols)
    fig = ShownFigure(figsize=(8.0, 2.4 * rows + 0.3), dpi=100, layout="constrained")
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


def _plan_figure(data: ReportData) -> Figure:
    """The throughput plan's candidates: samples/s and peak memory against the batch (the plan's own figure)."""
    from keras_gpu_tools.memory import throughput_plot

    plan = data.plan or {}
    return throughput_plot.figure(plan["candidates"], plan["chosen"])
