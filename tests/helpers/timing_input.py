"""A fake clock for a real fit() with an InputBoundDetector: every figure it measures is then exact.

The step hook and the detector read one :class:`~tests.helpers.step_records.FakeClock`
(``StepHook.attach(clock=...)`` and the detector's wall-clock ``time.time()``). Nothing
sleeps; the clock moves only when the training thread

* takes a batch: the ``k``-th batch it takes in the fit costs ``fetch(k)`` seconds, and
* runs a step: each training step costs ``compute`` seconds (inside Keras's train function).

The host's CPU shares, real figures a loaded machine changes, are left out (no host evidence or tip).

Batches are charged where the training thread takes them, never where a loader makes them:
a ``tf.data`` prefetch or a ``PyDataset`` wrapped by TensorFlow produces on threads of its
own, ahead of the steps, so a loader that moved the clock would move it at a time no test
controls. Where the training thread takes batches, per backend: TensorFlow's compiled loop
(``spe`` batches a call) or a sampled step's Python fetch; JAX's and torch's epoch iterator.
"""

from __future__ import annotations

import operator
import types
from collections.abc import Callable

import keras

from keras_gpu_tools.callbacks import input_bound_detector
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.step_hook import StepHook
from tests.helpers.step_records import FakeClock

_LIST_ITERATOR = type(iter([]))


class FakeTime:
    """The fit's clock, and what taking a batch and running a step cost on it."""

    def __init__(self, compute: float, fetch: Callable[[int], float]):
        self.clock = FakeClock()
        self.compute = compute
        self.fetch = fetch
        self.taken = 0  # batches the training thread has taken in this fit

    def take(self, n: int) -> None:
        for _ in range(n):
            self.clock.advance(self.fetch(self.taken))
            self.taken += 1

    def run(self, steps: int) -> None:
        self.clock.advance(self.compute * steps)


class _Charged:
    """An epoch's batches (an iterable or an iterator) whose every ``next()`` is charged to ``time``."""

    def __init__(self, inner, time: FakeTime):
        self.inner, self.time, self.it = inner, time, None

    def __iter__(self):
        if self.it is None:
            self.it = iter(self.inner)
            return self
        return _Charged(self.inner, self.time).__iter__()

    def __next__(self):
        batch = next(self.it)
        self.time.take(1)
        return batch


def _steps_of(hook, args) -> int:
    """Training steps one call of the train function runs (TensorFlow's sampled call: the batches handed to it)."""
    if args and isinstance(args[0], _LIST_ITERATOR):
        return max(operator.length_hint(args[0]), 1)
    return hook.steps_per_execution


class _NoHostFigures:
    """The detector's host CPU meter, reading nothing: real CPU shares would add evidence and advice under load."""

    def __init__(self, *args, **kwargs):
        pass

    def restart(self) -> _NoHostFigures:
        return self

    def read(self) -> dict[str, float]:
        return {}


def install(monkeypatch, compute: float, fetch: Callable[[int], float] = lambda k: 0.0) -> FakeTime:
    """Runs every fit() of the test on a :class:`FakeTime`; returns it."""
    time = FakeTime(compute, fetch)
    attach = StepHook.attach.__func__
    rebuild = StepHook._rebuild_inner

    def attach_on_fake_clock(cls, model, observer, backend, session, clock=None):
        time.taken = 0
        return attach(cls, model, observer, backend, session, clock=time.clock)

    def rebuild_charging(hook):
        rebuild(hook)
        fn = hook.inner

        def call(*args):
            steps = _steps_of(hook, args)
            graph = bool(args) and ki.tf_is_graph_iterator(args[0])
            out = fn(*args)
            if graph:  # TensorFlow's compiled loop took its batches inside the call
                time.take(steps)
            time.run(steps)
            return out

        hook.inner = call

    monkeypatch.setattr(StepHook, "attach", classmethod(attach_on_fake_clock))
    monkeypatch.setattr(StepHook, "_rebuild_inner", rebuild_charging)
    monkeypatch.setattr(input_bound_detector, "time", types.SimpleNamespace(time=time.clock))
    monkeypatch.setattr(input_bound_detector, "CpuMeter", _NoHostFigures)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from keras_gpu_tools.backends.tensorflow import step as tf_step

        fetch_batches = tf_step.fetch_batches

        def charged_fetch(iterator, n):
            batches = fetch_batches(iterator, n)
            time.take(len(batches))
            return batches

        monkeypatch.setattr(tf_step, "fetch_batches", charged_fetch)
    else:
        if backend == "jax":
            from keras.src.backend.jax.trainer import JAXEpochIterator as EpochIterator
        else:
            from keras.src.backend.torch.trainer import TorchEpochIterator as EpochIterator
        get_iterator = EpochIterator._get_iterator
        monkeypatch.setattr(EpochIterator, "_get_iterator", lambda self: _Charged(get_iterator(self), time))
    return time
