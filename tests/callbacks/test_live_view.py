"""LiveView: off outside notebooks, cheap redraws of what the other callbacks measure."""

import logging
import math
from types import SimpleNamespace

import keras
import numpy as np
import pytest

from keras_gpu_tools import GPUUtilizationLogger
from keras_gpu_tools.callbacks import live_view
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.live import drawer
from keras_gpu_tools.live.render import LiveState, in_notebook, render, sparkline, step_times
from tests.helpers.timing_live import VirtualClock, draw_on_callers_thread, patch_live_view_clock


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
    # When to redraw is decided on a virtual clock that moves 1/16 s a step, and each picture is drawn as it is
    # handed over (on this thread): the pictures are exactly the ones due. The other callbacks measure for real.
    monkeypatch.setattr(live_view, "EPOCH_GAP_S", 0.0)  # every epoch end redraws, however short
    clock = VirtualClock()
    patch_live_view_clock(monkeypatch, clock)
    draw_on_callers_thread(monkeypatch)
    renders = []
    monkeypatch.setattr(drawer, "render", lambda st, now: renders.append(render(st, now)) or renders[-1])
    step = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: setattr(clock, "now", clock.now + 1 / 16)
    )
    shown = []
    view = LiveView(interval=0.5, display=shown.append)
    lg = GPUUtilizationLogger(log_dir=None, interval=0.05)
    det = InputBoundDetector(log_dir=None, window=10, sample_every=5, verbose=0)
    small_fit([step, lg, det, view], epochs=2)
    # The interval is kept: a picture every 8 steps (0.5 s) of the 80, one at each of the 2 epoch ends, the last one.
    assert view.redraws == len(shown) == 80 // 8 + 2 + 1
    assert all("<b>Training</b>" in html for html in shown[:-1]) and "step 8 " in shown[0]
    last = shown[-1]
    assert "<b>Done</b>" in last and "epoch 2/2" in last and "step 80" in last
    assert "input wait, steps 71-80" in last and "host CPU (no GPU)" in last and "<svg" in last
    assert f"{det.epoch_history[-1]['throughput/samples_per_sec']:,.0f}" in last
    # A redraw is one render of a small HTML table (its cost is measured in benchmarks/per_epoch_cost.py):
    # nothing is rendered that is not shown, and the seconds spent drawing are counted for that benchmark.
    assert renders == shown and max(len(html) for html in shown) < 20_000
    assert math.isfinite(view.redraw_seconds) and view.redraw_seconds > 0


def test_a_failing_display_never_stops_training(caplog, monkeypatch):
    monkeypatch.setattr(live_view, "FINAL_WAIT_S", 30.0)  # fit's end waits for the picture, however late

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
def test_steps_per_execution_counts_the_steps_run(monkeypatch):
    monkeypatch.setattr(live_view, "FINAL_WAIT_S", 30.0)  # the last picture is drawn, however late
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


@pytest.mark.slow
def test_many_tiny_epochs_redraw_at_most_every_epoch_gap(monkeypatch):
    """120 epochs of 1/256 s on a virtual clock (0.47 s): each epoch end is not a redraw of its own."""
    tick = 1 / 256  # exact in binary: the epoch ends that redraw are exact
    clock = VirtualClock()
    patch_live_view_clock(monkeypatch, clock)
    draw_on_callers_thread(monkeypatch)  # every picture handed over is drawn
    advance = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: setattr(clock, "now", clock.now + tick))
    shown = []
    view = LiveView(interval=2.0, display=shown.append)
    small_fit([advance, view], epochs=120, n=16)

    assert len(shown) == view.redraws
    # One epoch end each EPOCH_GAP_S (every 13th epoch from the first: 13/256 s >= 0.05 s > 12/256 s),
    # and the end of training; the interval (2 s) never comes within the fit's 0.47 s.
    gap = math.ceil(live_view.EPOCH_GAP_S / tick)
    assert gap == 13 and view.redraws == len(range(0, 120, gap)) + 1, view.redraws
    assert "<b>Done</b>" in shown[-1] and "epoch 120/120" in shown[-1]
