"""Cleaning up when fit() ends without calling ``on_train_end``.

Keras calls ``on_train_end`` only when fit() returns normally. When an
exception escapes fit() (another callback raised, KeyboardInterrupt, an error in
a step), nothing tells a callback that training is over. :class:`FitGuard`
records the ``fit`` frame that called ``on_train_begin`` and runs ``on_abort``
once when that frame goes away without the guard being closed first:

- On Python 3.12 and newer, at the moment fit() raises, on the training thread
  itself (``sys.monitoring``'s PY_UNWIND event, enabled only while a guard is
  open; the callback is a dict lookup for any other function that unwinds).
  Cleanup that must run on the thread that started something (the torch
  profiler) works there.
- Always, as a safety net and on older Pythons: a light daemon thread checks a
  few times a second that the frame is still on the training thread's stack
  and runs ``on_abort`` on its own thread when it is gone.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

logger = logging.getLogger("keras_gpu_tools")

_FIT_NAMES = ("fit",)


def find_fit_frame(model, start=None):
    """The innermost frame of ``model.fit`` on the current stack, or None."""
    frame = start or sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _FIT_NAMES and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


# -- PY_UNWIND on Python 3.12+ -------------------------------------------------
_unwind_lock = threading.Lock()
_unwind_watch: dict = {}  # code object of fit -> list of guards
_unwind_tool: int | None = None
_unwind_failed = False


def _on_unwind(code, offset, exc):
    guards = _unwind_watch.get(code)
    if not guards:
        return
    frame_id = id(sys._getframe(1))
    for guard in list(guards):
        if guard._frame_id == frame_id:
            guard._fire(on_training_thread=True)


def _watch_unwind(guard: FitGuard) -> bool:
    global _unwind_tool, _unwind_failed
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None or _unwind_failed:
        return False
    with _unwind_lock:
        if _unwind_tool is None:
            for tool in (4, 3):  # ids not reserved for debuggers, coverage, profilers, optimizers
                try:
                    monitoring.use_tool_id(tool, "keras_gpu_tools")
                except ValueError:
                    continue
                _unwind_tool = tool
                monitoring.register_callback(tool, monitoring.events.PY_UNWIND, _on_unwind)
                break
            else:
                _unwind_failed = True
                return False
        if not _unwind_watch:
            monitoring.set_events(_unwind_tool, monitoring.events.PY_UNWIND)
        _unwind_watch.setdefault(guard._frame_code, []).append(guard)
    return True


def _unwatch_unwind(guard: FitGuard) -> None:
    monitoring = getattr(sys, "monitoring", None)
    with _unwind_lock:
        guards = _unwind_watch.get(guard._frame_code)
        if not guards or guard not in guards:
            return
        guards.remove(guard)
        if not guards:
            del _unwind_watch[guard._frame_code]
        if not _unwind_watch and _unwind_tool is not None:
            monitoring.set_events(_unwind_tool, 0)


class FitGuard:
    """Calls ``on_abort`` once if the watched fit() leaves the stack.

    Args:
        model: the model whose ``fit`` is running.
        on_abort: called (on the guard's thread) when fit() ended without the
            guard being closed first.
        interval: seconds between checks. Defaults to `0.2`.
    """

    def __init__(
        self, model, on_abort: Callable[[], None], interval: float = 0.2, name: str = "keras_gpu_tools-fit-guard"
    ):
        self._on_abort = on_abort
        self._interval = interval
        self._stop = threading.Event()
        self._thread_id = threading.get_ident()
        frame = find_fit_frame(model, sys._getframe(1))
        self._frame_id = id(frame) if frame is not None else None
        self._frame_code = frame.f_code if frame is not None else None
        del frame
        self._thread: threading.Thread | None = None
        self._fired = False
        self._fire_lock = threading.Lock()
        self.unwind_hook = False
        if self._frame_id is not None:
            self.unwind_hook = _watch_unwind(self)
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    @property
    def watching(self) -> bool:
        return self._thread is not None

    def fit_is_running(self) -> bool:
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if id(frame) == self._frame_id and frame.f_code is self._frame_code:
                return True
            frame = frame.f_back
        return False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self.fit_is_running():
                self._fire(on_training_thread=False)
                return

    def _fire(self, on_training_thread: bool) -> None:
        with self._fire_lock:
            if self._fired or self._stop.is_set():
                return
            self._fired = True
        self.aborted_on_training_thread = on_training_thread
        logger.debug("fit() ended without on_train_end: cleaning up")
        try:
            self._on_abort()
        except Exception:  # cleanup must never raise into training or a daemon thread
            logger.exception("keras_gpu_tools: cleanup after a failed fit() raised")
        finally:
            self._stop.set()
            _unwatch_unwind(self)

    def close(self) -> None:
        """Stops watching (call from ``on_train_end`` or the cleanup itself)."""
        self._stop.set()
        _unwatch_unwind(self)
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            t.join(2.0)
