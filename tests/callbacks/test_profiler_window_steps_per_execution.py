"""ProfilerWindow with steps_per_execution=N: windows count steps (batches), the per-step figures are per step.

Real fits, real traces read back. Keras's torch backend runs one step per call
(steps_per_execution must be 1 there): these run on TensorFlow and JAX.
"""

import sys
import time

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks import profiler_window
from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
from keras_gpu_tools.profiling.layer_trace import xplane_ops
from keras_gpu_tools.profiling.trace import analyze_input_pipeline, xprof_available
from tests.helpers.data import regression_data
from tests.helpers.models import one_heavy_layer_model, tiny_dense_model

pytestmark = pytest.mark.multibackend

BACKEND = keras.backend.backend()
needs_several_steps_per_call = pytest.mark.skipif(
    BACKEND == "torch" or (BACKEND == "jax" and sys.version_info < (3, 12)),
    reason="torch runs one step per call; Keras disables JAX profiling on Python < 3.12",
)
TICK = 0.25  # seconds per read of the window's clock


class TickingTime:
    """``time`` for profiler_window: its perf_counter moves TICK per read (at a window's start and each call's end)."""

    def __init__(self):
        self.now = 0.0
        self.monotonic = time.monotonic

    def perf_counter(self):
        self.now += TICK
        return self.now


def fit(model, cb, steps, epochs=1, batch=8, features=8, more=()):
    x, y = regression_data(steps * batch, features=features)
    return model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False, callbacks=[cb, *more])


class BetweenCalls(keras.callbacks.Callback):
    """Time that passes between the train function's calls (the fit's loop, input, hooks): a read of the clock."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def on_train_batch_begin(self, batch, logs=None):
        self.clock.perf_counter()


def spe_model(n, model=None):
    model = model or tiny_dense_model()
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=n)
    return model


@needs_several_steps_per_call
def test_a_window_counts_steps_and_its_mean_step_is_per_step(tmp_path, monkeypatch):
    clock = TickingTime()
    monkeypatch.setattr(profiler_window, "time", clock)
    cb = ProfilerWindow(log_dir=tmp_path, start_step=5, num_steps=6, verbose=0, analyze=False, layers=False)
    fit(
        spe_model(4), cb, steps=24, more=[BetweenCalls(clock)]
    )  # calls start at steps 0, 4, 8, ...: the window's first is the one at 8
    (cap,) = cb.captures
    assert (cap.start_step, cap.num_steps, cap.calls, cap.steps_per_execution) == (8, 8, 2, 4)
    assert cap.asked == "steps 6-11"
    # The window's time runs from its first call's start to its last call's end, what ran between the calls
    # in: read at the first call's start, its end, between the calls, the second call's end: three ticks; the
    # mean is over the 8 steps.
    assert cap.mean_step_ms == pytest.approx(1000 * 3 * TICK / 8)
    line = cap.line()
    assert line.startswith("ProfilerWindow: steps 9-16 (scheduled)")
    assert "steps_per_execution=4: 2 calls of 4 steps, each one step marker" in line
    assert "scheduled as steps 6-11" in line
    assert cb.global_step == 24


@needs_several_steps_per_call
@pytest.mark.skipif(not xprof_available(), reason="reads the step markers back with xprof")
def test_the_trace_has_one_step_marker_per_call(tmp_path):
    cb = ProfilerWindow(log_dir=tmp_path, start_step=8, num_steps=8, verbose=0, layers=False)
    fit(spe_model(4), cb, steps=20)
    cb.wait_for_analysis()
    (cap,) = cb.captures
    assert (cap.start_step, cap.num_steps, cap.asked) == (8, 8, "")
    rows = analyze_input_pipeline(cap.files).step_rows
    # One step marker per call of 4 steps: xprof names them by our step numbers on a CPU
    # (8 and 12), and numbers them from 0 on a GPU.
    steps = sorted(int(str(r["step"]).split()[-1]) for r in rows)
    assert len(steps) == cap.calls == 2
    assert steps in ([8, 12], [0, 1])


@needs_several_steps_per_call
def test_an_epochs_last_call_runs_fewer_steps_and_the_next_epoch_counts_on_from_its_end(tmp_path):
    # Epochs of 10 steps in calls of 4: steps 0-3, 4-7, 8-9 (a call of 2), then the next epoch at step 10.
    cb = ProfilerWindow(log_dir=tmp_path, windows=[(8, 4), (14, 4)], verbose=0, analyze=False, layers=False)
    fit(spe_model(4), cb, steps=10, epochs=3)
    first, second = cb.captures
    assert (first.start_step, first.num_steps, first.calls) == (8, 6, 2)  # 2 steps, then 4 of the next epoch
    assert (second.start_step, second.num_steps, second.calls) == (14, 4, 1)
    assert cb.global_step == 30  # what Keras counts: 3 epochs of 10 steps


@needs_several_steps_per_call
def test_the_layer_table_is_per_step(tmp_path):
    model = spe_model(4, one_heavy_layer_model(features=64, heavy=256))
    cb = ProfilerWindow(log_dir=tmp_path, start_step=4, num_steps=8, verbose=0, analyze=False)
    x = np.random.default_rng(0).random((16 * 16, 64), dtype=np.float32)
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    table, (cap,) = cb.layer_table(), cb.captures
    assert not table.error, table.error
    assert (table.start_step, table.num_steps) == (cap.start_step, cap.num_steps) == (4, 8)
    ops = xplane_ops(cap.files).ops
    in_trace_ms = sum(op.ps for op in ops if not op.copy) / 1e9  # host-device copies are in no row
    assert table.total_ms_per_step == pytest.approx(in_trace_ms / 8)  # the window's op time over its 8 steps
    heavy = next(r for r in table.rows if r.path == "heavy")
    assert heavy.ms_per_step == pytest.approx(heavy.forward_ms + heavy.backward_ms)
    assert table.text().startswith("Time per layer, steps 5-12")


def test_a_schedule_fires_at_the_first_call_at_or_past_its_start():
    from keras_gpu_tools.profiling.schedule import WindowSchedule

    sched = WindowSchedule.checked(10, 5)
    assert [s for s in range(0, 40, 8) if sched.fires(s, 8)] == [16]
    assert sched.first_call(0, 8) == 2 and sched.first_call(16, 8) == 0 and sched.first_call(24, 8) is None
    window, reason = sched.starting_at(16, 8)
    assert (window.start, window.steps, reason) == (10, 5, "scheduled")
    every = WindowSchedule.checked(2, 2, every_n_steps=5)
    assert [s for s in range(0, 24, 4) if every.fires(s, 4)] == [4, 8, 12, 20]  # starts 2, 7, 12, 17, 22
    assert [s for s in range(12) if every.fires(s, 1)] == [2, 7]  # one step a call: exactly at the starts
