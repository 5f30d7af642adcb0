"""LiveView draws on the fit session's thread: a slow, failing or blocked display never holds training up."""

import logging
import os
import threading
import time
import warnings

import keras
import pytest

from keras_gpu_tools.callbacks import live_view
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.errors import KerasGPUToolsWarning
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def package_threads():
    return [t for t in threading.enumerate() if t.name.startswith("keras_gpu_tools") and t.is_alive()]


def fit(view, epochs, n=64, batch_size=8, more=()):
    model = tiny_dense_model(features=4, hidden=8)
    x, y = regression_data(n, features=4)
    return model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[view, *more])


class EpochEndTimer(keras.callbacks.Callback):
    """Times LiveView's own epoch-end hook, on the training thread."""

    def __init__(self, view):
        super().__init__()
        self.seconds = []
        hook = view.on_epoch_end

        def timed(epoch, logs=None):
            t0 = time.perf_counter()
            hook(epoch, logs)
            self.seconds.append(time.perf_counter() - t0)

        view.on_epoch_end = timed


@pytest.mark.multibackend
def test_a_slow_display_draws_off_the_training_thread_and_the_last_picture_is_the_end(monkeypatch):
    monkeypatch.setattr(live_view, "EPOCH_GAP_S", 0.0)  # every epoch end hands a picture over
    training = threading.get_ident()
    shown = []  # (thread, html), as each draw ends

    def slow_display(html):
        time.sleep(0.05)
        shown.append((threading.get_ident(), html))

    view = LiveView(interval=0.01, display=slow_display)
    timer = EpochEndTimer(view)
    t0 = time.monotonic()
    history = fit(view, epochs=8)
    seconds = time.monotonic() - t0

    assert len(history.history["loss"]) == 8
    # Every picture drawn on the session's thread, none on the training thread; the last one,
    # drawn before fit() returned, is the final state.
    assert shown and {tid for tid, _ in shown} != {training} and training not in {tid for tid, _ in shown}
    assert view.redraws == len(shown) >= 2
    assert "<b>Done</b>" in shown[-1][1] and "epoch 8/8" in shown[-1][1] and "step 64" in shown[-1][1]
    # The training thread's epoch ends only hand the picture over: far below the display's 50 ms.
    assert len(timer.seconds) == 8 and max(timer.seconds) < 0.02, timer.seconds
    # A picture every step was due (interval 10 ms): the display's 50 ms drew only the newest of them.
    assert view.redraws <= seconds / 0.05 + 2
    assert view.redraw_seconds >= 0.05 * view.redraws * 0.9


@pytest.mark.multibackend
def test_a_display_that_raises_on_the_session_thread_turns_the_view_off_once(caplog):
    calls = []

    def broken(html):
        calls.append(threading.get_ident())
        raise RuntimeError("no frontend")

    view = LiveView(interval=0.01, display=broken)
    with caplog.at_level(logging.WARNING, logger="keras_gpu_tools"):
        history = fit(view, epochs=3)
    assert len(history.history["loss"]) == 3
    assert calls and threading.get_ident() not in calls
    assert view.redraws == 1 and caplog.text.count("redraw failed") == 1 and not view.active


@pytest.mark.multibackend
def test_a_display_that_blocks_forever_is_given_up_at_fit_end_with_one_warning():
    release, entered = threading.Event(), threading.Event()

    def blocked(html):
        entered.set()
        release.wait(60)

    view = LiveView(interval=0.01, display=blocked)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            history = fit(view, epochs=3)
            seconds = time.monotonic() - t0
        assert entered.is_set()
        assert len(history.history["loss"]) == 3
        # Bounded: the last picture's wait (FINAL_WAIT_S) and the session thread's join (2 s) at most, beside the fit.
        assert seconds < live_view.FINAL_WAIT_S + 2.0 + 5.0, seconds
        ours = [
            w for w in caught if issubclass(w.category, KerasGPUToolsWarning) and "did not return" in str(w.message)
        ]
        assert len(ours) == 1 and not view.active
    finally:
        release.set()
    # Once the display returns, the session's thread ends: nothing of the fit is left.
    deadline = time.monotonic() + 5
    while package_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert package_threads() == []
    assert view.redraws == 1  # the blocked one; nothing drawn after the view was given up


@pytest.mark.multibackend
def test_a_fit_that_raises_stops_the_drawing():
    shown = []

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("boom")

    view = LiveView(interval=0.01, display=shown.append)
    with pytest.raises(RuntimeError, match="boom"):
        fit(view, epochs=4, more=[Boom()])
    deadline = time.monotonic() + 3
    while package_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert package_threads() == [] and not view.active
    drawn = view.redraws
    time.sleep(0.1)
    assert view.redraws == drawn and shown and "<b>Done</b>" not in shown[-1]
    # The same view works in the next fit.
    fit(view, epochs=1)
    assert "<b>Done</b>" in shown[-1] and "epoch 1/1" in shown[-1]


_KERNEL_CELL = """
import numpy as np, keras
from keras_gpu_tools import LiveView
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
view = LiveView(interval=0.05)
model.fit(np.zeros((512, 4), "float32"), np.zeros((512, 1), "float32"), batch_size=8, epochs=3, verbose=0,
          callbacks=[view])
print("redraws", view.redraws)
"""


@pytest.mark.slow
def test_in_a_jupyter_kernel_the_pictures_drawn_off_the_training_thread_reach_the_cell(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(_KERNEL_CELL)]
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = nb.cells[0].outputs
    assert not [o for o in outputs if o.output_type == "error"]
    views = [o for o in outputs if o.output_type == "display_data" and "kgt-live" in o.data.get("text/html", "")]
    # One display, updated in place: it shows the end of training (the waiting placeholder replaced).
    assert len(views) == 1 and "<b>Done</b>" in views[0].data["text/html"] and "epoch 3/3" in views[0].data["text/html"]
    redraws = [o.text for o in outputs if o.output_type == "stream" and "redraws" in o.text]
    assert redraws and int(redraws[0].split()[-1]) >= 2
