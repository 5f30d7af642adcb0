"""Step timing: from per-call records to wait/compute fractions, verdicts, advice.

Nothing here knows about Keras or a framework; the step hook
(:mod:`keras_gpu_tools._core.step_hook`) produces :class:`StepRecord` objects
and the callback turns :class:`StepStats` into logs and a report.

How a step's time is split (per training step, in seconds):

- ``fetch``: host time blocked fetching the batch (``next()`` on the input
  iterator). Measured on every step where the fetch happens in Python (JAX,
  torch) and on sampled steps on TensorFlow.
- ``compute``: from the start of the step (after the fetch) until the device
  has finished it. Needs a device sync, so it is measured on sampled steps
  only; the lower quartile of the samples is used (the fastest of fewer than
  five): what slows a sample (warm-up, compilation, a busy host) only adds
  time, so the low end is the device's own step time.
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
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools._core.validation import check_number

HIGH = "highly input-bound"
MODERATE = "moderately input-bound"
NOT = "not input-bound"
UNKNOWN = "unknown"

# TensorBoard's input-pipeline analyzer (xprof): >= 20 % HIGHLY, >= 5 % MODERATELY.
XPROF_HIGH = 0.20
XPROF_MODERATE = 0.05


@dataclasses.dataclass
class StepRecord:
    """One call of the train function (``steps`` training steps)."""

    index: int  # call number since the hook was installed (0 = first call)
    sampled: bool = False  # synced and timed in full
    warmup: bool = False  # compilation or first trace: left out of the statistics
    steps: int = 1
    samples: int | None = None  # examples in the call's batches, where known
    start: float | None = None  # clock at the start (after a sampled step's pre-sync)
    end: float | None = None  # clock when the call returned (after the sync if sampled)
    fetch: float | None = None  # seconds blocked fetching this call's batches
    compute: float | None = None  # seconds from fetched to done (sampled calls)
    dispatch: float | None = None  # host seconds launching the step, where told apart from compute
    gap: float | None = None  # seconds from return to the next call, less its fetch
    interval: float | None = None  # seconds from this call's start to the next's
    covers: int = 0  # steps of fast-path calls after this one, inside its interval, not measured themselves
    after_sync: bool = False  # this call or the one before was synced: its fetch found a refilled buffer
    signature: Any = None  # shapes/dtypes of the batch (sampled calls)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # for observers


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
    flops_per_sec: float | None = None
    mfu: float | None = None
    overlapped: bool = False  # the real step was shorter than the serialized one

    def logs(self) -> dict[str, float]:
        """The logged keys (units in the names); unknown figures are left out."""
        out: dict[str, float] = {}

        def put(key, value, scale=1.0):
            if value is not None and math.isfinite(value):
                out[key] = float(value) * scale

        put("input/wait_fraction", self.wait_fraction)
        put("input/wait_ms", self.wait, 1e3)
        put("input/fetch_ms", self.fetch, 1e3)
        put("input/compute_ms", self.compute, 1e3)
        put("input/other_ms", self.other, 1e3)
        put("input/step_ms", self.step, 1e3)
        put("throughput/steps_per_sec", self.steps_per_sec)
        put("throughput/samples_per_sec", self.samples_per_sec)
        put("throughput/flops_per_sec", self.flops_per_sec)
        put("throughput/mfu", self.mfu)
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

    def measurement(self, flops_per_step: float | None = None, peak_flops: float | None = None) -> Measurement:
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
        if flops_per_step and m.steps_per_sec:
            m.flops_per_sec = flops_per_step * m.steps_per_sec
            if peak_flops:
                m.mfu = m.flops_per_sec / peak_flops
        return m


# -- verdicts ---------------------------------------------------------------------
@dataclasses.dataclass
class Verdict:
    category: str  # HIGH, MODERATE, NOT or UNKNOWN
    wait_fraction: float | None
    message: str
    evidence: list[str] = dataclasses.field(default_factory=list)
    advice: list[str] = dataclasses.field(default_factory=list)

    @property
    def input_bound(self) -> bool:
        return self.category in (HIGH, MODERATE)

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


def verdict_for(
    m: Measurement,
    moderate: float = XPROF_MODERATE,
    high: float = XPROF_HIGH,
    gpu_means: dict[str, float] | None = None,
    pipeline: dict[str, Any] | None = None,
    host: dict[str, float] | None = None,
) -> Verdict:
    category = classify(m.wait_fraction, moderate, high)
    if category == UNKNOWN:
        message = "Input-bound: unknown (no timed training step yet)."
    else:
        pct = 100.0 * m.wait_fraction
        word = {HIGH: "HIGHLY", MODERATE: "MODERATELY", NOT: "NOT"}[category]
        message = (
            f"Your program is {word} input-bound because {pct:.1f}% of the step time is spent waiting for input "
            f"(wait {1e3 * m.wait:.2f} ms, compute {1e3 * (m.compute or 0):.2f} ms, other {1e3 * (m.other or 0):.2f} ms "
            f"of a {1e3 * m.step:.2f} ms step)."
        )
    evidence = gpu_evidence(category, gpu_means or {})
    advice = advise(category, m, pipeline or {}, host or {})
    return Verdict(category, m.wait_fraction, message, evidence, advice)


# -- advice ------------------------------------------------------------------------
def advise(category: str, m: Measurement, pipeline: dict[str, Any], host: dict[str, float]) -> list[str]:
    """Short, specific changes for what was measured (empty unless input-bound)."""
    if category not in (HIGH, MODERATE):
        return []
    tips: list[str] = []
    cpu = host.get("system_cpu_percent")
    cores = host.get("cpu_count")
    if cpu is not None and cpu >= 90:
        tips.append(
            f"The host CPU is the limit ({cpu:.0f}% of {int(cores) if cores else 'all'} cores busy): more workers will not help. "
            "Move preprocessing and augmentation into the model (Keras preprocessing layers run on the GPU), "
            "cache decoded data, or store inputs pre-processed."
        )
    kind = pipeline.get("kind", "unknown")
    if kind == "tf.data":
        if not pipeline.get("ends_with_prefetch"):
            tips.append(
                "End the tf.data pipeline with `.prefetch(tf.data.AUTOTUNE)` so batches are prepared while the GPU computes."
            )
        if pipeline.get("sequential_map"):
            tips.append(
                "Pass `num_parallel_calls=tf.data.AUTOTUNE` to `.map(...)`: a map without it runs on one thread."
            )
        if not pipeline.get("cache"):
            tips.append(
                "Add `.cache()` after the expensive deterministic steps (decode, resize) and before random augmentation, if the data fits in memory or on local disk."
            )
        tips.append("Move random augmentation into the model as Keras preprocessing layers, so it runs on the GPU.")
        if pipeline.get("ends_with_prefetch") and pipeline.get("parallel_map") and pipeline.get("cache"):
            tips.append(
                "The pipeline already prefetches, maps in parallel and caches: the source is the limit (reads, decoding); read files with `interleave(num_parallel_calls=tf.data.AUTOTUNE)`."
            )
    elif kind == "PyDataset":
        workers = pipeline.get("workers")
        mp = pipeline.get("use_multiprocessing")
        tips.append(
            f"Your PyDataset runs with workers={workers}, use_multiprocessing={mp}: raise `workers` "
            "(up to the number of CPU cores) so batches load in parallel"
            + (
                ", and set `use_multiprocessing=True` if `__getitem__` is Python-heavy (the GIL serialises threads)."
                if not mp
                else "."
            )
        )
        tips.append("Raise `max_queue_size` if the load time varies from batch to batch.")
    elif kind == "generator":
        tips.append(
            "A Python generator runs on one thread and Keras cannot parallelise it: rewrite it as a `keras.utils.PyDataset` with `workers=` or as a tf.data pipeline with a parallel map."
        )
    elif kind == "arrays":
        tips.append(
            "With in-memory arrays the per-step cost is slicing and copying the batch: use a larger `batch_size`, "
            "or `steps_per_execution` (TensorFlow, JAX) to run several steps per call."
        )
    elif kind == "torch DataLoader":
        nw = pipeline.get("num_workers")
        tips.append(
            f"Your DataLoader has num_workers={nw}: raise it (to the number of CPU cores) so batches load in parallel."
        )
        if not pipeline.get("pin_memory"):
            tips.append("Set `pin_memory=True` for faster host-to-GPU copies.")
        if nw and not pipeline.get("persistent_workers"):
            tips.append("Set `persistent_workers=True` so workers are not restarted every epoch.")
    else:
        tips.append("Prepare batches in parallel and ahead of time (prefetch), and move augmentation onto the GPU.")
    return tips


def _flops(value: float | None) -> str:
    if value is None:
        return "n/a"
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.2f} {unit}FLOP/s"
    return f"{value:.0f} FLOP/s"


def format_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f} ms"


def summary_text(title: str, m: Measurement, v: Verdict, notes: Sequence[str] = ()) -> str:
    """A plain-text report (also valid Markdown for TensorBoard's text tab)."""
    lines = [f"{title}: {v.category}", "", v.message, ""]
    lines.append("| figure | value |")
    lines.append("|---|---|")
    rows = [
        ("wait for input / step", "n/a" if m.wait_fraction is None else f"{100 * m.wait_fraction:.1f}%"),
        ("step", format_ms(m.step)),
        ("wait", format_ms(m.wait)),
        ("fetch (host)", format_ms(m.fetch)),
        ("compute", format_ms(m.compute)),
        ("other (callbacks, Python)", format_ms(m.other)),
        ("steps/s", "n/a" if m.steps_per_sec is None else f"{m.steps_per_sec:.1f}"),
        ("samples/s", "n/a" if m.samples_per_sec is None else f"{m.samples_per_sec:.0f}"),
        ("achieved FLOP/s", _flops(m.flops_per_sec)),
        ("MFU", "n/a" if m.mfu is None else f"{100 * m.mfu:.1f}%"),
        ("steps (timed with a sync)", f"{m.steps} ({m.sampled_steps})"),
    ]
    lines += [f"| {a} | {b} |" for a, b in rows]
    for e in v.evidence:
        lines += ["", e]
    if v.advice:
        lines += ["", "What to change:"]
        lines += [f"- {a}" for a in v.advice]
    for n in notes:
        lines += ["", n]
    return "\n".join(lines)
