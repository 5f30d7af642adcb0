"""FitSession: one per fit(), its teardowns run once however fit() ends."""

import sys
import threading
import time

import pytest

from keras_gpu_tools.runtime import session as lifecycle
from keras_gpu_tools.runtime.keras_internals import find_fit_frame
from keras_gpu_tools.runtime.session import FitSession, run_deferred
from tests.helpers.timing_live import wait_until


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, aborted):
        self.calls.append((threading.get_ident(), aborted))


class FakeModel:
    """Stands in for a Keras model: fit() calls the callback's hooks."""

    def fit(self, callback, fail=None):
        callback.on_train_begin(self)
        for step in range(3):
            if step == 1 and fail is not None:
                raise fail
        callback.on_train_end()


class SessionCallback:
    def __init__(self, training_thread=False, unwind=False):
        self.stopped = Recorder()
        self.session = None
        self.training_thread = training_thread
        self.unwind = unwind

    def on_train_begin(self, model):
        self.session = FitSession.current(model)
        self.session.add(self, self.stopped, training_thread=self.training_thread)
        if self.unwind:
            self.session.watch_unwind(True)

    def on_train_end(self):
        self.stopped(False)
        self.session.release(self)


def watchdogs():
    return [t for t in threading.enumerate() if t.name == "keras_gpu_tools-fit" and t.is_alive()]


@pytest.fixture(autouse=True)
def fast_watchdog(monkeypatch):
    monkeypatch.setattr(FitSession, "interval", 0.02)


def test_no_abort_after_a_normal_fit():
    cb = SessionCallback()
    FakeModel().fit(cb)
    assert cb.session.closed and not cb.session.aborted
    time.sleep(0.1)
    assert cb.stopped.calls == [(threading.get_ident(), False)]
    assert not watchdogs()


def test_abort_runs_once_after_fit_raised():
    cb = SessionCallback()
    with pytest.raises(KeyboardInterrupt):
        FakeModel().fit(cb, fail=KeyboardInterrupt())
    assert wait_until(lambda: cb.stopped.calls)
    time.sleep(0.1)
    assert len(cb.stopped.calls) == 1 and cb.stopped.calls[0][1] is True
    assert wait_until(lambda: not watchdogs())


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring needs Python 3.12")
def test_abort_runs_on_the_training_thread_as_fit_raises():
    cb = SessionCallback(unwind=True)
    with pytest.raises(RuntimeError):
        FakeModel().fit(cb, fail=RuntimeError("boom"))
    # Already done when the exception reaches us, on this thread.
    assert cb.stopped.calls == [(threading.get_ident(), True)]


def test_exceptions_caught_inside_fit_do_not_abort():
    class CatchingModel(FakeModel):
        def fit(self, callback, fail=None):
            callback.on_train_begin(self)
            try:
                raise ValueError("handled inside fit")
            except ValueError:
                pass
            callback.on_train_end()

    cb = SessionCallback()
    CatchingModel().fit(cb)
    time.sleep(0.1)
    assert cb.stopped.calls == [(threading.get_ident(), False)]


def test_no_fit_on_the_stack_means_no_watchdog():
    session = FitSession.current(object())
    assert session.frame is None  # fit()'s frame not found: the session cannot notice fit()'s end by itself
    session.add(object(), Recorder())
    assert session.thread is None
    assert find_fit_frame(object()) is None


def test_a_new_fit_is_never_mistaken_for_the_dead_one():
    """Defect 1: CPython reuses a dead frame's address; id(frame) made a new fit() look like the old one."""
    model = FakeModel()
    dead = SessionCallback()
    with pytest.raises(KeyboardInterrupt):
        model.fit(dead, fail=KeyboardInterrupt())
    # The session still holds the dead fit's frame: a new fit's frame cannot
    # reuse its address, and it is not on the stack any more.
    seen = {}

    class Probe:
        def on_train_begin(self, m):
            seen["frame"] = find_fit_frame(m, sys._getframe(1))
            seen["same"] = dead.session.frame is seen["frame"]
            seen["running"] = dead.session.fit_is_running()

        def on_train_end(self):
            pass

    if not dead.session.closed:
        model.fit(Probe())
        assert seen["same"] is False and seen["running"] is False
    assert wait_until(lambda: dead.stopped.calls)
    assert dead.stopped.calls[0][1] is True


def test_the_next_fit_ends_a_session_that_nobody_noticed_died(monkeypatch):
    monkeypatch.setattr(FitSession, "interval", 60.0)  # the watchdog will not see it in time
    model = FakeModel()
    dead = SessionCallback()
    with pytest.raises(KeyboardInterrupt):
        model.fit(dead, fail=KeyboardInterrupt())
    assert dead.stopped.calls == []  # nothing asked for PY_UNWIND (3.12+), and the watchdog sleeps
    fresh = SessionCallback()
    model.fit(fresh)
    # Ended on this thread, before the new fit's own callbacks started.
    assert dead.stopped.calls == [(threading.get_ident(), True)]
    assert fresh.stopped.calls == [(threading.get_ident(), False)]


def test_training_thread_teardown_is_deferred_from_the_watchdog():
    model = FakeModel()
    cb = SessionCallback(training_thread=True)
    with pytest.raises(KeyboardInterrupt):
        model.fit(cb, fail=KeyboardInterrupt())
    assert wait_until(lambda: cb.session.closed)
    assert cb.stopped.calls == []  # not on the watchdog's thread
    assert lifecycle._deferred
    run_deferred()  # the training thread's next contact with the package
    assert cb.stopped.calls == [(threading.get_ident(), True)]
    assert not lifecycle._deferred


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring needs Python 3.12")
def test_unwind_is_watched_only_while_asked():
    import sys as _sys

    cb = SessionCallback()

    class Model(FakeModel):
        def fit(self, callback, fail=None):
            callback.on_train_begin(self)
            assert callback.session.watch_unwind(True)
            assert _sys.monitoring.get_events(lifecycle._unwind_tool) != 0
            callback.session.watch_unwind(False)
            assert _sys.monitoring.get_events(lifecycle._unwind_tool) == 0
            callback.on_train_end()

    Model().fit(cb)


def test_a_failing_check_warns_once_and_the_watchdog_goes_on(monkeypatch):
    import warnings

    from keras_gpu_tools.errors import KerasGPUToolsWarning

    checks = []

    def broken(self):
        checks.append(1)
        raise OSError("frame unreadable")

    monkeypatch.setattr(FitSession, "fit_is_running", broken)

    class SlowModel(FakeModel):
        def fit(self, callback, fail=None):
            callback.on_train_begin(self)
            wait_until(lambda: len(checks) >= 4)  # fit() runs while the watchdog checks, and fails, 4 times
            callback.on_train_end()

    cb = SessionCallback()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SlowModel().fit(cb)
    ours = [w for w in caught if issubclass(w.category, KerasGPUToolsWarning)]
    assert len(checks) >= 4
    assert len(ours) == 1 and "frame unreadable" in str(ours[0].message)
    assert cb.stopped.calls == [(threading.get_ident(), False)] and not watchdogs()
