"""A fake clock behind the step hook for a real fit(): the step's figures come out exact whatever the load.

``FakeStepTime`` (a Keras callback, placed after the callbacks that attach to the step hook) makes the hook
read one :class:`~tests.helpers.step_records.FakeClock` and moves it only inside the train function: by
``compute`` on every call and by ``compile`` more on the fit's first call. Fetching, callbacks and Python
take no time on it, so a step is exactly ``compute`` and the first call's excess exactly ``compile``.
"""

import keras

from keras_gpu_tools.runtime.step_hook import StepHook
from tests.helpers.step_records import FakeClock


class FakeStepTime(keras.callbacks.Callback):
    """Moves ``clock`` by ``compute`` seconds per train-function call, and ``compile`` more on the fit's first."""

    def __init__(self, clock, compute, compile=0.0):
        super().__init__()
        self.clock, self.compute, self.compile = clock, compute, compile
        self.calls = 0
        self._attachment = None

    # -- the step hook's observer: runs the call, then moves the clock -------------------------
    def sample(self, index):
        return False

    def next_sample(self, index):
        return None  # never asks for the full path: the other observers' schedule is unchanged

    def on_step(self, record):
        pass

    def inner(self, fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.clock.advance(self.compute + (self.compile if self.calls == 0 else 0.0))
            self.calls += 1
            return out

        return call

    # -- the callback: joins the hook the other callbacks installed ------------------------------
    def on_train_begin(self, logs=None):
        hook = StepHook.installed(self.model)
        assert hook is not None, "FakeStepTime goes after a callback that attaches to the step hook"
        self._attachment = StepHook.attach(self.model, self, hook.backend, hook.session, clock=self.clock)

    def on_train_end(self, logs=None):
        if self._attachment is not None:
            self._attachment.hook.detach(self._attachment)
            self._attachment = None


def fake_step_clock(monkeypatch):
    """One FakeClock that every step hook installed in the test reads (undone with ``monkeypatch``)."""
    clock = FakeClock()
    attach = StepHook.attach.__func__

    def attach_on_fake(cls, model, observer, backend, session, clock_=None, **_):
        return attach(cls, model, observer, backend, session, clock=clock)

    monkeypatch.setattr(StepHook, "attach", classmethod(attach_on_fake))
    return clock
