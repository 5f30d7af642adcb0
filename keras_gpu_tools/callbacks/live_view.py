"""LiveView: a compact view of the running fit() that updates in place in Jupyter."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from keras_gpu_tools.callbacks._lean import LeanCallback
from keras_gpu_tools.live.render import LiveState, NotebookDisplay, in_notebook, render
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.validation import check_callable, check_choice, check_number

logger = logging.getLogger("keras_gpu_tools")

EPOCH_GAP_S = 0.05  # an epoch end redraws unless the view was drawn this recently


class LiveView(LeanCallback):
    """Shows a small table with sparklines that updates in place during `fit()` in Jupyter.

    It reads what the package's other callbacks in the same `fit()` measure
    (GPU utilization and memory from `GPUUtilizationLogger`; from
    `InputBoundDetector` the input wait of its last window, with the steps
    named, and the run's verdict so far, with its span; OOM recoveries;
    profiler windows, with their input wait beside xprof's) plus the
    loss and the step time, and redraws every `interval` seconds and at each
    epoch end (epochs shorter than 50 ms: at most 20 times a second). Outside a
    notebook it does nothing (the default `enabled="auto"`).

    A redraw is an HTML table with inline SVG sparklines, drawn on the
    training thread (no matplotlib, no device sync: the loss is read every
    `interval` seconds, not every step): a redraw costs a few milliseconds,
    the per-step cost is one clock read.

    Args:
        interval: seconds between redraws. Defaults to `2.0`.
        enabled: `"auto"` (on in a Jupyter kernel, off elsewhere), `True`
            or `False`. Defaults to `"auto"`.
        display: a function taking the view's HTML, used instead of the
            notebook's display (for tests, or to send it elsewhere).
            Defaults to `None`.

    Example:

    ```python
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, LiveView

    model.fit(dataset, epochs=5, callbacks=[
        GPUUtilizationLogger(log_dir="logs"), InputBoundDetector(log_dir="logs"), LiveView()])
    ```
    """

    def __init__(
        self,
        interval: float = 2.0,
        enabled: bool | str = "auto",
        display: Callable[[str], None] | None = None,
    ):
        super().__init__()
        self.interval = check_number("interval", interval, low=0, exclusive_low=True, what="number of seconds")
        self.enabled = check_choice("enabled", enabled, ("auto", True, False))
        self.display = check_callable("display", display, what="a function of one HTML string")
        self.redraws = 0
        self.redraw_seconds = 0.0  # time spent drawing, for the overhead benchmark
        self._active = False
        self._out: Callable[[str], None] | None = None
        self._state = LiveState()
        self._next = 0.0
        self._last = -math.inf  # when the view was last drawn
        self._epoch_base = 0
        self._steps_cap = 1 << 62  # the fit's steps per epoch, where Keras knows them

    @property
    def active(self) -> bool:
        return self._active

    def on_train_begin(self, logs: dict | None = None) -> None:
        on = self.enabled is True or (self.enabled == "auto" and (self.display is not None or in_notebook()))
        self._active = False
        if not on:
            return
        try:
            self._out = self.display or NotebookDisplay()
        except Exception as e:  # no IPython: nothing to show, never fatal
            logger.info("LiveView: no notebook display (%s: %s); off for this fit().", type(e).__name__, e)
            return
        st = LiveState()
        try:
            st.attach([cb for cb in ki.find_callback_list(self.model) if cb is not self])
        except Exception:
            pass
        st.epochs = (self.params or {}).get("epochs")
        steps = (self.params or {}).get("steps")
        self._steps_cap = int(steps) if steps else 1 << 62  # read once a fit, not per step
        st.started = time.monotonic()
        self._state = st
        self._active = True
        self._next = st.started + min(self.interval, 1.0)  # a first picture soon
        self._last = -math.inf

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._state.epoch = epoch
        self._epoch_base = self._state.step

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._active:
            return
        st = self._state
        # With steps_per_execution=N, Keras reports the last batch of the execution,
        # also for a last, partial one (index 15 in an epoch of 15 steps): capped by the epoch's steps.
        done = batch + 1
        if done > self._steps_cap:
            done = self._steps_cap
        step = self._epoch_base + done
        if step > st.step:
            st.step = step
        if logs is not None:
            st.logs = logs
        now = time.monotonic()
        if now >= self._next:
            self._redraw(now)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._active:
            if logs is not None:
                self._state.logs = logs
            now = time.monotonic()
            # Each epoch's end is shown, but at most every EPOCH_GAP_S: a fit of many tiny
            # epochs would otherwise redraw (and send the notebook a new view) every few
            # milliseconds. The redraw that is due next shows it.
            if now - self._last >= EPOCH_GAP_S or now >= self._next:
                self._redraw(now)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._active:
            self._state.done = True
            self._redraw(time.monotonic())
            self._active = False

    def _redraw(self, now: float) -> None:
        t0 = time.perf_counter()
        try:
            self._state.note_redraw(now)
            assert self._out is not None  # set whenever the view is active, the only time it redraws
            self._out(render(self._state, now))
        except Exception as e:  # a display problem must never stop training
            logger.warning("LiveView: redraw failed (%s: %s); the view is off for this fit().", type(e).__name__, e)
            self._active = False
        self.redraws += 1
        self.redraw_seconds += time.perf_counter() - t0
        self._next = now + self.interval
        self._last = now
