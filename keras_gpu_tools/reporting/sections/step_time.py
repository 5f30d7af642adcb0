"""Step time: each epoch's (or window's) step split into input wait, compute and other; the run's throughput.

From `InputBoundDetector` (``epoch_history``, ``measurement``) or its run: the scalars ``input/*`` and
``throughput/*`` by window, and each epoch's figures in its epoch verdicts' JSON (``input/verdict/data``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting import drawing
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import img, table
from keras_gpu_tools.reporting.model import SPLIT_AND_STEP_KEYS, SPLIT_KEYS, ReportData
from keras_gpu_tools.reporting.section import BaseSection, TextSection
from keras_gpu_tools.reporting.sources import input_detector, name_of
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_metric, format_milliseconds, format_number

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

HEADING = "Step time"
SPLIT_COLORS = ("#d62728", "#1f77b4", "#bbbbbb")
BARS_AT_MOST = 60  # windows drawn as bars; more are drawn as stacked steps (a bar per window is slow to draw)


def epoch_figures(value: Any) -> dict[str, Any] | None:
    """The figures of an epoch's verdict record (``{"scope": "epoch 3", "figures": {...}}``); None for another."""
    if (
        isinstance(value, dict)
        and str(value.get("scope", "")).startswith("epoch ")
        and isinstance(value.get("figures"), dict)
    ):
        return value["figures"]
    return None


class StepTime(BaseSection):
    name = "step_time"
    every_record: tuple[str, ...] = (schema.INPUT_VERDICT_DATA,)  # each epoch's verdict holds that epoch's figures

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        det = input_detector(source)
        if det is None:
            return None
        history = list(det.epoch_history)
        if history:
            data.split_axis = "epoch"
            data.split_x = [float(i + 1) for i in range(len(history))]
            data.split = {k: [finite(h.get(k)) for h in history] for k, _ in SPLIT_AND_STEP_KEYS}
        if det.measurement is not None:
            data.throughput = dict(det.measurement.logs())
        return name_of(det)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        window_points: dict[int, dict[str, float]] = {}  # input/, throughput/ figures by step
        for _run, tag, points in logs.scalars():
            if tag.startswith((schema.INPUT_PREFIX, schema.THROUGHPUT_PREFIX)) and tag != schema.JOULES_PER_SAMPLE:
                for step, value in zip(points.steps, points.values):
                    window_points.setdefault(step, {})[tag] = value
        _split_of(data, window_points)
        epochs = [f for _, v in logs.every(schema.INPUT_VERDICT_DATA) if (f := epoch_figures(v)) is not None]
        if epochs:  # each epoch's own figures: a row per epoch, the rows of the fit's own report
            data.split_axis = "epoch"
            data.split_x = [float(i + 1) for i in range(len(epochs))]
            data.split = {k: [finite(e.get(k)) for e in epochs] for k, _ in SPLIT_AND_STEP_KEYS}

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.split_x:
            data.split_axis, data.split_x, data.split = other.split_axis, other.split_x, other.split
            data.throughput = data.throughput or other.throughput

    def text(self, data: ReportData) -> TextSection | None:
        body = []
        if data.split_x:
            body.append(
                f"{data.split_axis:>8s} " + " ".join(f"{label:>11s}" for _, label in SPLIT_KEYS) + f" {'step':>9s}"
            )
            for i, x in enumerate(data.split_x):
                vals = [data.split.get(k, [None] * len(data.split_x))[i] for k, _ in SPLIT_AND_STEP_KEYS]
                body.append(
                    f"{format_number(x):>8s} "
                    + " ".join(f"{format_milliseconds(v):>11s}" for v in vals[:3])
                    + f" {format_milliseconds(vals[3]):>9s}"
                )
        for k in (schema.SAMPLES_PER_SEC, schema.STEPS_PER_SEC, schema.MFU):
            if k in data.throughput:
                body.append(f"{k}: {format_metric(k, data.throughput[k])}")
        return (HEADING, body) if body else None

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if "step_time" not in pngs:
            return []
        parts = [f"<h3>{HEADING}</h3>", img(pngs, "step_time", "step time split into input wait, compute and other")]
        tp = [(k, format_metric(k, data.throughput[k])) for k in sorted(data.throughput)]
        if tp:
            parts.append(
                "<details><summary>Figures of the whole run</summary>" + table(["figure", "value"], tp) + "</details>"
            )
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        if data.split_x and any(v is not None for k, _ in SPLIT_KEYS for v in data.split.get(k, [])):
            return {"step_time": _split_figure(data)}
        return {}

    def not_measured(self, data: ReportData) -> list[str]:
        if not data.split_x and not data.verdict:
            return ["step time and the input-bound verdict (InputBoundDetector)"]
        return []


def _split_of(data: ReportData, window_points: dict[int, dict[str, float]]) -> None:
    """The step-time split by window (step axis), each window's step count, and the run's last figures.

    A window is one with a split or a step count (a window whose split was not measured is shown
    as such).
    """
    if not window_points:
        return
    steps = sorted(window_points)
    last = dict(window_points[steps[-1]])
    keys = [k for k, _ in SPLIT_AND_STEP_KEYS] + [schema.INPUT_STEPS]
    steps = [s for s in steps if any(window_points[s].get(k) is not None for k in keys)]
    data.split_axis = "step"
    data.split_x = [float(s) for s in steps]
    data.split = {k: [finite(window_points[s].get(k)) for s in steps] for k in keys}
    data.throughput = last


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

    fig, (ax,) = drawing.new_figure(1, height=3.0)
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


SECTION = StepTime()
