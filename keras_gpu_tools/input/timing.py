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
- ``step``: the real step time, the one every view reads. Unsampled calls
  are never synced, so the mean interval between their starts is the true
  rate, overlap included (a sync's lost overlap is the detector's cost, not
  the step's). Where every call was synced, their intervals; the serialized
  sum ``fetch + compute + other`` only where no interval is known.
  ``steps_per_sec`` is ``1 / step``, and ``samples_per_sec`` the mean
  samples per step of every timed call (an epoch's partial last batch
  included) times it: the samples of those steps over as many steady steps'
  seconds. ``overlapped`` says that the unsynced calls ran faster than the
  serialized step.
- samples: counted on the calls whose batches the hook saw; a step it did
  not see (a fast-path call; on TensorFlow every unsampled one) counts the
  fit's full batch (:class:`BatchSizes`), never the epoch's partial last batch.

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


class BatchSizes:
    """The samples of a step whose batch was not seen: the fit's mean over the seen calls, epoch ends apart.

    An epoch's last call may hold a partial batch (``drop_remainder=False``);
    it is counted exactly where seen, and counts for the others only where no
    other call was seen. One per fit, shared by its windows: on TensorFlow a
    later epoch may see no batch but its last.
    """

    __slots__ = ("samples", "steps", "end_samples", "end_steps")

    def __init__(self) -> None:
        self.samples = self.steps = 0
        self.end_samples = self.end_steps = 0

    def add(self, r: StepRecord) -> None:
        if r.samples is None:
            return
        n = max(int(r.steps), 1)
        if r.epoch_end:
            self.end_samples += r.samples
            self.end_steps += n
        else:
            self.samples += r.samples
            self.steps += n

    def per_step(self) -> float | None:
        if self.steps:
            return self.samples / self.steps
        return self.end_samples / self.end_steps if self.end_steps else None


class StepStats:
    """Accumulates :class:`StepRecord` objects into a :class:`Measurement`.

    ``batches`` holds the fit's batch sizes (:class:`BatchSizes`, shared by
    its windows); a window of its own where none is given.
    """

    def __init__(self, batches: BatchSizes | None = None):
        self.batches = batches if batches is not None else BatchSizes()
        self.steps = 0  # every step seen, warm-up included
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

    @property
    def sampled_steps(self) -> int:
        return len(self._computes)

    def add(self, r: StepRecord) -> None:
        n = max(int(r.steps), 1)
        extra = max(int(r.covers), 0)  # fast calls inside this record's interval
        self.steps += n + extra
        self.batches.add(r)
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
        unsynced = self._interval_sum / self._interval_steps if self._interval_steps else None
        serial = None
        if m.fetch is not None and m.compute is not None:
            serial = m.fetch + m.compute + (m.other or 0.0)
        m.overlapped = serial is not None and unsynced is not None and unsynced < serial * 0.98
        if unsynced is not None and unsynced > 0:
            m.step = unsynced
        elif self._span_steps and self._span_sum > 0:
            m.step = self._span_sum / self._span_steps  # every call synced: their wall time
        else:
            m.step = serial
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
        if m.step:
            m.steps_per_sec = 1.0 / m.step
            per_step = self.batches.per_step()
            if self._span_steps:  # the mean samples per timed step (partial batches in) at that rate
                samples: float | None = self._span_samples
                if self._span_unknown_steps:
                    samples = None if per_step is None else self._span_samples + self._span_unknown_steps * per_step
                if samples:
                    m.samples_per_sec = samples / self._span_steps * m.steps_per_sec
            elif per_step:
                m.samples_per_sec = per_step * m.steps_per_sec
        set_flops(m, flops_per_step, peak_flops, devices)
        return m
