"""Cleaning up when fit() ends without calling ``on_train_end``.

Keras calls ``on_train_end`` only when fit() returns normally. When an
exception escapes fit() (another callback raised, KeyboardInterrupt, an error in
a step), nothing tells a callback that training is over. :class:`FitGuard`
records the ``fit`` frame that called ``on_train_begin`` and a light daemon
thread checks, a few times a second, that this frame is still on the training
thread's stack. When it is gone, ``on_abort`` runs once, on the guard's thread.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Callable, Optional

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


class FitGuard:
    """Calls ``on_abort`` once if the watched fit() leaves the stack.

    Args:
        model: the model whose ``fit`` is running.
        on_abort: called (on the guard's thread) when fit() ended without the
            guard being closed first.
        interval: seconds between checks. Defaults to `0.2`.
    """

    def __init__(self, model, on_abort: Callable[[], None], interval: float = 0.2, name: str = "keras_gpu_tools-fit-guard"):
        self._on_abort = on_abort
        self._interval = interval
        self._stop = threading.Event()
        self._thread_id = threading.get_ident()
        frame = find_fit_frame(model, sys._getframe(1))
        self._frame_id = id(frame) if frame is not None else None
        self._frame_code = frame.f_code if frame is not None else None
        del frame
        self._thread: Optional[threading.Thread] = None
        if self._frame_id is not None:
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
                if self._stop.is_set():
                    return
                logger.debug("fit() ended without on_train_end: cleaning up")
                try:
                    self._on_abort()
                except Exception:  # cleanup must not raise on a daemon thread
                    logger.exception("keras_gpu_tools: cleanup after a failed fit() raised")
                return

    def close(self) -> None:
        """Stops watching (call from ``on_train_end`` or the cleanup itself)."""
        self._stop.set()
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            t.join(2.0)
