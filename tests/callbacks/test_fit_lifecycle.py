"""Every callback of the package leaves nothing behind, however fit() or on_train_begin fails."""

import threading
import time
import warnings

import keras
import pytest

from keras_gpu_tools import (
    GPUUtilizationLogger,
    InputBoundDetector,
    LiveView,
    MixedPrecisionCheck,
    OOMBatchSizeReducer,
    ProfilerWindow,
)
from keras_gpu_tools.errors import KerasVersionWarning
from keras_gpu_tools.runtime import keras_internals
from keras_gpu_tools.runtime.session import FitSession
from keras_gpu_tools.runtime.step_hook import MARK, StepHook
from tests.helpers.callbacks import InterruptAt
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_live import wait_until

pytestmark = pytest.mark.multibackend


def hooked(model) -> bool:
    return hasattr(model.train_function, MARK)


def our_threads():
    return [t for t in threading.enumerate() if t.name.startswith("keras_gpu_tools") and t.is_alive()]


def all_callbacks(tmp_path):
    return [
        GPUUtilizationLogger(log_dir=tmp_path, interval=0.05),
        InputBoundDetector(log_dir=tmp_path, verbose=0),
        ProfilerWindow(log_dir=tmp_path, start_step=1000, verbose=0),
        OOMBatchSizeReducer(log_dir=tmp_path, verbose=0),
    ]


class FailingBegin(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        raise RuntimeError("a later callback failed to start")


def test_a_later_callbacks_failing_begin_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(FitSession, "interval", 0.02)
    model = tiny_dense_model(features=4, hidden=8, activation=None)
    x, y = regression_data(64, features=4)
    cbs = all_callbacks(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="later callback"):
            model.fit(x, y, batch_size=8, verbose=0, callbacks=[*cbs, FailingBegin()])
        # the next plain fit() is untouched, whether or not the watchdog got there first
        model.fit(x, y, batch_size=8, verbose=0)
    assert not hooked(model)
    assert wait_until(lambda: not our_threads())  # the watchdog's thread ends once it noticed
    assert cbs[1]._global_step == 0  # the detector saw none of the plain fit's steps


def test_an_error_after_the_hook_is_attached_detaches_it(tmp_path, monkeypatch):
    """Defect 2: an error in on_train_begin left model.train_function wrapped for good."""
    real_attach = StepHook.attach.__func__

    def attach_then_fail(cls, *args, **kwargs):
        real_attach(cls, *args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(StepHook, "attach", classmethod(attach_then_fail))
    model = tiny_dense_model(features=4, hidden=8, activation=None)
    x, y = regression_data(64, features=4)
    for cb in (InputBoundDetector(log_dir=tmp_path, verbose=0), OOMBatchSizeReducer(log_dir=tmp_path, verbose=0)):
        with pytest.raises(OSError, match="disk full"):
            model.fit(x, y, batch_size=8, verbose=0, callbacks=[cb])
        assert not hooked(model)  # at once, not when a watchdog notices
        assert not cb.fit_running


def test_a_failing_writer_at_begin_leaves_nothing_behind(tmp_path, monkeypatch):
    import keras_gpu_tools.callbacks._base as base

    def broken(*a, **k):
        raise PermissionError("cannot write the event file")

    monkeypatch.setattr(base, "EventWriter", broken)
    model = tiny_dense_model(features=4, hidden=8, activation=None)
    x, y = regression_data(64, features=4)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PermissionError):
            model.fit(x, y, batch_size=8, verbose=0, callbacks=[cb])
    assert not our_threads()
    assert not hooked(model)
    assert cb._job is None


class ThreadCensus(keras.callbacks.Callback):
    """Records the package's threads alive at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(sorted(t.name for t in our_threads()))


def test_a_fit_with_every_callback_holds_one_thread_of_the_packages(tmp_path):
    """The watchdog and the logger's sampling share the session's thread (each thread costs JAX's step on a VM)."""
    model = tiny_dense_model(features=4, hidden=8, activation=None)
    x, y = regression_data(64, features=4)
    cbs = [*all_callbacks(tmp_path), LiveView(), MixedPrecisionCheck()]
    census = ThreadCensus()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[*cbs, census])
    assert census.seen == [["keras_gpu_tools-fit"]] * 2
    assert any(k.startswith("host/") for k in history.history)  # the logger sampled on it
    assert not our_threads() and cbs[0]._job is None


def test_a_fit_that_raises_stops_the_loggers_sampling_and_the_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(FitSession, "interval", 0.02)
    model = tiny_dense_model(features=4, hidden=8, activation=None)
    x, y = regression_data(64, features=4)
    logger = GPUUtilizationLogger(log_dir=tmp_path, interval=0.01)
    ticked, jobs = threading.Event(), []
    real_tick = logger._tick
    monkeypatch.setattr(logger, "_tick", lambda: (ticked.set(), real_tick()))

    class Sampling(keras.callbacks.Callback):
        """Waits, before the interrupt, until the logger has sampled on the session's thread."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                assert ticked.wait(30)
                jobs.append(logger._job)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(KeyboardInterrupt):
            model.fit(x, y, batch_size=8, epochs=50, verbose=0, callbacks=[logger, Sampling(), InterruptAt(3)])
    assert wait_until(lambda: not our_threads() and not logger.fit_running)
    assert not our_threads() and not logger.fit_running and logger._job is None
    # It had been sampling, and no longer does: its job is stopped (a stopped job never runs) and the thread is gone.
    assert jobs[0] is not None and jobs[0].stopped


def test_keras_outside_the_tested_range_warns_once(monkeypatch):
    monkeypatch.setattr(keras_internals.version, "_version_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert keras_internals.check_keras_version(keras_internals.TESTED_KERAS[-1])
        assert keras_internals.check_keras_version(keras_internals.TESTED_KERAS[0])
        assert not keras_internals.check_keras_version("3.99.0")
        assert not keras_internals.check_keras_version("3.14.1")
    mine = [w for w in caught if issubclass(w.category, KerasVersionWarning)]
    assert len(mine) == 1 and "keras 3.99.0" in str(mine[0].message)


def test_every_internal_is_documented():
    import pathlib

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "keras-internals.md").read_text()
    for internal in keras_internals.INTERNALS:
        assert internal.what in doc, internal.what


def test_ending_a_fit_never_waits_for_a_watchdog_that_waits_for_the_callback():
    """The last release closes the session and joins its thread: never while holding the callback's lock."""
    from keras_gpu_tools.callbacks._base import FitCallback

    go, events = threading.Event(), []

    class SlowStop(FitCallback):
        def _stop_fit(self, aborted):
            if not aborted:
                go.set()  # the session's thread now aborts this fit and waits for our teardown lock
                time.sleep(0.2)  # gives it time to get there (the order asserted below holds either way)

    session = FitSession(object(), None)  # no frame: the abort below stands in for the watchdog's
    cb = SlowStop()
    cb._session = session
    lock = cb._teardown_lock
    real_close = session._ticker.close

    def close(timeout=2.0):
        # Whether this thread still holds the callback's lock as it joins the session's thread: then the
        # watchdog, waiting for that lock, could never end. The join's own timeout is long so a deadlock shows.
        events.append(("join", lock._is_owned()))
        real_close(timeout=60)

    session._ticker.close = close
    session.add(cb, lambda aborted: cb._end_fit(aborted, session))
    session.every(0.01, lambda: go.is_set() and session.abort(on_training_thread=False), pytest.fail)
    cb._end_fit(aborted=False)
    assert session.closed and not cb.fit_running
    assert events == [("join", False)]  # joined once, with the lock released
    assert session.thread is not None and not session.thread.is_alive()
