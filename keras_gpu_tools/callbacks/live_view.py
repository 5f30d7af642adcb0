"""LiveView: a compact view of the running fit() that updates in place in Jupyter."""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable

from keras_gpu_tools.callbacks._lean import LeanCallback
from keras_gpu_tools.errors import KerasGPUToolsWarning
from keras_gpu_tools.live.drawer import Drawer, Snapshot
from keras_gpu_tools.live.render import LiveState, NotebookDisplay, in_notebook
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.session import FitSession
from keras_gpu_tools.runtime.typing_compat import override
from keras_gpu_tools.runtime.validation import check_callable, check_choice, check_number
from keras_gpu_tools.runtime.warn_once import WarnOnce

logger = logging.getLogger("keras_gpu_tools")

EPOCH_GAP_S = 0.05  # an epoch end redraws unless the view was drawn this recently
FINAL_WAIT_S = 1.0  # how long fit()'s end waits for the last picture (a display that blocks)


class _Progress:
    """Where the fit is, as the training thread counts it (what a snapshot copies)."""

    __slots__ = ("epoch", "logs", "step")

    def __init__(self) -> None:
        self.epoch = 0
        self.step = 0
        self.logs: dict | None = None


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

    A redraw is an HTML table with inline SVG sparklines (no matplotlib, no
    device sync: the loss is read every `interval` seconds, not every step),
    drawn on the fit session's thread: the training thread only copies the
    step, the epoch and Keras's logs, and hands them over. A redraw due while
    the last one is still drawing replaces the one waiting: the view shows the
    newest state and nothing queues up. The last picture (`Done`) is drawn
    before `fit()` returns; a display that does not return within a second is
    given up with a warning. The per-step cost is one clock read.

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
        self.redraws = 0  # pictures drawn (on the session's thread)
        self.redraw_seconds = 0.0  # time spent drawing them, for the overhead benchmark
        self.warnings = WarnOnce(KerasGPUToolsWarning)
        self._active = False
        self._lock = threading.Lock()  # the fit's end, from on_train_end or the session's abort
        self._session: FitSession | None = None
        self._drawer: Drawer | None = None
        self._state = _Progress()
        self._next = 0.0
        self._last = -math.inf  # when the view was last handed over to be drawn
        self._epoch_base = 0
        self._steps_cap = 1 << 62  # the fit's steps per epoch, where Keras knows them

    @property
    def active(self) -> bool:
        return self._active

    @override
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._end(aborted=True)  # what a fit() that died unnoticed left
        on = self.enabled is True or (self.enabled == "auto" and (self.display is not None or in_notebook()))
        if not on:
            return
        try:
            out = self.display or NotebookDisplay()
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
        drawer = Drawer(st, out, self._drawn, self._display_failed)
        session: FitSession | None = None
        try:  # drawn on the session's thread; without one (never expected), on the training thread
            session = FitSession.current(self.model)
            session.add(self, functools.partial(self._end, session=session))
            drawer.start(session.every)
        except Exception as e:
            logger.debug("LiveView: drawing on the training thread (%s: %s)", type(e).__name__, e)
            if session is not None and drawer.job is None:
                session.release(self)
                session = None
        with self._lock:
            self._session, self._drawer = session, drawer
        self._state = _Progress()
        self._active = True
        self._next = st.started + min(self.interval, 1.0)  # a first picture soon
        self._last = -math.inf

    @override
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._state.epoch = epoch
        self._epoch_base = self._state.step

    @override
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

    @override
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

    @override
    def on_train_end(self, logs: dict | None = None) -> None:
        drawer = self._drawer
        if self._active and drawer is not None:
            if not drawer.finish(self._snapshot(time.monotonic(), done=True), FINAL_WAIT_S):
                self.warnings(
                    "blocked",
                    f"LiveView: the display did not return within {FINAL_WAIT_S:g} s; the last picture may be "
                    "missing, and the view is off for this fit(). Training is not affected.",
                )
        self._end(aborted=False)

    def close(self) -> None:
        """Stops drawing what a fit() that died unnoticed left; safe to call twice."""
        self._end(aborted=True)

    def _snapshot(self, now: float, done: bool = False) -> Snapshot:
        st = self._state
        return Snapshot(now, st.epoch, st.step, dict(st.logs) if st.logs else {}, done)

    def _redraw(self, now: float) -> None:
        drawer = self._drawer
        if drawer is not None:
            drawer.hand_over(self._snapshot(now))
        self._next = now + self.interval
        self._last = now

    def _drawn(self, seconds: float) -> None:  # the drawer's thread, after each picture
        self.redraws += 1
        self.redraw_seconds += seconds

    def _display_failed(self, e: BaseException) -> None:  # the drawer's thread, once
        logger.warning("LiveView: redraw failed (%s: %s); the view is off for this fit().", type(e).__name__, e)
        self._active = False

    def _end(self, aborted: bool, session: FitSession | None = None) -> None:
        """Stops drawing (``aborted``: fit() raised) and releases the fit's session, once per fit."""
        with self._lock:
            if session is not None and self._session is not session:
                return  # that fit has already ended here
            drawer, self._drawer = self._drawer, None
            current, self._session = self._session, None
            self._active = False
        if drawer is not None:
            drawer.stop()
        if current is not None:
            current.release(self)
