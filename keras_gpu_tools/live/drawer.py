"""The live view drawn off the training thread: the newest snapshot, on the fit session's thread.

The training thread only takes a :class:`Snapshot` (a few numbers and a copy
of Keras's logs dict) and hands it over (:meth:`Drawer.hand_over`: a lock and a
notify). The session's thread renders it and calls the display. A snapshot
handed over while a draw is under way replaces the one waiting, if any: the view
shows the newest state, and nothing queues up behind a slow display. At fit()'s
end :meth:`Drawer.finish` hands the final state over and waits for it, up to a
timeout: a display that blocks never holds fit() up for longer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.live.render import LiveState, render
from keras_gpu_tools.runtime.ticker import Job

IDLE_S = 3600.0  # the drawing job's cadence when nothing is handed over: it runs when asked (Job.soon)


@dataclass(frozen=True)
class Snapshot:
    """What one picture shows of the training thread's state, taken at ``now`` (the monotonic clock)."""

    now: float
    epoch: int
    step: int
    logs: dict[str, Any] = field(default_factory=dict)
    done: bool = False


class Drawer:
    """Draws :class:`Snapshot` s of ``state`` into ``out`` on a job of the fit session's thread.

    Args:
        state: what the view shows besides the snapshot (the other callbacks, the sparklines' points);
            only this drawer's thread changes it once drawing started.
        out: the display, a function of one HTML string.
        drawn: called after each draw with its seconds (the view's counters).
        failed: called once with the display's exception; nothing is drawn after it.
    """

    def __init__(
        self,
        state: LiveState,
        out: Callable[[str], None],
        drawn: Callable[[float], None],
        failed: Callable[[BaseException], None],
    ):
        self.state = state
        self._out = out
        self._drawn = drawn
        self._failed = failed
        self._lock = threading.Condition(threading.Lock())
        self._pending: Snapshot | None = None
        self._handed = 0  # snapshots handed over
        self._done = 0  # of them, drawn or dropped for a newer one
        self._job: Job | None = None
        self.off = False  # the display failed, or the drawer stopped: nothing more is drawn

    def start(self, every: Callable[[float, Callable[[], None], Callable[[BaseException], None]], Job]) -> None:
        """Draws on the job ``every(interval, fn, on_error)`` makes (``FitSession.every``); else on the caller's thread."""
        self._job = every(IDLE_S, self._draw_pending, self._job_failed)

    @property
    def job(self) -> Job | None:
        """The drawing job on the session's thread (None: drawn on the training thread)."""
        return self._job

    def hand_over(self, snap: Snapshot) -> None:
        """Has ``snap`` drawn soon (replacing one not yet drawn); never waits for a draw."""
        if self.off:
            return
        with self._lock:
            self._pending = snap
            self._handed += 1
        job = self._job
        if job is None:
            self._draw_pending()  # no session thread: drawn here, as before
        else:
            job.soon()

    def finish(self, snap: Snapshot, timeout: float) -> bool:
        """Hands the final ``snap`` over and waits until it is drawn, up to ``timeout`` seconds; False if not."""
        if self.off:
            return True
        self.hand_over(snap)
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._handed
            while self._done < target and not self.off:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def stop(self) -> None:
        """Nothing is drawn after this; never waits for a draw under way (a display that blocks)."""
        self.off = True
        job, self._job = self._job, None
        if job is not None:
            job.stop(timeout=0)
        with self._lock:
            self._pending = None
            self._lock.notify_all()

    def _draw_pending(self) -> None:
        while True:
            with self._lock:
                snap, self._pending = self._pending, None
                handed = self._handed
            if snap is None or self.off:
                return
            self._draw(snap)
            with self._lock:
                self._done = handed  # those handed over before it are shown by it
                self._lock.notify_all()

    def _draw(self, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        st = self.state
        try:
            st.epoch, st.step, st.logs, st.done = snap.epoch, snap.step, snap.logs, snap.done
            st.note_redraw(snap.now)
            self._out(render(st, snap.now))
        except Exception as e:  # a display problem must never stop training
            self.off = True
            self._failed(e)
        finally:
            self._drawn(time.perf_counter() - t0)

    def _job_failed(self, error: BaseException) -> None:  # _draw catches the display's errors; this is the rest
        self.off = True
        self._failed(error)
