"""One figure per span of steps: its input wait, its category and its name, worded alike in every view.

The input wait of a span is computed one way. A span measured from the step
hook's records (the detector's windows, a profiled window) is
:meth:`StepStats.measurement <keras_gpu_tools.input.timing.StepStats.measurement>`
over its records; a longer span (an epoch, the steady state, the fit) is the
time-weighted sum of its measured parts (:func:`~keras_gpu_tools.input.measure.aggregate`).
Its category is :func:`~keras_gpu_tools.input.categories.classify`, and every
view (the detector's lines and summary, ProfilerWindow's line, LiveView, the
report, TensorBoard's texts) words it with :meth:`SpanFigure.text`, naming the
span: ``"steps 21-25"``, ``"steady state, epochs 2-5"``.

Steps are named as Keras counts batches, from 1: the 21st to the 25th step of
the fit are ``"steps 21-25"`` (ProfilerWindow's ``start_step=20, num_steps=5``).
"""

from __future__ import annotations

import dataclasses

from keras_gpu_tools.input.categories import UNKNOWN, XPROF_HIGH, XPROF_MODERATE, classify
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.profiling.capture import steps_name
from keras_gpu_tools.runtime.units import format_percent

WHOLE_FIT = "the whole fit, warm-up included"  # nothing was left out: every view says so in these words


def steps_label(first: int, last: int) -> str:
    """``"steps 21-25"``: the ``first``-th to the ``last``-th step, counted from 1 (``"step 7"`` for one)."""
    return steps_name(first - 1, last - first + 1)


def span_name(scope: str, left_out: bool) -> str:
    """A verdict's span in words: ``"steady state, epochs 2-5"`` where leading phases were left out."""
    if not scope:
        return WHOLE_FIT
    return f"steady state, {scope}" if left_out and scope != WHOLE_FIT else scope


@dataclasses.dataclass
class SpanFigure:
    """The input wait of one named span and its category."""

    span: str  # "steps 21-25", "steady state, epochs 2-5"
    wait_fraction: float | None
    category: str
    steps: int = 0
    step_ms: float | None = None  # the step time the share is of
    thresholds: tuple[float, float] | None = None  # (moderate, high) it was classified by

    def text(self) -> str:
        """``"9.3% waiting for input (moderately input-bound), steps 21-25"``."""
        if self.wait_fraction is None or self.category == UNKNOWN:
            return f"input wait not measured, {self.span}"
        return f"{format_percent(self.wait_fraction)} waiting for input ({self.category}), {self.span}"

    def short(self) -> str:
        """``"9.3% (moderately input-bound)"``: the figure without its span (where the span is named beside it)."""
        if self.wait_fraction is None or self.category == UNKNOWN:
            return "not measured"
        return f"{format_percent(self.wait_fraction)} ({self.category})"


def span_figure(
    span: str, m: Measurement | None, moderate: float = XPROF_MODERATE, high: float = XPROF_HIGH
) -> SpanFigure:
    """The figure of ``span`` from its measurement, classified by the thresholds."""
    if m is None:
        return SpanFigure(span, None, classify(None, moderate, high), thresholds=(moderate, high))
    step_ms = None if m.step is None else 1e3 * m.step
    category = classify(m.wait_fraction, moderate, high)
    return SpanFigure(span, m.wait_fraction, category, m.steps, step_ms, (moderate, high))
