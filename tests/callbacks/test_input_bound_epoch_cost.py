"""The detector's epoch end does the same work at every epoch: it never rescans the past epochs.

Work is counted, not timed: each epoch's figures are a spy that records which
past epochs an epoch end reads; the phases a steady state builds are counted;
in a job, the channel is one of two processes where the other sends the same.
"""

import collections.abc
import dataclasses
import json
import random
import threading
import time
import types

import keras
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from keras_gpu_tools.callbacks import _base
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import steady as steady_module
from keras_gpu_tools.input.fit import InputFit
from keras_gpu_tools.input.measure import Measurement, Sums, aggregate
from keras_gpu_tools.input.span import WHOLE_FIT
from keras_gpu_tools.input.steady import FitSpans, span_label, steady_start
from keras_gpu_tools.input.verdict import Judge, gpu_means
from keras_gpu_tools.live import render
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.schema import JOB_STEP_MS_MAX
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.runtime.topology import JobGather, Topology
from tests.helpers.data import uniform_regression_data
from tests.helpers.models import tiny_dense_model

_FIELDS = {f.name for f in dataclasses.fields(Measurement)}


def wait_until(predicate, timeout=30.0) -> bool:
    """True once ``predicate()`` holds (checked every 10 ms), False after ``timeout`` s: free when it passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class _Spy(Measurement):
    """An epoch's figures that note, in ``read``, that the epoch was read."""

    read: set[int] = set()

    def __getattribute__(self, name):
        if name in _FIELDS:
            _Spy.read.add(id(self))
        return super().__getattribute__(name)


@pytest.mark.slow
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
    tiny_dense_model().fit(x, y, batch_size=4, epochs=120, verbose=0, callbacks=[before, detector, after])

    assert len(read_per_epoch) == 120
    assert max(read_per_epoch[-50:]) <= max(read_per_epoch[:20]) <= 4, read_per_epoch[::25]
    assert detector.verdict is not None and len(detector.verdict.phases) == 120


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
        assert s.scope == (span_label([f"epoch {j + 1}" for j in range(k, i + 1)]) if k else WHOLE_FIT)
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


class _TwoProcessChannel:
    """The job's channel of a job of two processes, where process 1 sends what process 0 does."""

    def __init__(self):
        self.gathers = 0

    def gather(self, key, value, timeout_s):
        self.gathers += 1
        return [value, dict(value, process=1, host="peer")]


def _counting_phases(monkeypatch) -> list[int]:
    """Counts the phases (one per epoch of the verdict) that the steady state builds."""
    built = [0]
    phase = steady_module.Phase

    def counted(*args, **kwargs):
        built[0] += 1
        return phase(*args, **kwargs)

    monkeypatch.setattr(steady_module, "Phase", counted)
    return built


@pytest.mark.slow
def test_the_job_exchange_of_an_epoch_end_builds_no_list_of_every_epoch(monkeypatch):
    channel = _TwoProcessChannel()
    topology = Topology(process_index=0, process_count=2, exchange=channel)
    monkeypatch.setattr(
        InputBoundDetector, "_job_gather", lambda self: JobGather(topology, "input/fit1", lambda message: None)
    )
    built = _counting_phases(monkeypatch)
    per_epoch: list[int] = []
    before = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: built.__setitem__(0, 0))
    after = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: per_epoch.append(built[0]))
    detector = InputBoundDetector(window=1, sample_every=1, log_dir=None, verbose=0)
    x, y = uniform_regression_data(8)
    history = tiny_dense_model().fit(x, y, batch_size=4, epochs=80, verbose=0, callbacks=[before, detector, after])

    assert channel.gathers == 80  # the job's path ran at every epoch end
    assert JOB_STEP_MS_MAX in history.history and JOB_STEP_MS_MAX in detector.epoch_history[-1]
    assert detector.job_verdict is not None
    assert detector.job_verdict.processes[0]["scope"] == detector.verdict.scope
    assert max(per_epoch) <= 2, per_epoch[::10]  # (a fit of one epoch so far: its windows)
    assert len(detector.verdict.phases) == 80  # the run's verdict still lists every epoch


def test_the_job_row_carries_the_full_verdicts_scope_category_and_advice():
    rng = random.Random(5)
    judge = Judge(0.05, 0.2, {"kind": "tf.data"}, {"gpu": False, "cores": 2, "epochs": 80})
    fit = InputFit(judge)
    for i in range(80):
        fit.spans.add_window("w", _epoch(rng, slow=i < 2 or 30 <= i < 34), float(i))
        fit.end_epoch(i, float(i), step=i)
        measurement, brief = fit._steady_brief()
        assert brief is not None and not brief.phases
        full = fit.verdict
        assert measurement == fit.measurement
        assert (brief.scope, brief.category, brief.advice) == (full.scope, full.category, full.advice)
        assert len(full.phases) == i + 1


def test_an_epoch_keeps_its_windows_only_until_the_next_one_ends():
    detector = InputBoundDetector(window=1, sample_every=1, log_dir=None, verbose=0)
    x, y = uniform_regression_data(8)
    tiny_dense_model().fit(x, y, batch_size=2, epochs=100, verbose=0, callbacks=[detector])

    epochs = detector._fit.spans.epochs
    assert len(epochs) == 100 and len(detector.window_verdicts) >= 390  # the windows were measured
    assert sum(len(e.parts) for e in epochs) == len(epochs[-1].parts) == 4  # and only the last epoch's are kept


def _verdict_scopes(run_dir) -> list[str]:
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return [json.loads(e.tensor_proto.string_val[0])["scope"] for e in acc.Tensors(schema.INPUT_VERDICT_DATA)]


@pytest.mark.multibackend
def test_epoch_events_are_written_off_the_training_thread_in_order_and_none_is_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(_base, "WRITE_LATER_S", 0.01)
    written: list[tuple[bool, int]] = []  # (on the training thread, step) of each event of the detector's run
    real_add = EventWriter._add

    def add(self, event):
        if event.HasField("summary") and "input" in self.run_dir:
            written.append((threading.current_thread() is threading.main_thread(), event.step))
        real_add(self, event)

    monkeypatch.setattr(EventWriter, "_add", add)

    def the_threads_turn(epoch, logs):
        # The epoch's events, handed over, are written by the session's thread before training goes on:
        # waited for (a generous bound that costs nothing when it passes), not slept on.
        expected = (epoch + 1) * 4  # the global step of the epoch's last window (4 steps an epoch)
        assert wait_until(lambda: any(step == expected for _, step in written)), written

    slow = keras.callbacks.LambdaCallback(on_epoch_end=the_threads_turn)
    detector = InputBoundDetector(window=2, sample_every=1, log_dir=tmp_path, verbose=0)
    x, y = uniform_regression_data(16)
    tiny_dense_model().fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[detector, slow])

    assert _verdict_scopes(tmp_path / "input") == ["epoch 1", "epoch 2", "epoch 3", "fit"]
    steps = [step for _, step in written]
    assert steps == sorted(steps)  # the file's order is the steps' order, as when written at once
    assert not any(main for main, step in written if step < 8)  # epochs 1 and 2: all by the session's thread
    acc = EventAccumulator(str(tmp_path / "input"), size_guidance={"scalars": 0})
    acc.Reload()
    windows = [e.step for e in acc.Scalars(schema.INPUT_WAIT_FRACTION)]
    assert windows == sorted(set(windows)) and {4, 8, 12} <= set(windows)  # in order; each epoch's last window


@pytest.mark.multibackend
def test_a_fit_that_raises_loses_none_of_the_epochs_handed_over(tmp_path, monkeypatch):
    monkeypatch.setattr(_base, "WRITE_LATER_S", 60.0)  # nothing written by the thread before the fit raises

    def interrupt(epoch, logs):
        if epoch == 2:
            raise KeyboardInterrupt

    detector = InputBoundDetector(window=2, log_dir=tmp_path, verbose=0)
    x, y = uniform_regression_data(16)
    with pytest.raises(KeyboardInterrupt):
        tiny_dense_model().fit(
            x, y, batch_size=4, epochs=5, verbose=0, callbacks=[detector, keras.callbacks.LambdaCallback(interrupt)]
        )
    assert wait_until(lambda: not detector.fit_running)  # the session notices fit()'s end
    assert _verdict_scopes(tmp_path / "input") == ["epoch 1", "epoch 2"]
