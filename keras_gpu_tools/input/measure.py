"""A span's figures: :class:`Measurement`, and one time-weighted aggregation for every longer span.

Only the smallest spans (the detector's windows) are measured from step
records (:mod:`keras_gpu_tools.input.timing`); an epoch, the steady state and
the whole fit are sums of their parts, time-weighted over the steps the parts
cover (:func:`aggregate`). A part of ``n`` steps counts ``n * step`` seconds:
``wait_fraction = sum(n * wait) / sum(n * step)``, a per-step time is
``sum(n * x) / sum(n)``, a rate is ``sum(count) / sum(seconds)``. A part where
a figure is unknown is left out of that figure. So the epoch figures, weighted
by their steps (``input/steps``), add up to the whole fit's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from keras_gpu_tools.logdir import schema


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
        """The logged keys (units in the names); unknown figures are left out.

        One series per figure: the host's fetch, ``input/wait_ms`` wherever no
        compute hides it, is shown beside the wait in the summary's table, not logged.
        """
        out: dict[str, float] = {}

        def put(key, value, scale=1.0):
            if value is not None and math.isfinite(value):
                out[key] = float(value) * scale

        if self.steps:
            put(schema.INPUT_STEPS, self.steps)
        put(schema.INPUT_WAIT_FRACTION, self.wait_fraction)
        put(schema.INPUT_WAIT_MS, self.wait, 1e3)
        put(schema.INPUT_COMPUTE_MS, self.compute, 1e3)
        put(schema.INPUT_OTHER_MS, self.other, 1e3)
        put(schema.INPUT_STEP_MS, self.step, 1e3)
        put(schema.STEPS_PER_SEC, self.steps_per_sec)
        put(schema.SAMPLES_PER_SEC, self.samples_per_sec)
        put(schema.FLOPS_PER_SEC, self.flops_per_sec)
        put(schema.FLOPS_PER_SEC_PER_DEVICE, self.flops_per_sec_per_device)
        put(schema.MFU, self.mfu)
        return out


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
class Sums:
    """The running sums that :func:`aggregate` reduces its parts to; parts are added one at a time.

    A span kept as ``Sums`` grows by a part in constant time, and its figures
    are the same as ``aggregate`` of all its parts (the same additions, in the same order).
    """

    _MEANS = ("fetch", "compute", "other", "step")
    __slots__ = (
        "steps",
        "sampled_steps",
        "means",
        "timed",
        "waited",
        "stepped",
        "rated",
        "seconds",
        "samples",
        "seconds_s",
        "overlapped",
    )

    def __init__(self, parts: Iterable[Measurement] = ()) -> None:
        self.steps = self.sampled_steps = 0
        self.means: dict[str, list[float]] = {a: [0, 0] for a in self._MEANS}  # attr: [sum(n * x), sum(n)]
        self.timed: int = 0  # steps of the parts with a wait and a step
        self.waited = self.stepped = 0.0  # sum(n * wait), sum(n * step) over them
        self.rated: int = 0  # steps of the parts with a rate
        self.seconds = 0.0  # sum(n / rate) over them
        self.samples: float | None = None  # sum(samples * n / rate) over the parts with a sample rate
        self.seconds_s = 0.0  # sum(n / rate) over those
        self.overlapped = False
        for p in parts:
            self.add(p)

    def add(self, p: Measurement) -> None:
        self.steps += p.steps
        self.sampled_steps += p.sampled_steps
        self.overlapped = self.overlapped or p.overlapped
        if not p.steps:
            return
        k = p.steps
        for attr, acc in self.means.items():
            x = getattr(p, attr)
            if x is not None:
                acc[0] += k * x
                acc[1] += k
        if p.wait is not None and p.step:
            self.timed += k
            self.waited += k * p.wait
            self.stepped += k * p.step
        if p.steps_per_sec:
            self.rated += k
            self.seconds += k / p.steps_per_sec
            if p.samples_per_sec is not None:
                self.samples = (self.samples or 0) + p.samples_per_sec * k / p.steps_per_sec
                self.seconds_s += k / p.steps_per_sec

    def measurement(
        self, flops_per_step: float | None = None, peak_flops: float | None = None, devices: int = 1
    ) -> Measurement:
        """The span's figures; FLOP arguments as in :func:`set_flops`."""
        m = Measurement(steps=self.steps, sampled_steps=self.sampled_steps, overlapped=self.overlapped)
        m.fetch, m.compute, m.other, m.step = (s / n if n else None for s, n in self.means.values())
        if self.timed:
            m.wait = self.waited / self.timed
            m.wait_fraction = min(max(self.waited / self.stepped, 0.0), 1.0)
        if self.rated:
            # 1 / step where the same parts give both (each window's rate is 1 / its step): one figure
            m.steps_per_sec = (
                1.0 / m.step if m.step and self.rated == self.means["step"][1] else self.rated / self.seconds
            )
            if self.samples is not None:
                m.samples_per_sec = self.samples / self.seconds_s
        set_flops(m, flops_per_step, peak_flops, devices)
        return m


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
    return Sums(parts).measurement(flops_per_step, peak_flops, devices)
