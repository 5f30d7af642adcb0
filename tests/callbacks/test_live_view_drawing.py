"""LiveView draws on the fit session's thread: a slow, failing or blocked display never holds training up."""

import logging
import math
import os
import threading
import warnings

import keras
import pytest

from keras_gpu_tools.callbacks import live_view
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.errors import KerasGPUToolsWarning
from keras_gpu_tools.live.drawer import Drawer
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_live import join_package_threads, package_threads, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fit(view, epochs, n=64, batch_size=8, more=()):
    model = tiny_dense_model(features=4, hidden=8)
    x, y = regression_data(n, features=4)
    return model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[view, *more])


class HeldDisplay:
    """A display that holds its first picture until the final one is handed over (then it is drawn next)."""

    def __init__(self):
        self.entered, self.release, self.returned = threading.Event(), threading.Event(), threading.Event()
        self.shown = []  # (thread, html), as each draw ends
        self.events = []  # the order of what happened, on either thread

    def __call__(self, html):
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(60)
            self.events.append("display returned")
            self.returned.set()
        self.shown.append((threading.get_ident(), html))

    def drawer(self):
        """LiveView's Drawer, releasing the display once the final picture is waiting to be drawn."""
        display = self

        class ReleasingDrawer(Drawer):
            def hand_over(self, snap):
                super().hand_over(snap)
                if snap.done:
                    display.events.append("final handed over")
                    display.release.set()

        return ReleasingDrawer


class EpochEnds(keras.callbacks.Callback):
    """Wraps LiveView's epoch-end hook: records, on the training thread, whether the display was blocked meanwhile."""

    def __init__(self, view, display):
        super().__init__()
        self.display = display
        hook = view.on_epoch_end

        def recorded(epoch, logs=None):
            blocked_before = display.entered.is_set() and not display.returned.is_set()
            hook(epoch, logs)
            blocked_after = not display.returned.is_set()
            display.events.append(("epoch end", epoch, blocked_before, blocked_after))

        view.on_epoch_end = recorded

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:  # the first picture has been handed over: from now on the display holds it
            assert self.display.entered.wait(30)


@pytest.mark.multibackend
def test_a_slow_display_draws_off_the_training_thread_and_the_last_picture_is_the_end(monkeypatch):
    # The display holds the first picture until the final one is waiting: every epoch end in between must
    # have returned while it was held (the cost of an epoch end is benchmarks/per_epoch_cost.py's).
    monkeypatch.setattr(live_view, "EPOCH_GAP_S", 0.0)  # every epoch end hands a picture over
    monkeypatch.setattr(live_view, "FINAL_WAIT_S", 30.0)  # the final picture is drawn, however late
    training = threading.get_ident()
    display = HeldDisplay()
    monkeypatch.setattr(live_view, "Drawer", display.drawer())
    view = LiveView(interval=0.01, display=display)
    ends = EpochEnds(view, display)
    history = fit(view, epochs=8, more=[ends])

    assert len(history.history["loss"]) == 8
    shown = display.shown
    # Every picture drawn on the session's thread, none on the training thread; the last one,
    # drawn before fit() returned, is the final state.
    assert shown and training not in {tid for tid, _ in shown}
    # A picture every step was due (interval 10 ms): those handed over while the display held the first
    # one were replaced by the newest, the final one.
    assert view.redraws == len(shown) == 2
    assert "<b>Training</b>" in shown[0][1]
    assert "<b>Done</b>" in shown[-1][1] and "epoch 8/8" in shown[-1][1] and "step 64" in shown[-1][1]
    # The training thread's epoch ends only handed the pictures over: epochs 1-7 ended while the display was
    # blocked, and all eight before the display returned.
    # (Epoch 0's end may come before the display took its first picture.)
    ends, rest = display.events[:8], display.events[8:]
    assert [e[:2] for e in ends] == [("epoch end", e) for e in range(8)] and all(e[3] for e in ends)
    assert all(e[2] for e in ends[1:]) and rest == ["final handed over", "display returned"]
    assert math.isfinite(view.redraw_seconds) and view.redraw_seconds > 0


@pytest.mark.multibackend
def test_a_display_that_raises_on_the_session_thread_turns_the_view_off_once(caplog, monkeypatch):
    monkeypatch.setattr(live_view, "FINAL_WAIT_S", 30.0)  # fit's end waits for the picture, however late
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
    release, entered, returned = threading.Event(), threading.Event(), threading.Event()

    def blocked(html):
        entered.set()
        release.wait(60)
        returned.set()

    view = LiveView(interval=0.01, display=blocked)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = fit(view, epochs=3)
        assert entered.is_set()
        assert len(history.history["loss"]) == 3
        # fit() returned while the display was still blocked: it waited FINAL_WAIT_S for it, not for the display.
        assert not returned.is_set()
        ours = [
            w for w in caught if issubclass(w.category, KerasGPUToolsWarning) and "did not return" in str(w.message)
        ]
        assert len(ours) == 1 and not view.active
        assert f"within {live_view.FINAL_WAIT_S:g} s" in str(ours[0].message)
    finally:
        release.set()
    # Once the display returns, the session's thread ends: nothing of the fit is left.
    assert join_package_threads() == []
    assert returned.is_set() and view.redraws == 1  # the blocked one; nothing drawn after the view was given up


@pytest.mark.multibackend
def test_a_fit_that_raises_stops_the_drawing():
    shown, drawn = [], threading.Event()

    def display(html):
        shown.append(html)
        drawn.set()

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                assert drawn.wait(30)  # a picture was drawn during training
                raise RuntimeError("boom")

    view = LiveView(interval=0.01, display=display)
    with pytest.raises(RuntimeError, match="boom"):
        fit(view, epochs=4, more=[Boom()])
    # The session notices and ends its thread; with it gone, nothing can draw any more.
    assert wait_until(lambda: not package_threads()) and join_package_threads() == [] and not view.active
    assert view.redraws == len(shown) >= 1 and "<b>Done</b>" not in shown[-1]
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
    # The final picture at least (fit()'s end waits for it); how many more were drawn depends on the machine.
    assert redraws and int(redraws[0].split()[-1]) >= 1
