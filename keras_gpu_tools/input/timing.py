"""Step timing: from per-call records to wait/compute fractions, verdicts, advice.

Nothing here knows about Keras or a framework; the step hook
(:mod:`keras_gpu_tools.runtime.step_hook`) produces :class:`StepRecord` objects
and the callback turns :class:`StepStats` into logs and a report.

How a step's time is split (per training step, in seconds):

- ``fetch``: host time blocked fetching the batch (``next()`` on the input
  iterator). Measured on every step where the fetch happens in Python (JAX,
  torch) and on sampled steps on TensorFlow.
- ``compute``: from the start of the step (after the fetch) until the device
  has finished it. Needs a device sync, so it is measured on sampled steps
  only; the lower quartile of the samples is used (the fastest of fewer than
  five): what slows a sample (warm-up, compilation, a busy host) only adds
  time, so the low end is the device's own step time. It is at most the real
  step less its wait, so ``wait + compute + other = step``.
  On JAX on a GPU it starts when the call returns (the single executable is
  launched then); the host time before it is ``dispatch``.
- ``other``: the rest between two steps (callbacks, Python, dispatch), on
  sampled steps.
- ``step``: the real step time. Unsampled steps are never synced, so the
  mean interval between their starts is the true rate, overlap included. The
  serialized sum ``fetch + compute + other`` is used where that is smaller or
  unknown (all steps sampled, or an interval was slowed by a recompilation).

The wait that costs time is the part of the fetch the device could not hide
behind compute: ``wait = min(fetch, max(0, step - compute))``. Where input and
compute run one after the other (CPU, or a GPU pipeline without overlap) this is
the whole fetch; where the framework overlaps the next fetch with the current
step on the GPU, only the excess shows. ``wait_fraction = wait / step``.

How figures of a longer span are made (:func:`aggregate`): only the smallest
spans (the detector's windows) are measured from step records; an epoch, the
steady state and the whole fit are sums of their parts, time-weighted over
the steps the parts cover. A part of ``n`` steps counts ``n * step`` seconds:
``wait_fraction = sum(n * wait) / sum(n * step)``, a per-step time is
``sum(n * x) / sum(n)``, a rate is ``sum(count) / sum(seconds)``. A part
where a figure is unknown is left out of that figure. So the epoch figures,
weighted by their steps (``input/steps``), add up to the whole fit's.

The steady state (:func:`steady_start`): warm-up, compilation, a cache that
fills or workers that start make the first epochs slower than the rest; they
are phases of the run, not its character. Leading parts whose step time is
more than ``SLOWER`` above the median of the parts after them, and whose wait
share differs from theirs by ``DIFFERENT`` or more (or whose steps take over
twice as long), are left out of the verdict and named with the reason
(:func:`warmup_reason`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.units import format_ms
from keras_gpu_tools.runtime.validation import check_number

HIGH = "highly input-bound"
MODERATE = "moderately input-bound"
NOT = "not input-bound"
UNKNOWN = "unknown"

# TensorBoard's input-pipeline analyzer (xprof): >= 20 % HIGHLY, >= 5 % MODERATELY.
XPROF_HIGH = 0.20
XPROF_MODERATE = 0.05

# A leading epoch (or window) whose step time is this much above the median of
# the ones after it, and whose wait share differs from theirs by DIFFERENT (or
# whose steps take more than twice as long), is a warm-up phase: above the
# epoch-to-epoch noise of a busy host (up to 60% and 8 points on millisecond
# steps), below what a filling cache or a compilation costs (2x and more).
SLOWER = 0.5
DIFFERENT = 0.10
# ...and is slower by at least this much per step: below a millisecond a busy
# host's scheduling alone moves a 10-step epoch by as much (seen in CI: 1.12 ms
# then 0.59 ms, same pipeline), while warm-up costs tens of milliseconds.
AT_LEAST = 0.001


@dataclasses.dataclass
class Measurement:
    """Per-step figures over a window or an epoch (times in seconds)."""

    steps: int = 0
    sampled_steps: int = 0
    fetch: float | None = None
    compute: float | None = None
    other: float | None = None
    step: float | None = None
    wait: float | None = None
    wait_fraction: float | None = None
    steps_per_sec: float | None = None
    samples_per_sec: float | None = None
    flops_per_sec: float | None = None  # the step's, over every device that runs it
    flops_per_sec_per_device: float | None = None
    mfu: float | None = None
    overlapped: bool = False  # the real step was shorter than the serialized one

    @property
    def speedup_bound(self) -> float | None:
        """How much faster training would be without the wait: ``1 / (1 - wait_fraction)``, an upper bound."""
        if self.wait_fraction is None or self.wait_fraction >= 1.0:
            return None
        return 1.0 / (1.0 - self.wait_fraction)

    def logs(self) -> dict[str, float]:
        """The logged keys (units in the names); unknown figures are left out."""
        out: dict[str, float] = {}

        def put(key, value, scale=1.0):
            if value is not None and math.isfinite(value):
                out[key] = float(value) * scale

        if self.steps:
            put(schema.INPUT_STEPS, self.steps)
        put(schema.INPUT_WAIT_FRACTION, self.wait_fraction)
        put(schema.INPUT_WAIT_MS, self.wait, 1e3)
        put(schema.INPUT_FETCH_MS, self.fetch, 1e3)
        put(schema.INPUT_COMPUTE_MS, self.compute, 1e3)
        put(schema.INPUT_OTHER_MS, self.other, 1e3)
        put(schema.INPUT_STEP_MS, self.step, 1e3)
        put(schema.STEPS_PER_SEC, self.steps_per_sec)
        put(schema.SAMPLES_PER_SEC, self.samples_per_sec)
        put(schema.FLOPS_PER_SEC, self.flops_per_sec)
        put(schema.FLOPS_PER_SEC_PER_DEVICE, self.flops_per_sec_per_device)
        put(schema.MFU, self.mfu)
        return out


def _low_compute(samples: list[float]) -> float:
    """The device's step time from synced samples: the lower quartile, the fastest of a few."""
    if len(samples) < 5:
        return min(samples)
    return statistics.quantiles(samples, n=4)[0]


class StepStats:
    """Accumulates :class:`StepRecord` objects into a :class:`Measurement`."""

    def __init__(self):
        self.steps = 0  # every step seen, warm-up included
        self.first_step: int | None = None
        self._fetch_sum = 0.0
        self._fetch_steps = 0
        self._synced_fetch_sum = 0.0  # fetches right after a sync: used only where no other was timed
        self._synced_fetch_steps = 0
        self._computes: list[float] = []  # per step, sampled calls
        self._gap_sum = 0.0
        self._gap_steps = 0
        self._interval_sum = 0.0  # unsampled calls: the real rate
        self._interval_steps = 0
        self._span_sum = 0.0  # every non-warm-up call with a known interval
        self._span_steps = 0
        self._span_samples = 0
        self._span_unknown_steps = 0  # steps whose batch size was not seen
        self._known_samples = 0  # samples and steps of calls that saw their batches
        self._known_steps = 0

    @property
    def sampled_steps(self) -> int:
        return len(self._computes)

    def add(self, r: StepRecord) -> None:
        n = max(int(r.steps), 1)
        extra = max(int(r.covers), 0)  # fast calls inside this record's interval
        self.steps += n + extra
        if r.samples is not None:
            self._known_samples += r.samples
            self._known_steps += n
        if r.covered_fetch_steps:  # covered calls timed apart (never right after a sync): not warm-up
            self._fetch_sum += r.covered_fetch
            self._fetch_steps += r.covered_fetch_steps
        if r.warmup:
            return
        if r.fetch is not None and r.after_sync:
            self._synced_fetch_sum += r.fetch
            self._synced_fetch_steps += n
        elif r.fetch is not None:
            self._fetch_sum += r.fetch
            self._fetch_steps += n
        if r.sampled and r.compute is not None:
            self._computes.append(r.compute / n)
            if r.gap is not None:
                self._gap_sum += max(r.gap, 0.0) + (r.dispatch or 0.0)
                self._gap_steps += n
        if r.interval is not None:
            self._span_sum += r.interval
            self._span_steps += n + extra
            self._span_unknown_steps += extra
            if r.samples is None:
                self._span_unknown_steps += n
            else:
                self._span_samples += r.samples
            if not r.sampled:
                self._interval_sum += r.interval
                self._interval_steps += n + extra

    def measurement(
        self, flops_per_step: float | None = None, peak_flops: float | None = None, devices: int = 1
    ) -> Measurement:
        """The window's figures; FLOP arguments as in :func:`set_flops`."""
        m = Measurement(steps=self.steps, sampled_steps=self.sampled_steps)
        if self._fetch_steps:
            m.fetch = self._fetch_sum / self._fetch_steps
        elif self._synced_fetch_steps:  # TensorFlow times fetches on synced calls only
            m.fetch = self._synced_fetch_sum / self._synced_fetch_steps
        if self._computes:
            m.compute = _low_compute(self._computes)
        if self._gap_steps:
            m.other = self._gap_sum / self._gap_steps
        real = self._interval_sum / self._interval_steps if self._interval_steps else None
        serial = None
        if m.fetch is not None and m.compute is not None:
            serial = m.fetch + m.compute + (m.other or 0.0)
        if serial is not None and real is not None:
            m.step = min(serial, real)
            m.overlapped = real < serial * 0.98
        else:
            m.step = serial if serial is not None else real
        if m.step and m.fetch is not None:
            if m.compute is not None:
                m.wait = min(m.fetch, max(0.0, m.step - m.compute))
                # A synced step can outlast an unsynced one (the sync ends the overlap of
                # dispatch and compute): the split describes the real step, so its parts add up.
                m.compute = min(m.compute, m.step - m.wait)
                m.other = max(0.0, m.step - m.wait - m.compute)
            else:  # no sampled step yet: assume input and compute do not overlap
                m.wait = min(m.fetch, m.step)
            m.wait_fraction = min(max(m.wait / m.step, 0.0), 1.0)
        if self._span_steps and self._span_sum > 0:
            m.steps_per_sec = self._span_steps / self._span_sum
            samples = self._span_samples
            if self._span_unknown_steps:  # TensorFlow sees batches on sampled steps only
                samples = (
                    samples + self._span_unknown_steps * self._known_samples / self._known_steps
                    if self._known_steps
                    else None
                )
            if samples:
                m.samples_per_sec = samples / self._span_sum
        set_flops(m, flops_per_step, peak_flops, devices)
        return m


def set_flops(m: Measurement, flops_per_step: float | None, peak_flops: float | None, devices: int = 1) -> None:
    """FLOP/s and MFU of ``m`` from its step rate.

    ``flops_per_step`` is the whole step's work, every device's together (XLA's
    cost analysis of the global, un-partitioned step); ``peak_flops`` the sum
    of the peaks of the ``devices`` that run it. So a step spread over two
    GPUs reads the MFU of one GPU doing half the work, not twice it.
    """
    if flops_per_step and m.steps_per_sec:
        m.flops_per_sec = flops_per_step * m.steps_per_sec
        m.flops_per_sec_per_device = m.flops_per_sec / max(int(devices), 1)
        m.mfu = m.flops_per_sec / peak_flops if peak_flops else None


# -- spans of several parts: one aggregation for epochs, the steady state, the fit --------------
def aggregate(
    parts: Sequence[Measurement],
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    devices: int = 1,
) -> Measurement:
    """The figures of the span made of ``parts``, time-weighted over the steps each covers.

    A part of ``n`` steps weighs ``n * step`` seconds: per-step times are
    ``sum(n * x) / sum(n)``, ``wait_fraction`` is ``sum(n * wait) / sum(n * step)``
    and rates are counts over seconds (``sum(n) / sum(n / steps_per_sec)``). A
    part where a figure is unknown is left out of that figure, never counted as 0.
    """
    m = Measurement(steps=sum(p.steps for p in parts), sampled_steps=sum(p.sampled_steps for p in parts))

    def mean(attr: str) -> float | None:
        known = [(p.steps, getattr(p, attr)) for p in parts if p.steps and getattr(p, attr) is not None]
        n = sum(k for k, _ in known)
        return sum(k * x for k, x in known) / n if n else None

    m.fetch, m.compute, m.other, m.step = mean("fetch"), mean("compute"), mean("other"), mean("step")
    timed = [p for p in parts if p.steps and p.wait is not None and p.step]
    if timed:
        n = sum(p.steps for p in timed)
        waited = sum(p.steps * p.wait for p in timed)
        m.wait = waited / n
        m.wait_fraction = min(max(waited / sum(p.steps * p.step for p in timed), 0.0), 1.0)
    rated = [p for p in parts if p.steps and p.steps_per_sec]
    if rated:
        seconds = sum(p.steps / p.steps_per_sec for p in rated)
        m.steps_per_sec = sum(p.steps for p in rated) / seconds
        with_samples = [p for p in rated if p.samples_per_sec is not None]
        if with_samples:
            m.samples_per_sec = sum(p.samples_per_sec * p.steps / p.steps_per_sec for p in with_samples) / sum(
                p.steps / p.steps_per_sec for p in with_samples
            )
    set_flops(m, flops_per_step, peak_flops, devices)
    m.overlapped = any(p.overlapped for p in parts)
    return m


@dataclasses.dataclass
class Phase:
    """One epoch (or window) of a fit, as the verdict sees it."""

    label: str  # "epoch 1", "steps 1-100"
    steps: int
    wait_fraction: float | None
    step: float | None  # seconds per step
    steady: bool  # part of the verdict's scope
    reason: str | None = None  # why it was left out ("while the cache filled")


def steady_start(parts: Sequence[Measurement], slower: float = SLOWER, different: float = DIFFERENT) -> int:
    """Index of the first part of the steady state: leading parts markedly unlike the rest are warm-up.

    Part ``k`` is left out while its step time is more than ``slower`` above the
    median step time of the parts after it and its wait share differs from
    theirs (time-weighted) by ``different`` or more, or its step time is over
    twice that median; either way by at least ``AT_LEAST`` seconds per step.
    The last part is always kept.
    """
    k = 0
    while k < len(parts) - 1:
        part, rest = parts[k], parts[k + 1 :]
        steps = [p.step for p in rest if p.step]
        if not steps or not part.step:
            break
        median = statistics.median(steps)
        if part.step - median < AT_LEAST:
            break
        ratio = part.step / median
        after = aggregate(rest).wait_fraction
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


# -- verdicts ---------------------------------------------------------------------
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


def classify(wait_fraction: float | None, moderate: float = XPROF_MODERATE, high: float = XPROF_HIGH) -> str:
    if wait_fraction is None:
        return UNKNOWN
    if wait_fraction >= high:
        return HIGH
    if wait_fraction >= moderate:
        return MODERATE
    return NOT


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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _phases_text(phases: Sequence[Phase]) -> str:
    """The phases left out, in words (``""`` if none).

    ``Left out: epoch 1, which waited 30.5% while the cache filled; since then 6.9-14.5% per epoch.``
    """
    out = [p for p in phases if not p.steady]
    if not out:
        return ""
    parts = [f"{p.label}, which waited {_pct(p.wait_fraction)} {p.reason or ''}".rstrip() for p in out]
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
    if category == UNKNOWN:
        message = "Input-bound: unknown (no timed training step yet)."
    else:
        pct = 100.0 * m.wait_fraction
        word = {HIGH: "HIGHLY", MODERATE: "MODERATELY", NOT: "NOT"}[category]
        message = (
            f"Your program is {word} input-bound because {pct:.1f}% of the step time is spent waiting for input "
            f"(wait {1e3 * m.wait:.2f} ms, compute {1e3 * (m.compute or 0):.2f} ms, other {1e3 * (m.other or 0):.2f} ms "
            f"of a {1e3 * m.step:.2f} ms step)" + (f", over {scope}." if scope else ".")
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


# -- advice ------------------------------------------------------------------------
def _saves(m: Measurement, seconds: float | None) -> str:
    """What saving ``seconds`` a step is worth: ``up to 4.1 ms of the 12.0 ms wait per step (at most 1.25x faster)``."""
    if seconds is None or m.wait is None or not m.step:
        return "part of the wait"
    seconds = min(max(seconds, 0.0), m.wait)
    bound = m.step / (m.step - seconds) if seconds < m.step else None
    text = f"up to {format_ms(seconds, 1)} of the {format_ms(m.wait, 1)} wait per step"
    return text + (f" (at most {bound:.2f}x faster)" if bound else "")


WORKER_HEADROOM = 1.25  # loads vary: workers that only just keep up leave steps waiting half the time


def workers_needed(current: int, m: Measurement, cores: int) -> int:
    """Workers that load a batch per step: ``1.25 * current * step / compute``, at least one more than now.

    With ``current`` workers (0: loading in the training loop) a batch arrives
    every ``step``; each worker takes about ``current * step`` per batch, so
    ``current * step / compute`` of them keep up with the device, and a
    quarter more absorb uneven loads. Capped at 32.
    """
    now = max(int(current or 0), 1)
    if m.step and m.compute:
        need = math.ceil(WORKER_HEADROOM * now * m.step / m.compute - 1e-9)
    else:
        need = max(cores, now + 1)
    return int(min(max(need, int(current or 0) + 1, 2), 32))


def advise(
    category: str,
    m: Measurement,
    pipeline: dict[str, Any],
    host: dict[str, float],
    context: dict[str, Any] | None = None,
) -> list[str]:
    """Short, specific changes for what was measured (empty unless input-bound).

    Each tip names the part of the measured wait it addresses. ``context``:
    ``gpu`` (whether the model trains on a GPU; None: unknown), ``epochs``
    (of the fit), ``cache_serves`` (the measured span reads a `.cache()` that
    an earlier epoch filled), ``scope`` (what the figures cover), ``cores``.
    """
    if category not in (HIGH, MODERATE):
        return []
    ctx = context or {}
    gpu = ctx.get("gpu")
    epochs = ctx.get("epochs")
    cores = int(ctx.get("cores") or host.get("cpu_count") or 1)
    scope = ctx.get("scope") or "the measured steps"
    tips: list[str] = []
    own = host.get("process_cpu_percent")
    if own is not None and own >= 85:
        where = "the model's compute and the input pipeline share these cores" if gpu is False else "preprocessing"
        tips.append(
            f"The host CPU is the limit: this process kept {own:.0f}% of the {cores} cores busy ({where}), so more "
            "workers or parallel calls will not help. Do less work per batch: cache decoded data, store inputs "
            "pre-processed"
            + ("" if gpu is False else ", or move augmentation into the model (it runs on the GPU)")
            + f". Addresses all of the {format_ms(m.wait, 1)} wait per step."
        )
    kind = pipeline.get("kind", "unknown")
    if kind == "tf.data":
        tips += _advise_tf_data(m, pipeline, gpu, epochs, cores, scope, bool(ctx.get("cache_serves")))
    elif kind == "PyDataset":
        workers = pipeline.get("workers")
        mp = pipeline.get("use_multiprocessing")
        n = workers_needed(workers or 1, m, cores)
        tip = (
            f"Raise `workers` to {n} (now workers={workers}, use_multiprocessing={mp}): a batch arrives every "
            f"{format_ms(m.step, 1)} and a step computes in {format_ms(m.compute, 1)}, so {n} batches loading in parallel keep up. "
            f"Addresses the loading part of the wait, {_saves(m, m.wait)}"
        )
        if n > cores:
            tip += f"; above the {cores} CPU cores this holds while loads wait on disk or network"
        if not mp:
            tip += (
                ". If `__getitem__` is pure-Python work (the GIL lets one thread run at a time), also set "
                "`use_multiprocessing=True`"
            )
        tips.append(tip + ".")
        if (workers or 1) > 1:
            tips.append(
                f"Raise `max_queue_size` (now {pipeline.get('max_queue_size')}) if load times vary from batch to "
                "batch. Addresses the waits of slow batches, which a deeper queue absorbs."
            )
    elif kind == "generator":
        tips.append(
            "A Python generator runs in the training loop, one batch at a time: rewrite it as a "
            "`keras.utils.PyDataset` with `workers=` or as a tf.data pipeline with a parallel map. "
            f"Addresses all of the {format_ms(m.wait, 1)} wait per step, which is the generator's own time."
        )
    elif kind == "arrays":
        tips.append(
            "With in-memory arrays the per-step cost is slicing and copying the batch: use a larger `batch_size`, "
            "or `steps_per_execution` (TensorFlow, JAX) to run several steps per call. "
            f"Addresses the slicing and copying, {_saves(m, m.wait)}."
        )
    elif kind == "torch DataLoader":
        nw = pipeline.get("num_workers") or 0
        n = workers_needed(nw, m, cores)
        tip = (
            f"Raise `num_workers` to {n} (now {nw}): a batch arrives every {format_ms(m.step, 1)} and a step computes in "
            f"{format_ms(m.compute, 1)}, so {n} worker processes keep up"
            + (f" (above the {cores} CPU cores while loads wait on disk or network)" if n > cores else "")
        )
        if (epochs or 0) > 1 and not pipeline.get("persistent_workers"):
            tip += ", and set `persistent_workers=True` so they are not started again every epoch"
        tips.append(tip + f". Addresses the loading part of the wait, {_saves(m, m.wait)}.")
        if nw and (epochs or 0) > 1 and not pipeline.get("persistent_workers") and n <= nw:
            tips.append(
                "Set `persistent_workers=True` so workers are not restarted every epoch. "
                "Addresses the wait at the start of each epoch."
            )
        if gpu and not pipeline.get("pin_memory"):
            tips.append(
                "Set `pin_memory=True`: copies from pinned host memory to the GPU are faster and asynchronous. "
                "Addresses the host-to-device copy in the wait."
            )
    else:
        tips.append(
            "Prepare batches in parallel and ahead of time (prefetch)"
            + ("" if gpu is False else ", and move augmentation onto the GPU")
            + f". Addresses the {format_ms(m.wait, 1)} wait per step."
        )
    return tips


_FILE_READERS = ("tfrecord", "text_line", "fixed_length_record")
_OP_CALLS = {"parallel_map": ".map (parallel)", "map": ".map", "parallel_batch": ".batch (parallel)"}


def _advise_tf_data(
    m: Measurement, pipeline: dict[str, Any], gpu, epochs, cores: int, scope: str, cache_serves: bool
) -> list[str]:
    tips: list[str] = []
    ops = list(pipeline.get("ops") or [])
    cached = bool(pipeline.get("cache"))
    after_cache = list(pipeline.get("after_cache") or [])  # last first, as in `ops`
    if pipeline.get("sequential_map") and not (cache_serves and "map" not in after_cache):
        where = "each `.map(...)` after `.cache()`" if cache_serves else "each `.map(...)`"
        tips.append(
            f"Pass `num_parallel_calls=tf.data.AUTOTUNE` to {where}: a map without it transforms one "
            f"element at a time. Addresses the map's share of the wait: elements are then prepared {cores} or more "
            f"at a time ({cores} CPU cores; more while they wait on I/O)."
        )
    if not pipeline.get("ends_with_prefetch"):
        tips.append(
            "End the tf.data pipeline with `.prefetch(tf.data.AUTOTUNE)`, so the next batch is prepared while the "
            f"step computes. Addresses the part of the wait that compute can hide: {_saves(m, m.compute)}."
        )
    if not cached:
        once = " (this fit runs one epoch, so the cache would never be read: it pays off over several)"
        tips.append(
            "Add `.cache()` after the expensive deterministic steps (decode, resize) and before random augmentation, "
            "if the data fits in memory or on local disk. Addresses the reading and decoding part of the wait, from "
            "the second epoch on: the first epoch fills the cache" + (once if epochs == 1 else "") + "."
        )
    elif cache_serves:
        work = [_OP_CALLS.get(op, f".{op}") for op in reversed(after_cache) if op not in ("prefetch", "options")]
        if work:
            tips.append(
                f"Over {scope} every batch comes from the cache, so nothing is read or decoded: the wait is the work "
                f"after `.cache()` ({', '.join(work)}). Addresses all of the {format_ms(m.wait, 1)} wait: make that work "
                "cheaper (smaller images, fewer ops), or move random augmentation into the model."
            )
        else:
            tips.append(
                f"Over {scope} every batch comes from the cache and nothing runs after it: the wait is tf.data's own "
                "cost per batch. A larger `batch_size`, or `steps_per_execution` (TensorFlow, JAX), spreads it over "
                f"more examples. Addresses all of the {format_ms(m.wait, 1)} wait."
            )
    source_read = not (cached and cache_serves)
    readers = [op for op in ops if op in _FILE_READERS]
    if (
        source_read
        and readers
        and not pipeline.get("interleave")
        and pipeline.get("ends_with_prefetch")
        and not pipeline.get("sequential_map")
    ):
        tips.append(
            "The files are read one after the other: read them in parallel with "
            "`tf.data.Dataset.list_files(...).interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)`. "
            "Addresses the reading part of the wait."
        )
    if not tips:  # prefetches, maps in parallel, caches where it can: the work per element is the limit
        done = ["prefetches"] + (["maps in parallel"] if pipeline.get("parallel_map") else [])
        done += ["caches"] if cached else []
        said = done[0] if len(done) == 1 else f"{', '.join(done[:-1])} and {done[-1]}"
        once = " (this fit runs one epoch: its cache is filled, never read)" if cached and epochs == 1 else ""
        tips.append(
            f"The pipeline already {said}{once}: the work per element is the limit. "
            "Do less of it per step: store the inputs pre-processed (decoded, resized), read smaller ones, or "
            f"move augmentation into the model. Addresses all of the {format_ms(m.wait, 1)} wait per step."
        )
    has_map = pipeline.get("sequential_map") or pipeline.get("parallel_map")
    if gpu is not False and has_map and (not cached or "map" in after_cache or "parallel_map" in after_cache):
        tips.append(
            "Move random augmentation into the model as Keras preprocessing layers (`keras.layers.RandomFlip`, "
            "`RandomBrightness`, ...), so it runs with the step on the GPU. Addresses the augmentation part of "
            "the wait."
        )
    return tips


def _flops(value: float | None) -> str:
    if value is None:
        return "n/a"
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.2f} {unit}FLOP/s"
    return f"{value:.0f} FLOP/s"


def _rows(m: Measurement) -> list[tuple[str, str]]:
    return [
        ("wait for input / step", _pct(m.wait_fraction)),
        ("step", format_ms(m.step)),
        ("wait", format_ms(m.wait)),
        ("fetch (host)", format_ms(m.fetch)),
        ("compute", format_ms(m.compute)),
        ("other (callbacks, Python)", format_ms(m.other)),
        ("steps/s", "n/a" if m.steps_per_sec is None else f"{m.steps_per_sec:.1f}"),
        ("samples/s", "n/a" if m.samples_per_sec is None else f"{m.samples_per_sec:.0f}"),
        ("achieved FLOP/s", _flops(m.flops_per_sec)),
        ("achieved FLOP/s per device", _flops(m.flops_per_sec_per_device)),
        ("MFU", "n/a" if m.mfu is None else f"{100 * m.mfu:.1f}%"),
        ("without the wait, at most", "n/a" if m.speedup_bound is None else f"{m.speedup_bound:.2f}x faster"),
        ("steps (timed with a sync)", f"{m.steps} ({m.sampled_steps})"),
    ]


AGGREGATION_NOTE = (
    "Each figure of a span is time-weighted over the steps it covers: wait share = "
    "sum(steps x wait) / sum(steps x step) over its epochs (or windows)."
)


def summary_text(
    title: str, m: Measurement, v: Verdict, notes: Sequence[str] = (), fit: Measurement | None = None
) -> str:
    """A plain-text report (also valid Markdown for TensorBoard's text tab).

    With ``fit`` (the whole fit's figures, when the verdict covers only its
    steady state) the table has a column for each, and the phases follow.
    """
    head = f"{title}: {v.category}" + (f" ({v.scope})" if v.scope else "")
    lines = [head, "", v.message, ""]
    both = fit is not None and v.left_out
    if both:
        lines.append(f"| figure | {v.scope} | whole fit |")
        lines.append("|---|---|---|")
        lines += [f"| {a} | {b} | {c} |" for (a, b), (_, c) in zip(_rows(m), _rows(fit))]
    else:
        lines.append("| figure | value |")
        lines.append("|---|---|")
        lines += [f"| {a} | {b} |" for a, b in _rows(m)]
    if len(v.phases) > 1:
        lines += ["", "| phase | steps | wait | step | in the verdict |", "|---|---|---|---|---|"]
        for p in v.phases:
            kept = "yes" if p.steady else f"no: {p.reason or 'warm-up'}"
            lines.append(f"| {p.label} | {p.steps} | {_pct(p.wait_fraction)} | {format_ms(p.step)} | {kept} |")
        lines += ["", AGGREGATION_NOTE]
    for e in v.evidence:
        lines += ["", e]
    if v.advice:
        lines += ["", "What to change:"]
        lines += [f"- {a}" for a in v.advice]
    for n in notes:
        lines += ["", n]
    return "\n".join(lines)
