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

"""

from __future__ import annotations

import statistics

from keras_gpu_tools.input.measure import Measurement, set_flops
from keras_gpu_tools.runtime.step_record import StepRecord


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
