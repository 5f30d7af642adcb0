"""The steady state of a fit: its windows and epochs, and the leading ones left out of the verdict.

Warm-up, compilation, a cache that fills or workers that start make the first
epochs slower than the rest; they are phases of the run, not its character.
Leading parts whose step time is more than ``SLOWER`` above the median of the
parts after them, and whose wait share differs from theirs by ``DIFFERENT``
or more (or whose steps take over twice as long), are left out of the verdict
and named with the reason (:func:`warmup_reason`). Epochs are the phases; a
fit of one epoch is split into its windows.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.input.measure import Measurement, Sums
from keras_gpu_tools.input.span import WHOLE_FIT
from keras_gpu_tools.input.verdict import Phase

# A leading epoch (or window) whose step time is this much above the median of
# the ones after it, and whose wait share differs from theirs by DIFFERENT (or
# whose steps take more than twice as long), is a warm-up phase: above the
# epoch-to-epoch noise of a busy host (up to 60% and 8 points on millisecond
# steps), below what a filling cache or a compilation costs (2x and more).
SLOWER = 0.5
DIFFERENT = 0.10
# ...and is slower by at least this much per step: below a millisecond a busy
# host's scheduling alone moves a 10-step epoch by as much (twice or half
# the step time, same pipeline), while warm-up costs tens of milliseconds.
AT_LEAST = 0.001


def steady_start(parts: Sequence[Measurement], slower: float = SLOWER, different: float = DIFFERENT) -> int:
    """Index of the first part of the steady state: leading parts markedly unlike the rest are warm-up.

    Part ``k`` is left out while its step time is more than ``slower`` above the
    median step time of the parts after it and its wait share differs from
    theirs (time-weighted) by ``different`` or more, or its step time is over
    twice that median; either way by at least ``AT_LEAST`` seconds per step.
    The last part is always kept.
    """
    return _steady_start(parts, lambda j: Suffix(parts[j:]), slower, different)


class Suffix:
    """The parts from some index on: their sums and their step times, sorted; one more part in O(log n)."""

    __slots__ = ("sums", "steps")

    def __init__(self, parts: Sequence[Measurement] = ()) -> None:
        self.sums, self.steps = Sums(), list[float]()
        for p in parts:
            self.add(p)

    def add(self, p: Measurement) -> None:
        self.sums.add(p)
        if p.step:
            bisect.insort(self.steps, p.step)

    def median(self) -> float:
        """The median step time (as :func:`statistics.median`); there must be one."""
        n, s = len(self.steps), self.steps
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _steady_start(
    parts: Sequence[Measurement], suffix: Callable[[int], Suffix], slower: float = SLOWER, different: float = DIFFERENT
) -> int:
    """:func:`steady_start`, with ``suffix(j)`` giving the parts from ``j`` on (kept or built)."""
    k = 0
    while k < len(parts) - 1:
        part, rest = parts[k], suffix(k + 1)
        if not rest.steps or not part.step:
            break
        median = rest.median()
        if part.step - median < AT_LEAST:
            break
        ratio = part.step / median
        after = rest.sums.measurement().wait_fraction
        unlike = part.wait_fraction is None or after is None or abs(part.wait_fraction - after) >= different
        if not (ratio > 2.0 or (ratio > 1.0 + slower and unlike)):
            break
        k += 1
    return k


def warmup_reason(index: int, is_epoch: bool, pipeline: dict[str, Any] | None) -> str:
    """Why leading part ``index`` (0-based) was slower than the steady state, as far as the pipeline tells."""
    pipeline = pipeline or {}
    kind = pipeline.get("kind")
    if is_epoch and index == 0:
        if kind == "tf.data" and pipeline.get("cache"):
            return "while the cache filled"
        if (kind == "PyDataset" and (pipeline.get("workers") or 1) > 1) or (
            kind == "torch DataLoader" and pipeline.get("num_workers")
        ):
            return "while the workers started"
        return "during warm-up (tracing, the input pipeline starting)"
    return "during warm-up (slower than the steps after it)"


def span_label(labels: Sequence[str]) -> str:
    """``"epochs 2-3"`` from ``["epoch 2", "epoch 3"]``; ``"steps 1-300"`` from windows."""
    if not labels:
        return ""
    if len(labels) == 1:
        return labels[0]
    first, last = labels[0], labels[-1]
    if first.startswith("epoch ") and last.startswith("epoch "):
        return f"epochs {first.split()[1]}-{last.split()[1]}"
    if first.startswith("steps ") and last.startswith("steps "):
        return f"steps {first.split()[1].split('-')[0]}-{last.split()[1].split('-')[-1]}"
    return f"{first} to {last}"


class Span:
    """An epoch (or a window) of the fit: its figures, when it began, and the windows it is made of."""

    __slots__ = ("label", "measurement", "t0", "parts")

    def __init__(self, label: str, measurement: Measurement, t0: float, parts: list[Span] | None = None):
        self.label, self.measurement, self.t0, self.parts = label, measurement, t0, parts or []


@dataclasses.dataclass
class SteadyState:
    """The run's verdict scope: its figures, the whole fit's, every phase and whether it is in."""

    measurement: Measurement  # the steady state's figures
    fit: Measurement  # the whole fit's, every phase included
    phases: list[Phase]
    scope: str  # "epochs 2-3", "steps 101-300", "the whole fit"
    since: float  # wall time the steady state began
    cache_serves: bool  # it reads a `.cache()` that a left-out epoch filled


Aggregate = Callable[[Sequence[Measurement]], Measurement]
Figures = Callable[[Sums], Measurement]


class FitSpans:
    """The windows and epochs of one fit(): only windows are measured; an epoch is made of its windows.

    The epochs' figures are also kept as running sums from each index the
    steady-state search has looked at (:class:`Suffix`), so an epoch end costs
    the same at epoch 3,000 as at epoch 10: nothing rescans the past epochs.
    An epoch keeps its windows only until the next one ends (what is kept per
    epoch is its figures, however many windows it had).
    """

    def __init__(self) -> None:
        self.windows: list[Span] = []  # the current epoch's
        self.epochs: list[Span] = []
        self._figures: list[Measurement] = []  # each epoch's
        self._suffixes: dict[int, Suffix] = {0: Suffix()}  # the epochs from index j on

    def add_window(self, label: str, m: Measurement, t0: float) -> None:
        self.windows.append(Span(label, m, t0))

    def end_epoch(self, label: str, t0: float, agg: Aggregate) -> Measurement:
        """Closes the epoch of the windows so far; its figures."""
        m = agg([w.measurement for w in self.windows])
        if self.epochs:  # only the last epoch's windows are read again (its FLOP rates, a fit of one epoch)
            self.epochs[-1].parts = []
        self.epochs.append(Span(label, m, t0, self.windows))
        self._figures.append(m)
        for suffix in self._suffixes.values():
            suffix.add(m)
        self.windows = []
        return m

    def remeasure_last_epoch(self, agg: Aggregate) -> Measurement:
        """The last epoch's figures again from its windows (after the FLOP figures changed).

        Only the FLOP rates change, which the running sums do not hold.
        """
        last = self.epochs[-1]
        last.measurement = self._figures[-1] = agg([w.measurement for w in last.parts])
        return last.measurement

    def _suffix(self, j: int) -> Suffix:
        """The epochs from index ``j`` on, kept from now on (built once, then one epoch at a time)."""
        if j not in self._suffixes:
            self._suffixes[j] = Suffix(self._figures[j:])
        return self._suffixes[j]

    def steady_state(
        self, figures: Figures, pipeline: dict[str, Any], final: bool = False, with_phases: bool = True
    ) -> SteadyState | None:
        """The steady state of the epochs so far (``final``: with the windows of an epoch cut short); None before any.

        ``figures`` turns running sums into a span's figures (with the fit's FLOP
        rates). ``with_phases=False`` leaves ``phases`` empty: without the list of
        every epoch, the steady state of the kept sums costs the same at every epoch.
        """
        spans, units, by_epoch = self.epochs, self.epochs, True
        if final and self.windows:  # fit() ended inside an epoch: its windows so far
            m = figures(Sums(w.measurement for w in self.windows))
            spans = spans + [Span(f"epoch {len(spans) + 1} (part)", m, self.windows[0].t0, list(self.windows))]
            units = spans
        if not spans:
            return None
        if len(spans) == 1 and len(spans[0].parts) > 1:  # a fit of one epoch: its windows
            units, by_epoch = spans[0].parts, False
        if units is self.epochs:  # kept sums: nothing here scans the past epochs
            k = _steady_start(self._figures, self._suffix)
            steady, whole = self._suffix(k).sums, self._suffix(0).sums
        else:  # once, at the end of a fit, or over one epoch's windows
            parts = [u.measurement for u in units]
            k = steady_start(parts)
            steady, whole = Sums(parts[k:]), Sums(s.measurement for s in spans)
        return SteadyState(
            measurement=figures(steady),
            fit=figures(whole),
            phases=[
                Phase(
                    u.label,
                    u.measurement.steps,
                    u.measurement.wait_fraction,
                    u.measurement.step,
                    steady=i >= k,
                    reason=None if i >= k else warmup_reason(i, by_epoch, pipeline),
                )
                for i, u in enumerate(units)
            ]
            if with_phases
            else [],
            scope=span_label([u.label for u in (units[k], units[-1])][: len(units) - k]) if k else WHOLE_FIT,
            since=units[k].t0,
            cache_serves=by_epoch and k > 0,
        )
