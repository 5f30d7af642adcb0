"""LiveView: off outside notebooks, cheap redraws of what the other callbacks measure."""

import logging
import time
from types import SimpleNamespace

import keras
import numpy as np
import pytest

from keras_gpu_tools import GPUUtilizationLogger
from keras_gpu_tools.callbacks import live_view
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.live.render import LiveState, in_notebook, render, sparkline, step_times


def small_fit(callbacks, epochs=2, n=640, batch_size=16):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = rng.integers(0, 3, size=n)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=callbacks)


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="interval"):
        LiveView(interval=0)
    with pytest.raises(ValueError, match="enabled"):
        LiveView(enabled="yes")
    with pytest.raises(TypeError, match="display"):
        LiveView(display="html")


@pytest.mark.multibackend
def test_off_outside_a_notebook():
    assert not in_notebook()
    view = LiveView()
    small_fit([view], epochs=1)
    assert view.redraws == 0 and not view.active


@pytest.mark.multibackend
def test_redraws_what_the_other_callbacks_measure(tmp_path, monkeypatch):
    monkeypatch.setattr(live_view, "EPOCH_GAP_S", 0.0)  # every epoch end redraws, however short
    shown = []
    view = LiveView(interval=0.2, display=shown.append)
    lg = GPUUtilizationLogger(log_dir=None, interval=0.05)
    det = InputBoundDetector(log_dir=None, window=10, sample_every=5, verbose=0)
    t0 = time.monotonic()
    small_fit([lg, det, view], epochs=2)
    seconds = time.monotonic() - t0
    # Each epoch end is handed over; one due while a picture is being drawn replaces the waiting one,
    # so at least a picture during training and the final one.
    assert view.redraws == len(shown) >= 2 and "<b>Training</b>" in shown[0]
    assert view.redraws <= seconds / 0.2 + 2 + 2  # the interval is kept
    last = shown[-1]
    assert "<b>Done</b>" in last and "epoch 2/2" in last and "step 80" in last
    assert "input wait, steps 71-80" in last and "host CPU (no GPU)" in last and "<svg" in last
    assert f"{det.epoch_history[-1]['throughput/samples_per_sec']:,.0f}" in last
    assert view.redraw_seconds / view.redraws < 0.05  # a redraw is cheap


def test_a_failing_display_never_stops_training(caplog):
    def broken(html):
        raise RuntimeError("no frontend")

    view = LiveView(interval=0.01, display=broken)
    with caplog.at_level(logging.WARNING, logger="keras_gpu_tools"):
        history = small_fit([view], epochs=2)
    assert len(history.history["loss"]) == 2
    assert view.redraws == 1 and "redraw failed" in caplog.text


def test_render_shows_each_gpu_and_oom_and_profiler():
    st = LiveState()
    st.gpu_logger = SimpleNamespace(
        gpus=[(0, None)],
        timeline=[
            (
                100.0 + i,
                10 * i,
                {
                    "gpu/0/sm_activity_percent": 50.0 + i,
                    "gpu/0/utilization_percent": 90.0,
                    "gpu/0/memory_used_mib": 2000.0,
                    "gpu/0/memory_total_mib": 80000.0,
                },
            )
            for i in range(5)
        ],
    )
    st.oom = SimpleNamespace(micro_batches=4, recoveries=["OOM on step 57"])
    text = "ProfilerWindow: 2.0% waiting for input (not input-bound), steps 11-15, this window only; xprof agrees"
    cap = SimpleNamespace(
        input=SimpleNamespace(text=text + "\nxprof's own conclusion: ..."), line=lambda: "steps 11-15"
    )
    st.profiler = SimpleNamespace(captures=[cap])
    html = render(st, now=0.0)
    assert "GPU 0 SM activity" in html and "54%" in html and "2,000 / 80,000 MiB" in html
    assert "OOM recoveries" in html and "micro-batches: 4" in html
    assert "2.0% waiting for input (not input-bound), steps 11-15, this window only; xprof agrees" in html
    assert "100.00 ms" in html  # 1 s per 10 steps, from the logger's points


def test_sparkline_and_step_times():
    assert sparkline([1.0]) == ""
    svg = sparkline([0.0, 50.0, 100.0], width=104, height=24, low=0, high=100)
    assert 'points="2.0,22.0 52.0,12.0 102.0,2.0"' in svg
    assert step_times([(0.0, 0, {}), (1.0, 100, {}), (1.0, 100, {}), (3.0, 150, {})]) == [10.0, 40.0]


@pytest.mark.multibackend
@pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch runs steps_per_execution=1 only")
def test_steps_per_execution_counts_the_steps_run():
    # 15 batches an epoch in executions of 4: Keras reports the last one as ending at batch 16.
    shown = []
    view = LiveView(interval=0.01, display=shown.append)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 8)).astype("float32"), rng.normal(size=(60, 1)).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=4)
    steps = []

    class Spy(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            steps.append(view._state.step)

    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[view, Spy()])
    assert steps == [15, 30]
    assert "step 30" in shown[-1] and "step 32" not in shown[-1]


def test_many_tiny_epochs_redraw_at_most_every_epoch_gap(monkeypatch):
    """300 epochs of 4 ms on a patched clock (1.2 s): each epoch end is not a redraw of its own."""
    clock = [0.0]

    def monotonic():
        return clock[0]

    monkeypatch.setattr(live_view, "time", SimpleNamespace(monotonic=monotonic, perf_counter=time.perf_counter))
    tick = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: clock.__setitem__(0, clock[0] + 0.004))
    shown = []
    view = LiveView(interval=2.0, display=shown.append)
    small_fit([tick, view], epochs=300, n=16)

    assert len(shown) == view.redraws
    # At most one epoch end each EPOCH_GAP_S of the 1.2 s, the first picture, and the end of training.
    assert 2 <= view.redraws <= 1.2 / live_view.EPOCH_GAP_S + 1 + 2, view.redraws
    assert "<b>Done</b>" in shown[-1] and "epoch 300/300" in shown[-1]
