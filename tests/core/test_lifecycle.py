"""FitGuard: cleanup when fit() raises and Keras never calls on_train_end."""

import sys
import threading
import time

import pytest

from keras_gpu_tools._core.lifecycle import FitGuard, find_fit_frame


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self):
        self.calls.append(threading.get_ident())


class FakeModel:
    """Stands in for a Keras model: fit() calls the callback's hooks."""

    def fit(self, callback, fail=None):
        callback.on_train_begin(self)
        for step in range(3):
            if step == 1 and fail is not None:
                raise fail
        callback.on_train_end()


class GuardedCallback:
    def __init__(self):
        self.aborted = Recorder()
        self.guard = None

    def on_train_begin(self, model):
        self.guard = FitGuard(model, self.aborted, interval=0.02)

    def on_train_end(self):
        self.guard.close()


def wait_until(predicate, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_no_abort_after_a_normal_fit():
    cb = GuardedCallback()
    FakeModel().fit(cb)
    assert cb.guard.watching
    time.sleep(0.1)
    assert cb.aborted.calls == []


def test_abort_runs_once_after_fit_raised():
    cb = GuardedCallback()
    with pytest.raises(KeyboardInterrupt):
        FakeModel().fit(cb, fail=KeyboardInterrupt())
    assert wait_until(lambda: cb.aborted.calls)
    time.sleep(0.1)
    assert len(cb.aborted.calls) == 1
    assert not [t for t in threading.enumerate() if t.name == "keras_gpu_tools-fit-guard"]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring needs Python 3.12")
def test_abort_runs_on_the_training_thread_as_fit_raises():
    cb = GuardedCallback()
    with pytest.raises(RuntimeError):
        FakeModel().fit(cb, fail=RuntimeError("boom"))
    # Already done when the exception reaches us, on this thread.
    assert cb.aborted.calls == [threading.get_ident()]


def test_exceptions_caught_inside_fit_do_not_abort():
    class CatchingModel(FakeModel):
        def fit(self, callback, fail=None):
            callback.on_train_begin(self)
            try:
                raise ValueError("handled inside fit")
            except ValueError:
                pass
            callback.on_train_end()

    cb = GuardedCallback()
    CatchingModel().fit(cb)
    time.sleep(0.1)
    assert cb.aborted.calls == []


def test_no_fit_on_the_stack_means_no_guard_thread():
    guard = FitGuard(object(), Recorder())
    assert not guard.watching
    assert find_fit_frame(object()) is None
    guard.close()
