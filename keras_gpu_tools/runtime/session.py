"""One fit() of one model, shared by all our callbacks, and its end however it ends.

Keras calls ``on_train_end`` only when fit() returns normally. When an
exception escapes fit() (another callback raised, KeyboardInterrupt, an error
in a step), nothing tells a callback that training is over. A
:class:`FitSession` stands for one running ``model.fit`` and runs the
teardowns its callbacks registered, once, when that fit ends:

- normally: each callback's ``on_train_end`` stops its own part and releases it;
- on Python 3.12+, at the moment fit() raises, on the training thread, while a
  callback asks for it (``sys.monitoring``'s PY_UNWIND event; see
  :meth:`FitSession.watch_unwind`);
- when a later fit() on the same model calls a step hook left behind, or one
  of our callbacks starts it (:meth:`FitSession.current`), on the training
  thread, before that fit runs a step;
- as a safety net on every version, from the session's one thread, which
  checks a few times a second that the fit's frame is still on the training
  thread's stack. Callbacks run their own periodic work on the same thread
  (:meth:`FitSession.every`): a fit holds one thread of the package's.

The session keeps a strong reference to fit()'s frame until it closes. That is
what makes "is this the same fit?" exact: CPython reuses the address of a dead
frame for the next call, so ``id(frame)`` alone would mistake a new fit() for
one that had died.

Teardowns that must run on the training thread (torch's profiler can only be
stopped there) are deferred when the watchdog notices first, and run at the
training thread's next contact with the package (:func:`run_deferred`).
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.errors import KerasGPUToolsWarning
from keras_gpu_tools.runtime.keras_internals.fit import find_fit_frame
from keras_gpu_tools.runtime.ticker import Job, Ticker

logger = logging.getLogger("keras_gpu_tools")

Teardown = Callable[[bool], None]  # teardown(aborted)

_registry_lock = threading.Lock()
_sessions: dict[int, FitSession] = {}  # id(model) -> its open session
_deferred: list[tuple[int, Callable[[], None]]] = []  # (thread id, fn) to run on that thread


def run_deferred() -> None:
    """Runs the teardowns deferred to the calling thread (cheap when there are none)."""
    if not _deferred:
        return
    me = threading.get_ident()
    with _registry_lock:
        mine = [fn for tid, fn in _deferred if tid == me]
        _deferred[:] = [(tid, fn) for tid, fn in _deferred if tid != me]
    for fn in mine:
        _call_safely(fn)


def _call_safely(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # cleanup must never raise into training or a daemon thread
        logger.exception("keras_gpu_tools: cleanup after fit() raised")


class FitSession:
    """One running ``model.fit``; use :meth:`current` from ``on_train_begin``."""

    interval = 0.2  # seconds between the watchdog's checks

    def __init__(self, model, frame):
        self.model_id = id(model)
        self.frame = frame  # strong: its address cannot be reused while we hold it
        self.code = frame.f_code if frame is not None else None
        self.thread_id = threading.get_ident()
        self._lock = threading.RLock()
        self._teardowns: dict[int, tuple[Any, Teardown, Any]] = {}  # id(owner) -> (owner, fn, training_thread)
        self._ticker = Ticker("keras_gpu_tools-fit")
        self._watchdog: Job | None = None
        self._check_failed = False
        self.closed = False
        self.aborted = False
        self.unwind_hook = False
        self.shared: dict[str, Any] = {}  # what the fit's callbacks share (the job's channel), by name
        self._on_close: list[Callable[[], None]] = []

    # -- finding the session of this fit -------------------------------------------------------
    @classmethod
    def current(cls, model) -> FitSession:
        """The session of the fit() now calling, created if needed.

        A session of an earlier fit() of this model that did not end cleanly is
        aborted first, here on the training thread, so nothing of it can run
        inside the new fit.
        """
        run_deferred()
        frame = find_fit_frame(model, sys._getframe(1))
        with _registry_lock:
            old = _sessions.get(id(model))
            if old is not None and not old.closed and frame is not None and old.frame is frame:
                return old
        if old is not None and not old.closed:
            logger.debug("keras_gpu_tools: ending what a fit() that did not end cleanly left behind")
            old.abort(on_training_thread=True)
        session = cls(model, frame)
        del frame
        with _registry_lock:
            _sessions[id(model)] = session
        return session

    # -- registering ----------------------------------------------------------------------------
    def add(self, owner, teardown: Teardown, training_thread: bool | Callable[[], bool] = False) -> None:
        """Registers ``teardown(aborted)`` of ``owner``, run once when this fit ends.

        With ``training_thread`` (or when it returns True at the time of the
        abort), an abort noticed on another thread defers the teardown to the
        training thread's next contact with the package.
        """
        with self._lock:
            if self.closed:
                raise RuntimeError("keras_gpu_tools: this fit() session has ended")
            self._teardowns[id(owner)] = (owner, teardown, training_thread)
            if self._watchdog is None and self.frame is not None:
                self._watchdog = self._ticker.every(
                    self.interval, self._check, self._on_check_error, delay=self.interval
                )

    def every(self, interval: float, fn: Callable[[], None], on_error: Callable[[BaseException], None]) -> Job:
        """Runs ``fn()`` now and every ``interval`` seconds on the session's thread, until the job's ``stop()``.

        The watchdog's thread: one thread of the package's for the whole fit().
        The session's end stops every job left.
        """
        with self._lock:
            if self.closed:
                raise RuntimeError("keras_gpu_tools: this fit() session has ended")
            return self._ticker.every(interval, fn, on_error)

    def on_close(self, fn: Callable[[], None]) -> None:
        """Runs ``fn()`` once when the session closes (after every teardown), however the fit ended."""
        with self._lock:
            if self.closed:
                raise RuntimeError("keras_gpu_tools: this fit() session has ended")
            self._on_close.append(fn)

    @property
    def thread(self) -> threading.Thread | None:
        """The session's thread (the watchdog and the callbacks' periodic jobs), once started."""
        return self._ticker.thread

    def watch_unwind(self, on: bool) -> bool:
        """Runs the teardowns on the training thread the moment fit() raises (Python 3.12+), while ``on``.

        ``sys.monitoring``'s PY_UNWIND event is global: while it is on, every
        exception leaving any Python frame calls us, which cost about 16 us per
        JAX step. So it is on only while something needs the training thread at
        once (a torch profiler window); the rest waits for the watchdog or the
        next fit. Returns whether the event is being watched.
        """
        with self._lock:
            if on and not self.unwind_hook and not self.closed and self.frame is not None:
                self.unwind_hook = _watch_unwind(self)
            elif not on and self.unwind_hook:
                self.unwind_hook = False
                _unwatch_unwind(self)
            return self.unwind_hook

    def release(self, owner) -> None:
        """``owner`` has stopped by itself (its ``on_train_end``); the last one closes the session."""
        with self._lock:
            self._teardowns.pop(id(owner), None)
            last = not self._teardowns
        if last:
            self._close()

    # -- the end of fit() ----------------------------------------------------------------------
    def is_fit_frame(self, frame) -> bool:
        """Whether ``frame`` is, or is called from, this session's fit() (walks at most 8 frames).

        A session that could not find fit()'s frame accepts every caller.
        """
        if self.frame is None:
            return not self.closed
        for _ in range(8):
            if frame is None:
                return False
            if frame is self.frame:
                return True
            frame = frame.f_back
        return False

    def fit_is_running(self) -> bool:
        """Whether fit()'s frame is still executing, asked from any thread.

        Walking the training thread's stack from another thread
        (``sys._current_frames()``, then ``f_back``) crashed Python 3.11 with a
        segmentation fault while torch ran a backward pass. ``frame.clear()``
        only reads the frame's owner while the frame executes ("cannot clear
        an executing frame"), which is safe from any thread under the GIL. Once
        fit() has returned or raised, it drops fit()'s locals (the model, the
        data, Keras's iterators), which this session was keeping alive anyway.
        """
        frame = self.frame
        if frame is None:
            return False
        try:
            frame.clear()
        except RuntimeError:
            return True
        return False

    def abort(self, on_training_thread: bool) -> None:
        """fit() ended without ``on_train_end``: runs every teardown left, once."""
        with self._lock:
            if self.closed:
                return
            self.aborted = True
            entries = list(self._teardowns.values())
            self._teardowns.clear()
        for _owner, fn, training_thread in entries:
            if callable(training_thread):
                training_thread = training_thread()
            if training_thread and not on_training_thread:
                with _registry_lock:
                    _deferred.append((self.thread_id, (lambda f: lambda: f(True))(fn)))
            else:
                _call_safely((lambda f: lambda: f(True))(fn))
        self._close()

    def _close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.frame = None  # let fit()'s locals go
            on_close, self._on_close = self._on_close, []
        _unwatch_unwind(self)
        for fn in on_close:
            _call_safely(fn)
        with _registry_lock:
            if _sessions.get(self.model_id) is self:
                del _sessions[self.model_id]
        self._ticker.close()

    def _check(self) -> None:
        """The watchdog's job: aborts the session once fit()'s frame has stopped executing."""
        with self._lock:
            if self.closed:
                return
            running = self.fit_is_running()
        if not running:
            logger.debug("keras_gpu_tools: fit() ended without on_train_end: cleaning up")
            self.abort(on_training_thread=False)

    def _on_check_error(self, error: BaseException) -> None:
        if not self._check_failed:  # once a fit: it runs five times a second
            self._check_failed = True
            warnings.warn(
                f"keras_gpu_tools: checking whether fit() still runs failed ({type(error).__name__}: {error}); "
                "it tries again, and what the callbacks started is released when fit() ends or at the next fit()",
                KerasGPUToolsWarning,
                stacklevel=1,
            )


def session_of(model) -> FitSession | None:
    """The open session of ``model``, if any."""
    return _sessions.get(id(model))


# -- PY_UNWIND on Python 3.12+ ---------------------------------------------------------------
_unwind_lock = threading.Lock()
_unwind_watch: dict = {}  # code object of fit -> sessions
_unwind_tool: int | None = None
_unwind_failed = False


def _on_unwind(code, offset, exc):
    sessions = _unwind_watch.get(code)
    if not sessions:
        return
    frame = sys._getframe(1)
    for session in list(sessions):
        if session.frame is frame:
            session.abort(on_training_thread=True)


def _watch_unwind(session: FitSession) -> bool:
    global _unwind_tool, _unwind_failed
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None or _unwind_failed or session.code is None:
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
        _unwind_watch.setdefault(session.code, []).append(session)
    return True


def _unwatch_unwind(session: FitSession) -> None:
    monitoring = getattr(sys, "monitoring", None)
    with _unwind_lock:
        sessions = _unwind_watch.get(session.code)
        if not sessions or session not in sessions:
            return
        sessions.remove(session)
        if not sessions:
            del _unwind_watch[session.code]
        if not _unwind_watch and _unwind_tool is not None and monitoring is not None:
            monitoring.set_events(_unwind_tool, 0)
