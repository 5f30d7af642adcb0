"""A training input timed with Keras's own ``model.fit``: the first call, then the steady state until it is known.

:func:`time_batch` fits over a generator that yields the same batch (no host
copy of more than one batch): the step's own speed. :func:`time_fit` fits
over any :class:`FitInput`, the user's own arrays or dataset among them:
the speed training reaches with that input. Each fit has one callback with
only epoch hooks, so Keras dispatches the steps as in any fit (no sync per
step; an epoch's end reads the logs, which waits for the device):

1. ``epochs=3, steps_per_epoch=1``: epoch 0 is the first call (tracing,
   compiling, the first step): ``compile_seconds``; epochs 1 and 2 one step
   each, a rough step time (the faster: a second step can still be warming
   up) that sizes the next fit's epochs.
2. ``steps_per_epoch=k`` with ``k`` steps lasting about ``epoch_seconds``:
   each epoch is a window; the first is a warm-up and left out. Windows are
   timed until the mean step time is known within ``Pace.target`` (one
   standard error over the mean, :func:`~keras_gpu_tools.memory.throughput.timing_stop`),
   or one more window would pass the candidate's ``share`` of the budget, or ``max_windows``;
   a window that would outlast the whole budget is never started (a pass after the warm-up
   one included).
   A window under half as long as meant (the rough step was slow: a one-step
   epoch carries an epoch's fixed cost) restarts the fit once with more steps
   per window: short windows time an epoch's fixed cost more than the step.

A finite input (arrays, a dataset of known length) runs windows whose steps
divide its batches, so that no window is cut short where a pass ends (an
input that restarts its workers at every Keras epoch, whole passes); with
``steps_per_execution=N`` a window's steps are a multiple of N (one call runs N),
and where no multiple of N divides a short pass, the window is the pass.
A window that is a whole pass is fitted without ``steps_per_epoch``, as a
user's epoch is: Keras then starts an iterator at the epoch's start as well
as at the pass's end, where with ``steps_per_epoch`` it starts one only at
the pass's end. Where every window is a pass (``whole_passes``), steps 1
and 2 are one fit: its first pass compiles, its second warms up, and the
windows follow (a rough pass would be a window already, thrown away).

In a job whose steps are collective, every process runs ``epochs`` windows
of the agreed ``k`` steps (no process may stop alone).

Keras's import is inside the functions (this module imports no framework).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from keras_gpu_tools.memory.throughput import (
    STOP_BUDGET,
    STOP_CAP,
    STOP_FIXED,
    TARGET_UNCERTAINTY,
    spread,
    timing_stop,
)
from keras_gpu_tools.runtime.typing_compat import override

logger = logging.getLogger("keras_gpu_tools")

LONG_CPU_BUDGET = 60.0  # seconds: a CPU budget this long times windows of 0.2 s (Pace.for_device)


@dataclasses.dataclass(frozen=True)
class Timing:
    """What one candidate's fits measured."""

    compile_seconds: float
    step_seconds: float  # the mean over the windows
    steps: int
    wall_seconds: float  # the fits, end to end
    uncertainty: float | None = None  # the mean's relative standard error (None under two windows)
    windows: int = 0
    stopped: str = ""  # why the timing stopped (throughput.STOP_*)


@dataclasses.dataclass(frozen=True)
class Pace:
    """How the steady state is timed: windows of about ``epoch_seconds``, from ``min_windows`` to ``max_windows``.

    ``epochs`` is a job's fixed number of windows (every process runs the same steps).
    """

    epoch_seconds: float = 0.25
    epochs: int = 4
    max_steps_per_epoch: int = 500
    min_windows: int = 4
    max_windows: int = 40
    target: float = TARGET_UNCERTAINTY

    @classmethod
    def for_device(cls, on_gpu: bool, max_seconds: float | None = None) -> Pace:
        """The pace on a GPU, or on a CPU; there, a budget of ``max_seconds`` of at least a minute buys longer windows.

        A CPU's steps are slow and steady (no autotuning, no asynchronous
        queue): fewer, shorter windows, unless the budget affords windows long
        enough to time a millisecond step to a few percent on a shared host.
        """
        if on_gpu:
            return cls()
        if max_seconds is not None and max_seconds >= LONG_CPU_BUDGET:
            return cls(epoch_seconds=0.2, epochs=2, max_steps_per_epoch=500, min_windows=4, max_windows=24)
        return cls(epoch_seconds=0.05, epochs=2, max_steps_per_epoch=20, min_windows=3, max_windows=8)

    def steps_for(self, step_seconds: float) -> int:
        """Steps per window for a step of ``step_seconds``: a window of about ``epoch_seconds``, 2 to the most."""
        return int(min(self.max_steps_per_epoch, max(2, round(self.epoch_seconds / max(step_seconds, 1e-6)))))


_PACE: contextvars.ContextVar[Pace | None] = contextvars.ContextVar("keras_gpu_tools_pace", default=None)


@contextlib.contextmanager
def paced(pace: Pace) -> Iterator[None]:
    """Times every candidate planned inside at ``pace``: a caller comparing its own timings with a plan's keeps
    them alike (a window's length moves what it reads)."""
    token = _PACE.set(pace)
    try:
        yield
    finally:
        _PACE.reset(token)


def current_pace(on_gpu: bool) -> Pace:
    """The pace set by :func:`paced`, else the device's."""
    return _PACE.get() or Pace.for_device(on_gpu)


@dataclasses.dataclass(frozen=True)
class FitInput:
    """What the timed fits train on: ``kwargs()`` gives ``model.fit``'s data arguments, fresh for each fit.

    ``batches`` is the batches of one pass over it (None: endless or
    unknown); ``per_call`` the steps one call of the train function runs
    (the model's ``steps_per_execution``); ``whole_passes``: every window is
    one pass (an input that restarts its workers at every Keras epoch, as a
    `PyDataset` does, would pay that restart once per window, not once per pass).
    """

    kwargs: Callable[[], dict[str, Any]]
    batches: int | None = None
    per_call: int = 1
    whole_passes: bool = False

    @classmethod
    def repeated(cls, batch, per_call: int = 1, native: Any = None) -> FitInput:
        """One batch ``(x, y)`` repeated without end: ``native`` where the backend gave its own way (TensorFlow's
        ``tf.data``: Keras feeds a generator through a ``py_function`` per step; JAX's batch already on the
        device: no copy per step), else a generator of the host arrays."""
        if native is not None:
            return cls(lambda: {"x": native}, None, per_call)
        x, y = batch

        def repeat():
            while True:
                yield (x, y) if y is not None else (x,)

        return cls(lambda: {"x": repeat()}, None, per_call)

    def steps(self, k: int) -> int:
        """The steps of a window of about ``k``: a multiple of ``per_call`` that divides ``batches`` where known.

        Where none does, a whole pass of at most twice ``k`` (Keras ends a pass with a shorter call, which a window
        of calls crossing the pass's end would count whole); a longer pass keeps windows of whole calls, one of
        its many windows then counting at most ``per_call - 1`` steps too many.
        """
        n = max(1, self.per_call)
        k = max(n, k - k % n)
        if not self.batches:
            return k
        if self.batches < n:  # one call runs the whole pass: Keras stops a call where the pass ends
            return self.batches
        if self.whole_passes:
            return self.batches
        fitting = [s for s in range(n, min(k, self.batches) + 1, n) if self.batches % s == 0]
        if fitting:
            return fitting[-1]
        return self.batches if self.batches <= 2 * k else k


def _callback(times: list[tuple[str, int, float]], decide: Callable[[list[float]], bool] | None):
    import keras

    class _Clock(keras.callbacks.Callback):
        # Epoch hooks only: a batch hook would make Keras read (and wait for) every step's logs.
        @override
        def on_epoch_begin(self, epoch, logs=None):
            times.append(("begin", epoch, time.perf_counter()))

        @override
        def on_epoch_end(self, epoch, logs=None):
            times.append(("end", epoch, time.perf_counter()))  # Keras has read the logs: the device is done
            if decide is not None and decide(_epochs(times)):
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
    out_of_time: Callable[[float], bool] | None = None,
    job_steps: Callable[[int], int] | None = None,
    share: float | None = None,
    backend: Any = None,
) -> Timing:
    """Times training on ``batch`` (``(x, y)`` arrays) repeated: the first call, then the steady state. See the module.

    ``backend`` (the package's backend object) repeats the batch in the
    framework's own pipeline where it has one (``repeated_batch``).

    ``share`` is the seconds this candidate may take (its compile included)
    before its timing stops short of ``pace.target``; ``out_of_time(seconds)``
    ends the steady state at a window's end where one more window, expected
    to take as long as the last (``seconds``), would outlast the budget;
    ``job_steps`` turns this process's steps per window into the job's:
    where every step is collective (a step over several processes' devices),
    every process must run the same steps, so the count is agreed, the
    windows are ``pace.epochs`` and nothing stops early.
    """
    per_call = int(getattr(model, "steps_per_execution", 1) or 1)
    inputs = FitInput.repeated(batch, per_call, None if backend is None else backend.repeated_batch(batch))
    return time_fit(model, inputs, pace, out_of_time=out_of_time, job_steps=job_steps, share=share)


def _steady(fit, inputs: FitInput, pace: Pace, k: int, stop, resize: bool = True) -> tuple[int, list[float], str]:
    """Windows of ``k`` steps after a warm-up one, until ``stop`` says: ``(k, windows, why it stopped)``. Where
    ``resize`` and the first window came out under half as long as meant (a one-step epoch's fixed cost made the
    rough step slow), the fit starts once more with windows sized by that window."""
    state: dict[str, Any] = {"stopped": "", "resize": False}

    def decide(epochs: list[float]) -> bool:
        done = [d / k for d in epochs[1:]]  # the first window warms up
        if not done:
            return False
        if (
            resize
            and len(done) == 1
            and epochs[1] < pace.epoch_seconds / 2
            and inputs.steps(pace.steps_for(done[0])) > k
        ):
            state["resize"] = True
            return True
        return stop(done, epochs[-1], state)

    epochs = fit(pace.max_windows + 1, k, decide)
    windows = [d / k for d in epochs[1:]] or [d / k for d in epochs]
    if state["resize"]:
        return _steady(fit, inputs, pace, inputs.steps(pace.steps_for(windows[0])), stop, resize=False)
    return k, windows, str(state["stopped"]) or STOP_CAP


def time_fit(
    model,
    inputs: FitInput,
    pace: Pace,
    *,
    out_of_time: Callable[[float], bool] | None = None,
    job_steps: Callable[[int], int] | None = None,
    share: float | None = None,
) -> Timing:
    """Times training on ``inputs``: the first call, then the steady state (see :func:`time_batch` and the module)."""

    def fit(epochs: int, steps: int, decide: Callable[[list[float]], bool] | None) -> list[float]:
        times: list[tuple[str, int, float]] = []
        model.fit(
            **inputs.kwargs(),
            epochs=epochs,
            steps_per_epoch=None if steps == inputs.batches else steps,  # a whole pass: as a user's epoch
            shuffle=False,
            verbose=0,
            callbacks=[_callback(times, decide)],
        )
        return _epochs(times)

    def stop(done: list[float], last: float, state: dict[str, Any]) -> bool:
        """Whether the timing stops after the windows ``done`` (steps' seconds), the last epoch ``last`` long. One
        more window that would outlast the budget is never started, even where only one is done: max_seconds
        holds where a window is a long pass."""
        if out_of_time is not None and out_of_time(last):
            state["stopped"] = STOP_BUDGET
            return True
        if not done:
            return False
        state["stopped"] = timing_stop(
            done,
            elapsed=time.perf_counter() - start,
            share=share,
            min_windows=pace.min_windows,
            max_windows=pace.max_windows,
            target=pace.target,
            window=last,
        )
        return bool(state["stopped"])

    start = time.perf_counter()
    one = inputs.steps(1)  # the fewest steps a window can hold (one call)
    if job_steps is None and inputs.whole_passes and one == inputs.batches:
        # Every window is a pass, the rough epochs' too: no rough step is needed to size one. One fit: its first
        # pass compiles, its second warms up, and the windows follow.
        state: dict[str, Any] = {"stopped": ""}
        epochs = fit(pace.max_windows + 2, one, lambda e: len(e) > 1 and stop([d / one for d in e[2:]], e[-1], state))
        windows = [d / one for d in epochs[2:]] or [d / one for d in epochs[1:]]
        first = epochs[0] - spread(windows)[0] * (one - 1)  # the first pass's steps past its first are steady ones
        k, stopped = one, str(state["stopped"]) or STOP_CAP
    else:
        first, *rough = fit(3, one, None)
        first -= min(rough) * (one - 1) / one  # the first call's steps past its first are steady ones
        k = inputs.steps(pace.steps_for(min(rough) / one))
        if job_steps is not None:
            k = job_steps(k)
            windows = [d / k for d in fit(pace.epochs + 1, k, None)[1:]]
            stopped = STOP_FIXED
        else:
            k, windows, stopped = _steady(fit, inputs, pace, k, stop)
    step, uncertainty = spread(windows)
    # The first call ran one step besides compiling: what it took beyond a steady step is the compile.
    return Timing(
        compile_seconds=max(0.0, first - step),
        step_seconds=step,
        steps=k * len(windows),
        wall_seconds=time.perf_counter() - start,
        uncertainty=uncertainty,
        windows=len(windows),
        stopped=stopped,
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


def forget_compiled_trials(backend, compiled: bool) -> None:
    """Drops the graphs that trial fits compiled from the framework's caches (the backend's method), where any did.

    Trial steps at other batch sizes, or of clones, compile the trainer's one
    step function again; left in the caches they can use up a recompile limit
    and leave the user's own compiled fit slower, or eager.
    """
    if not compiled:
        return
    try:
        backend.forget_compiled_trials()
    except Exception:  # the caches stay as they are; the trials' results stand
        logger.debug("the compiled trials were not dropped", exc_info=True)


__all__ = [
    "FitInput",
    "Pace",
    "Timing",
    "current_pace",
    "fit_side_effects",
    "forget_compiled_trials",
    "paced",
    "restore_side_effects",
    "time_batch",
    "time_fit",
]
