"""The detector's epoch end does the same work at every epoch: it never rescans the past epochs.

Work is counted, not timed: each epoch's figures are a spy that records which
past epochs an epoch end reads.
"""

import collections.abc
import dataclasses
import random
import types

import keras

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input.measure import Measurement, Sums, aggregate
from keras_gpu_tools.input.steady import FitSpans, span_label, steady_start
from keras_gpu_tools.input.verdict import gpu_means
from keras_gpu_tools.live import render
from tests.helpers.data import uniform_regression_data
from tests.helpers.models import tiny_dense_model

_FIELDS = {f.name for f in dataclasses.fields(Measurement)}


class _Spy(Measurement):
    """An epoch's figures that note, in ``read``, that the epoch was read."""

    read: set[int] = set()

    def __getattribute__(self, name):
        if name in _FIELDS:
            _Spy.read.add(id(self))
        return super().__getattribute__(name)


def test_epoch_end_reads_a_bounded_number_of_past_epochs(monkeypatch):
    original = FitSpans.end_epoch

    def end_epoch(self, label, t0, agg):
        return original(self, label, t0, lambda parts: _Spy(**dataclasses.asdict(agg(parts))))

    monkeypatch.setattr(FitSpans, "end_epoch", end_epoch)
    read_per_epoch: list[int] = []
    before = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: _Spy.read.clear())
    after = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: read_per_epoch.append(len(_Spy.read)))
    detector = InputBoundDetector(window=1, sample_every=1, log_dir=None, verbose=0)
    x, y = uniform_regression_data(8)
    tiny_dense_model().fit(x, y, batch_size=4, epochs=300, verbose=0, callbacks=[before, detector, after])

    assert len(read_per_epoch) == 300
    assert max(read_per_epoch[-50:]) <= max(read_per_epoch[:20]) <= 4, read_per_epoch[::25]
    assert detector.verdict is not None and len(detector.verdict.phases) == 300


def _epoch(rng: random.Random, slow: bool) -> Measurement:
    steps = rng.choice([1, 2, 5])
    step = rng.uniform(0.004, 0.006) * (3 if slow else 1)
    wait = step * (0.4 if slow else rng.uniform(0.0, 0.1))
    m = Measurement(steps=steps, sampled_steps=1, fetch=wait, compute=step - wait, other=0.0, step=step, wait=wait)
    m.wait_fraction, m.steps_per_sec, m.samples_per_sec = wait / step, 1 / step, 4 / step
    return m


def test_kept_sums_give_the_figures_of_a_full_rescan():
    rng = random.Random(3)
    spans = FitSpans()
    parts: list[Measurement] = []
    for i in range(120):
        spans.windows = []
        spans.add_window("w", _epoch(rng, slow=i < 3 or i == 50), float(i))
        spans.end_epoch(f"epoch {i + 1}", float(i), aggregate)
        parts.append(spans.epochs[-1].measurement)
        s = spans.steady_state(lambda sums: sums.measurement(), {})
        assert s is not None
        k = steady_start(parts)
        assert s.measurement == aggregate(parts[k:]) and s.fit == aggregate(parts)
        assert s.scope == (span_label([f"epoch {j + 1}" for j in range(k, i + 1)]) if k else "the whole fit")
        assert [p.steady for p in s.phases] == [j >= k for j in range(i + 1)]
    assert Sums(parts).measurement() == aggregate(parts)


class _CountingTimeline(collections.abc.Sequence):
    """A GPU logger's points that count how many are read."""

    def __init__(self, points):
        self.points, self.reads = points, 0

    def __len__(self):
        return len(self.points)

    def __getitem__(self, i):
        self.reads += 1
        return self.points[i]


def test_gpu_means_and_the_live_view_read_only_the_newest_points():
    points = [(float(t), t, {"gpu/0/utilization_percent": float(t % 7)}) for t in range(5000)]
    timeline = _CountingTimeline(points)
    means = gpu_means(types.SimpleNamespace(timeline=timeline), since=4990.0)
    assert means == {"gpu/0/utilization_percent": sum(t % 7 for t in range(4990, 5000)) / 10}
    assert timeline.reads <= 11
    timeline.reads = 0
    assert render._tail(timeline, 3) == points[-3:] and timeline.reads == 3
