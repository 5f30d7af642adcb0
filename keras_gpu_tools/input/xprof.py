"""A profiled window's input wait as we measure it, beside xprof's conclusion on the same steps, and why they differ.

xprof's input-pipeline analyzer (``op_stats_to_input_pipeline_analysis.cc``)
counts as input, per traced step, the host's wait on the input ops
(``HOST_WAIT_INPUT``) plus host-to-device copies and the device waiting for
the host, whether or not compute hid them; its step is the span of the step
marker. It uses the same thresholds as we do (5%, 20%), and says
"POTENTIALLY input-bound" where input is under 5% but 3% or more of the step
is "All Others" (host time no op accounts for: Python, callbacks, I/O). We
count the part of the host's fetch of the batch that compute did not hide,
over the real interval between steps (callbacks included).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable

from keras_gpu_tools.input.categories import HIGH, MODERATE, NOT, UNKNOWN, classify
from keras_gpu_tools.input.span import SpanFigure
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling.capture import WindowCapture, write_input
from keras_gpu_tools.profiling.trace import TraceAnalysis
from keras_gpu_tools.runtime.units import format_percent

_CONCLUSION = re.compile(r"Your program is (\w+) input-bound because (?:only )?([\d.]+)%")
_WORDS = {"HIGHLY": HIGH, "MODERATELY": MODERATE, "NOT": NOT, "POTENTIALLY": NOT}

POTENTIALLY_REASON = (
    "xprof's POTENTIALLY is its 'All Others' time (host time no op explains: Python, callbacks, I/O), "
    "which it cannot tell from input; we time the batch's fetch itself."
)
SHORTER_STEP_REASON = (
    "xprof's step is the train function's call alone ({xprof_ms} ms), ours the time between steps "
    "({ours_ms} ms, callbacks included): the same wait is a larger share of its step."
)
LONGER_STEP_REASON = (
    "xprof's traced steps took {xprof_ms} ms, ours {ours_ms} ms (the profiler's own cost): "
    "the same wait is a smaller share of its step."
)
MORE_REASON = (
    "xprof counts every host wait on the input ops and host-to-device copies in a traced step as input, "
    "even where compute hid it; we count only the wait compute did not hide."
)
LESS_REASON = (
    "xprof counts only input time inside its step markers (input ops, host-to-device copies); "
    "we count the host's whole fetch of the batch, Python included, between steps."
)
THRESHOLD_REASON = (
    "by xprof's thresholds (5%, 20%) our {ours} is {category} too: the categories differ by the "
    "detector's thresholds ({moderate}, {high}), not by the measure."
)
STEP_RATIO = 1.25  # step times this far apart explain a different share on their own
GAP = 0.02  # input shares further apart than this are explained, even in one category


@dataclasses.dataclass
class XprofConclusion:
    """What xprof concluded on a window: its word, our category for it, its input share and its own figure."""

    word: str  # HIGHLY, MODERATELY, NOT, POTENTIALLY; "" where it concluded nothing
    category: str  # HIGH, MODERATE, NOT (POTENTIALLY: NOT, its input being under 5%), UNKNOWN
    input_fraction: float | None  # xprof's input share of the step time
    figure: float | None  # the share its sentence quotes ('All Others' for POTENTIALLY)
    step_ms: float | None = None  # xprof's mean step time


def read_conclusion(
    conclusion: str, input_percent: float | None = None, step_ms: float | None = None
) -> XprofConclusion:
    """xprof's conclusion sentence (its input share from the step rows and its mean step, where known) read back."""
    found = _CONCLUSION.search(conclusion or "")
    frac = None if input_percent is None else input_percent / 100.0
    if found is None or found.group(1) not in _WORDS:
        return XprofConclusion("", UNKNOWN, frac, None, step_ms)
    word, figure = found.group(1), float(found.group(2)) / 100.0
    if frac is None and word != "POTENTIALLY":  # its sentence quotes its input share
        frac = figure
    return XprofConclusion(word, _WORDS[word], frac, figure, step_ms)


def differs(ours: SpanFigure, x: XprofConclusion) -> bool:
    """Whether xprof says otherwise: another category (POTENTIALLY always), or a share over GAP apart."""
    if ours.category == UNKNOWN or not x.word:
        return False
    if x.word == "POTENTIALLY" or x.category != ours.category:
        return True
    return x.input_fraction is not None and ours.wait_fraction is not None and gap(ours, x) > GAP


def gap(ours: SpanFigure, x: XprofConclusion) -> float:
    """How far apart the two input shares are (0 where either is unknown)."""
    if x.input_fraction is None or ours.wait_fraction is None:
        return 0.0
    return abs(x.input_fraction - ours.wait_fraction)


def reason(ours: SpanFigure, x: XprofConclusion) -> str:
    """Why xprof concludes otherwise than we do for the same steps, in one sentence ("" where it does not).

    Its 'All Others' where it says POTENTIALLY of what we find not input-bound; else the step
    times where they are far enough apart to explain the different share on their own (xprof's
    step is the traced call, ours the time between steps); else what each counts as input.
    """
    if not differs(ours, x):
        return ""
    by_xprof = classify(ours.wait_fraction)
    other_category = x.word == "POTENTIALLY" or x.category != ours.category
    if other_category and x.word != "POTENTIALLY" and by_xprof == x.category and ours.thresholds is not None:
        moderate, high = (format_percent(t, 0) for t in ours.thresholds)
        figure = format_percent(ours.wait_fraction)
        return THRESHOLD_REASON.format(ours=figure, category=by_xprof, moderate=moderate, high=high)
    if x.word == "POTENTIALLY" and ours.category == NOT:
        return POTENTIALLY_REASON
    higher = x.input_fraction is not None and ours.wait_fraction is not None and x.input_fraction > ours.wait_fraction
    if x.word == "POTENTIALLY":
        higher = False  # its input is under 5%, ours above
    a, b = x.step_ms, ours.step_ms
    if a and b:
        ms = {"xprof_ms": f"{a:.2f}", "ours_ms": f"{b:.2f}"}
        if higher and b > STEP_RATIO * a:
            return SHORTER_STEP_REASON.format(**ms)
        if not higher and a > STEP_RATIO * b:
            return LONGER_STEP_REASON.format(**ms)
    return MORE_REASON if higher else LESS_REASON


def xprof_words(x: XprofConclusion) -> str:
    """``"MODERATELY input-bound, 9.8% input"`` (``"POTENTIALLY input-bound, 1.2% input, 38.0% 'All Others'"``)."""
    if not x.word:
        return "no conclusion"
    text = f"{x.word} input-bound"
    if x.input_fraction is not None:
        text += f", {format_percent(x.input_fraction)} input"
    if x.word == "POTENTIALLY" and x.figure is not None:
        text += f", {format_percent(x.figure)} 'All Others'"
    return text


def window_lines(ours: SpanFigure, x: XprofConclusion | None, conclusion: str = "") -> list[str]:
    """ProfilerWindow's lines for a window: our figure, xprof's (``x``: None without xprof) and why they differ.

    ``conclusion``: xprof's own words, quoted where it concluded nothing (its error).
    """
    head = f"ProfilerWindow: {ours.text()}, this window only"
    if x is None:
        return [head + "."]
    if not x.word:
        return [f"{head}; xprof gave no conclusion ({conclusion or 'no steps found'})."]
    if ours.category == UNKNOWN:
        return [f"{head}; xprof: {xprof_words(x)}."]
    if not differs(ours, x):
        return [f"{head}; xprof agrees: {xprof_words(x)}."]
    return [f"{head}; xprof: {xprof_words(x)}.", f"  xprof differs: {reason(ours, x)}"]


@dataclasses.dataclass
class WindowInput:
    """Our figure and xprof's for one profiled window, as the report reads them (``WindowCapture.input``)."""

    span: str
    wait_fraction: float | None
    category: str
    xprof: str = ""  # xprof's word and share ("" without xprof)
    reason: str = ""  # why xprof differs ("" where it does not)
    text: str = ""  # the window's lines, joined
    step_ms: float | None = None  # our step time, which the share is of


class WindowJoin:
    """Waits for both halves of a profiled window's report (our figure, xprof's analysis), then reports once.

    Our figure comes on the training thread when the window's last step record
    arrives; xprof's on its conversion thread. ``expect_xprof=False``: no
    analysis will come. ``report(lines, result)`` runs once, on the thread that
    completes the pair. ``steps_per_marker``: the steps of one of xprof's steps
    (a step marker is one call of the train function: N steps with
    ``steps_per_execution=N``), so that its step time compares per step.
    """

    def __init__(self, expect_xprof: bool, report: Callable[[list[str], WindowInput], None], steps_per_marker: int = 1):
        self._lock = threading.Lock()
        self._per_marker = max(int(steps_per_marker), 1)  # steps in one of xprof's steps (steps_per_execution)
        self._ours: SpanFigure | None = None
        self._xprof: tuple[str, float | None, float | None] | None = None if expect_xprof else ("", None, None)
        self._expect = expect_xprof
        self._report = report
        self.done = False

    def ours(self, fig: SpanFigure) -> None:
        with self._lock:
            self._ours = fig
        self._maybe_report()

    def xprof(self, analysis: TraceAnalysis) -> None:
        """xprof's analysis of the window (its conclusion, else its error)."""
        with self._lock:
            step_ms = analysis.step_time_ms
            per_step = step_ms / self._per_marker if step_ms is not None else None  # xprof's step: one call
            self._xprof = (analysis.conclusion or analysis.error, analysis.input_percent, per_step)
        self._maybe_report()

    def _maybe_report(self) -> None:
        with self._lock:
            if self.done or self._ours is None or self._xprof is None:
                return
            self.done = True
            ours, (conclusion, pct, step_ms) = self._ours, self._xprof
        x = read_conclusion(conclusion, pct, step_ms)
        lines = window_lines(ours, x if self._expect else None, conclusion)
        result = WindowInput(
            ours.span,
            ours.wait_fraction,
            ours.category,
            xprof=xprof_words(x) if self._expect else "",
            reason=reason(ours, x),
            text="\n".join(lines + ([f"xprof's own conclusion: {conclusion}"] if self._expect and x.word else [])),
            step_ms=ours.step_ms,
        )
        self._report(lines, result)


def report_input(
    capture: WindowCapture,
    lines: list[str],
    result: WindowInput,
    say: Callable[[str], None],
    writer: EventWriter | None,
) -> None:
    """A window's input wait beside xprof's: kept on ``capture``, said line by line, written for TensorBoard and the report."""
    capture.input = result
    for line in lines:
        say(line)
    write_input(writer, capture, result.text)
