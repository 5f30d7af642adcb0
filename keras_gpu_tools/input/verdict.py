"""The verdict on a span: its category by xprof's thresholds, the phases left out, evidence and advice.

``wait_fraction`` of at least ``high`` (20%, as TensorBoard's input-pipeline
analyzer, xprof) is highly input-bound, at least ``moderate`` (5%)
moderately, else not. :class:`Judge` holds what one fit's verdicts share (the
thresholds, the pipeline, the host, the GPU logger whose figures are quoted).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Reversible, Sequence
from typing import Any

from keras_gpu_tools.input.advice import advise
from keras_gpu_tools.input.categories import HIGH, MODERATE, NOT, UNKNOWN, XPROF_HIGH, XPROF_MODERATE, classify
from keras_gpu_tools.input.later import Later
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.span import SpanFigure, span_name
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.roles import GPUTimeline
from keras_gpu_tools.runtime.units import format_percent
from keras_gpu_tools.runtime.validation import check_number


@dataclasses.dataclass
class Phase:
    """One epoch (or window) of a fit, as the verdict sees it."""

    label: str  # "epoch 1", "steps 1-100"
    steps: int
    wait_fraction: float | None
    step: float | None  # seconds per step
    steady: bool  # part of the verdict's scope
    reason: str | None = None  # why it was left out ("while the cache filled")


@dataclasses.dataclass
class Verdict:
    category: str  # HIGH, MODERATE, NOT or UNKNOWN
    wait_fraction: float | None
    message: str
    evidence: list[str] = dataclasses.field(default_factory=list)
    advice: list[str] = dataclasses.field(default_factory=list)
    scope: str = ""  # what the figures cover: "epochs 2-3", "epoch 1", "the whole fit"
    phases: list[Phase] = dataclasses.field(default_factory=list)  # every epoch (or window) of the fit
    speedup_bound: float | None = None  # 1 / (1 - wait_fraction): training without the wait, at best
    fit_wait_fraction: float | None = None  # the whole fit, left-out phases included

    @property
    def input_bound(self) -> bool:
        return self.category in (HIGH, MODERATE)

    @property
    def left_out(self) -> list[Phase]:
        return [p for p in self.phases if not p.steady]

    @property
    def span(self) -> str:
        """What the figures cover, in words: ``"steady state, epochs 2-5"``, ``"the whole fit"``, ``"steps 21-25"``."""
        return span_name(self.scope, bool(self.left_out))

    def figure(self) -> SpanFigure:
        """The verdict's input wait, category and span, as every view words them."""
        return SpanFigure(self.span, self.wait_fraction, self.category)

    def __str__(self) -> str:
        return self.message


def validate_thresholds(moderate, high) -> None:
    for name, value in (("moderate_threshold", moderate), ("high_threshold", high)):
        check_number(name, value, low=0, high=1, exclusive_low=True, exclusive_high=True, what="fraction of step time")
    if not moderate < high:
        raise ValueError(
            "Invalid value for arguments `moderate_threshold` and `high_threshold`. "
            f"Received: moderate_threshold={moderate!r}, high_threshold={high!r}. "
            "Expected moderate_threshold < high_threshold."
        )


def gpu_evidence(category: str, gpu_means: dict[str, float]) -> list[str]:
    """What a GPUUtilizationLogger's figures say about the verdict."""
    util = {k: v for k, v in gpu_means.items() if k.endswith("/utilization_percent")}
    sm = {k: v for k, v in gpu_means.items() if k.endswith("/sm_activity_percent")}
    if not util and not sm:
        return []
    figures = sm or util
    what = "SM activity" if sm else "GPU utilization"
    mean = sum(figures.values()) / len(figures)
    text = f"{what} {mean:.0f}%"
    if category == HIGH:
        if mean < 60:
            return [f"Confirmed by the GPU: {text} while steps wait for input."]
        return [
            f"The GPU reports {text}, higher than the wait suggests; NVML counts any kernel running, so the verdict stands on the step timing."
        ]
    if category == MODERATE:
        return [f"The GPU reports {text}."]
    if category == NOT and mean < 50:
        return [
            f"Input is not the limit, yet {text}: the GPU is idle for another reason (small kernels, Python or callback overhead, host-device copies)."
        ]
    if category == NOT:
        return [f"The GPU reports {text}."]
    return []


def host_evidence(host: dict[str, float]) -> list[str]:
    """A busy host that this process does not account for: the timings are slower than on an idle machine."""
    system, own = host.get("system_cpu_percent"), host.get("process_cpu_percent")
    if system is None or own is None or system < 90 or own > 0.6 * system:
        return []
    return [
        f"Other processes kept the host CPU busy ({system:.0f}% in all, {own:.0f}% for this one): "
        "steps are slower than on an idle machine."
    ]


def _phases_text(phases: Sequence[Phase]) -> str:
    """The phases left out, in words (``""`` if none).

    ``Left out: epoch 1, which waited 30.5% while the cache filled; since then 6.9-14.5% per epoch.``
    """
    out = [p for p in phases if not p.steady]
    if not out:
        return ""
    parts = [f"{p.label}, which waited {format_percent(p.wait_fraction)} {p.reason or ''}".rstrip() for p in out]
    kept = [p.wait_fraction for p in phases if p.steady and p.wait_fraction is not None]
    text = "Left out: " + "; ".join(parts)
    if kept:
        lo, hi = min(kept), max(kept)
        since = f"{100 * lo:.1f}%" if f"{100 * lo:.1f}" == f"{100 * hi:.1f}" else f"{100 * lo:.1f}-{100 * hi:.1f}%"
        text += f"; since then {since}" + (
            " per epoch" if phases[0].label.startswith("epoch") and len(kept) > 1 else ""
        )
    return text + "."


def worth_text(m: Measurement) -> str:
    """What removing the whole wait is worth: an upper bound on the speedup."""
    bound = m.speedup_bound
    if bound is None or m.step is None or m.wait is None:
        return ""
    return (
        f"Without the wait, training would be at most {bound:.2f}x faster "
        f"({1e3 * (m.step - m.wait):.2f} ms per step instead of {1e3 * m.step:.2f} ms)."
    )


def verdict_for(
    m: Measurement,
    moderate: float = XPROF_MODERATE,
    high: float = XPROF_HIGH,
    gpu_means: dict[str, float] | None = None,
    pipeline: dict[str, Any] | None = None,
    host: dict[str, float] | None = None,
    scope: str = "",
    phases: Sequence[Phase] = (),
    fit: Measurement | None = None,
    context: dict[str, Any] | None = None,
) -> Verdict:
    """The verdict on ``m``, the figures of ``scope``; ``phases`` are the fit's, ``fit`` its whole figures."""
    category = classify(m.wait_fraction, moderate, high)
    left_out = any(not p.steady for p in phases)
    if category == UNKNOWN:
        message = "Input-bound: unknown (no timed training step yet)."
    else:  # a known wait_fraction comes with the wait and the step it was computed from
        assert m.wait_fraction is not None and m.wait is not None and m.step is not None
        pct = 100.0 * m.wait_fraction
        word = {HIGH: "HIGHLY", MODERATE: "MODERATELY", NOT: "NOT"}[category]
        message = (
            f"Your program is {word} input-bound because {pct:.1f}% of the step time is spent waiting for input "
            f"(wait {1e3 * m.wait:.2f} ms, compute {1e3 * (m.compute or 0):.2f} ms, other {1e3 * (m.other or 0):.2f} ms "
            f"of a {1e3 * m.step:.2f} ms step)" + (f", over {span_name(scope, left_out)}." if scope else ".")
        )
        for extra in (_phases_text(phases), worth_text(m)):
            if extra:
                message += " " + extra
    evidence = gpu_evidence(category, gpu_means or {}) + host_evidence(host or {})
    ctx = dict(context or {})
    ctx.setdefault("scope", scope)
    advice = advise(category, m, pipeline or {}, host or {}, ctx)
    return Verdict(
        category,
        m.wait_fraction,
        message,
        evidence,
        advice,
        scope=scope,
        phases=list(phases),
        speedup_bound=m.speedup_bound,
        fit_wait_fraction=(fit or m).wait_fraction,
    )


def _points_since(timeline: Iterable[tuple[float, int, dict[str, float]]], since: float | None) -> list:
    """The points from wall time ``since`` on, oldest first, read back from the newest (not the whole timeline)."""
    if since is None or not isinstance(timeline, Reversible):
        return [p for p in list(timeline) if since is None or p[0] >= since]
    try:
        newest = list(itertools.takewhile(lambda p: p[0] >= since, reversed(timeline)))
    except RuntimeError:  # the sampling thread added a point meanwhile: a copy instead
        return [p for p in list(timeline) if p[0] >= since]
    return newest[::-1]


def gpu_means(logger: GPUTimeline | None, since: float | None) -> dict[str, float]:
    """The mean of each ``gpu/...`` figure of ``logger``'s points from wall time ``since`` on."""
    if logger is None:
        return {}
    try:
        points = _points_since(logger.timeline, since)
    except Exception:
        return {}
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for _wall, _step, means in points:
        for k, v in means.items():
            if k.startswith(schema.GPU_PREFIX):
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}


@dataclasses.dataclass
class Judge:
    """What the verdicts of one fit share: the thresholds, the pipeline, the host, the GPU logger quoted.

    ``context``: ``gpu`` (whether the model trains on a GPU; None: unknown),
    ``cores``, ``epochs`` (of the fit); see :func:`~keras_gpu_tools.input.advice.advise`.
    ``host`` holds the host CPU figures of the last epoch.
    """

    moderate: float
    high: float
    pipeline: dict[str, Any]
    context: dict[str, Any]
    gpu_logger: GPUTimeline | None = None
    host: dict[str, float] = dataclasses.field(default_factory=dict)

    def __call__(
        self,
        m: Measurement,
        since: float | None,
        scope: str = "",
        phases: Sequence[Phase] = (),
        fit: Measurement | None = None,
        cache_serves: bool = False,
        with_advice: bool = True,
        quote_gpu: bool = True,
    ) -> Verdict:
        """The verdict on ``m``, the figures of ``scope`` (GPU figures quoted from wall time ``since`` on).

        ``quote_gpu=False`` leaves the GPU's figures out of the evidence (they are
        read from every point since ``since``); the category and advice stay the same.
        """
        return self.later(m, since, scope, phases, fit, cache_serves, with_advice, quote_gpu)()

    def later(
        self,
        m: Measurement,
        since: float | None,
        scope: str = "",
        phases: Sequence[Phase] = (),
        fit: Measurement | None = None,
        cache_serves: bool = False,
        with_advice: bool = True,
        quote_gpu: bool = True,
    ) -> Later[Verdict]:
        """The verdict of ``self(...)`` with the same arguments, made when first read (``input/later.py``).

        What changes with time is read now: the GPU logger's points since ``since`` and the host's
        figures (``host`` is replaced at each epoch end, never changed); the rest is ``m`` and the
        fit's settings.
        """
        gpu = gpu_means(self.gpu_logger, since) if quote_gpu else {}
        pipeline, host = (self.pipeline, self.host) if with_advice else ({"kind": "none"}, {})
        context = dict(self.context, cache_serves=cache_serves)
        return Later(lambda: verdict_for(m, self.moderate, self.high, gpu, pipeline, host, scope, phases, fit, context))
