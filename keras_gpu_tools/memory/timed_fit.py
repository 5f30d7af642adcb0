"""One candidate batch timed with Keras's own ``model.fit``: the first call, then the steady state.

Two short fits over a generator that yields the same batch (no host copy of
more than one batch), each with one callback that has only epoch hooks, so
Keras dispatches the steps as in any fit (no sync per step; an epoch's end
reads the logs, which waits for the device):

1. ``epochs=2, steps_per_epoch=1``: epoch 0 is the first call (tracing,
   compiling, the first step): ``compile_seconds``; epoch 1 one step, a rough
   step time that sizes the next fit's epochs.
2. ``steps_per_epoch=k`` with ``k`` steps lasting about ``epoch_seconds``:
   up to ``epochs`` epochs, the step time is the median epoch over ``k``.

Keras's import is inside the functions (this module imports no framework).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Timing:
    """What one candidate's fits measured."""

    compile_seconds: float
    step_seconds: float
    steps: int
    wall_seconds: float  # the two fits, end to end


@dataclasses.dataclass(frozen=True)
class Pace:
    """How long the steady state is measured: epochs of about ``epoch_seconds``, at most ``epochs`` of them."""

    epoch_seconds: float = 0.25
    epochs: int = 4
    max_steps_per_epoch: int = 500

    @classmethod
    def for_device(cls, on_gpu: bool) -> Pace:
        # A CPU's steps are slow and steady (no autotuning, no asynchronous queue): fewer, shorter epochs.
        return cls() if on_gpu else cls(epoch_seconds=0.05, epochs=2, max_steps_per_epoch=20)


def _callback(times: list[tuple[str, int, float]], stop: Callable[[], bool] | None):
    import keras

    class _Clock(keras.callbacks.Callback):
        # Epoch hooks only: a batch hook would make Keras read (and wait for) every step's logs.
        def on_epoch_begin(self, epoch, logs=None):
            times.append(("begin", epoch, time.perf_counter()))

        def on_epoch_end(self, epoch, logs=None):
            times.append(("end", epoch, time.perf_counter()))  # Keras has read the logs: the device is done
            if stop is not None and epoch >= 1 and stop():
                self.model.stop_training = True

    return _Clock()


def _epochs(times: list[tuple[str, int, float]]) -> list[float]:
    begins = {e: t for kind, e, t in times if kind == "begin"}
    return [t - begins[e] for kind, e, t in times if kind == "end" and e in begins]


def time_batch(
    model,
    batch,
    pace: Pace,
    *,
    out_of_time: Callable[[], bool] | None = None,
    job_steps: Callable[[int], int] | None = None,
) -> Timing:
    """Times training on ``batch`` (``(x, y)`` arrays): the first call, then the steady state. See the module.

    ``out_of_time`` ends the steady state's fit early (at an epoch end);
    ``job_steps`` turns this process's steps per epoch into the job's: where
    every step is collective (a step over several processes' devices), every
    process must run the same steps, so the count is agreed (and
    ``out_of_time``, which each process would answer alone, is left None).
    """
    x, y = batch

    def repeat():
        while True:
            yield (x, y) if y is not None else (x,)

    start = time.perf_counter()
    times: list[tuple[str, int, float]] = []
    model.fit(repeat(), epochs=2, steps_per_epoch=1, shuffle=False, verbose=0, callbacks=[_callback(times, None)])
    first, rough = _epochs(times)
    k = int(min(pace.max_steps_per_epoch, max(2, round(pace.epoch_seconds / max(rough, 1e-6)))))
    if job_steps is not None:
        k = job_steps(k)
    times = []
    model.fit(
        repeat(),
        epochs=pace.epochs,
        steps_per_epoch=k,
        shuffle=False,
        verbose=0,
        callbacks=[_callback(times, out_of_time)],
    )
    epochs = _epochs(times)
    step = statistics.median(epochs) / k
    # The first call ran one step besides compiling: what it took beyond a steady step is the compile.
    return Timing(
        compile_seconds=max(0.0, first - step),
        step_seconds=step,
        steps=k * len(epochs),
        wall_seconds=time.perf_counter() - start,
    )


def fit_side_effects(model) -> dict[str, Any]:
    """What a fit sets on the model besides its variables (its History, ``stop_training``), to put back."""
    return {name: getattr(model, name) for name in ("history", "stop_training") if hasattr(model, name)}


def restore_side_effects(model, saved: dict[str, Any]) -> None:
    for name in ("history", "stop_training"):
        if name in saved:
            setattr(model, name, saved[name])
        elif hasattr(model, name):
            try:
                delattr(model, name)
            except AttributeError:
                pass


__all__ = ["Pace", "Timing", "fit_side_effects", "restore_side_effects", "time_batch"]
