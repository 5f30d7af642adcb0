"""One thread that runs several periodic jobs: the package's one thread in a fit().

A fit() with the package's callbacks needs two periodic jobs off the training
thread: the fit session's watchdog (is fit() still running?) and, with
``GPUUtilizationLogger``, the sampling of the GPUs. They share one thread.
On a machine whose idle CPUs halt (a virtual machine), each thread a process
holds during fit() can cost the training thread time even while it sleeps,
so the package keeps one (docs/decisions/0001-per-step-cost.md).

A job that raises is reported through its ``on_error`` and runs again at its
next time; a slow job delays the others rather than piling up, so a job must be
short (the logger's first sample of a fit waits 0.1 s for its rates; the
watchdog's check is then that much later).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("keras_gpu_tools")


class Job:
    """``fn()`` every ``interval`` seconds on a :class:`Ticker`'s thread, until :meth:`stop`."""

    def __init__(
        self,
        ticker: Ticker,
        interval: float,
        fn: Callable[[], None],
        on_error: Callable[[BaseException], None],
        delay: float = 0.0,
    ):
        self._ticker = ticker
        self.interval = interval
        self.fn = fn
        self.on_error = on_error
        self.next = ticker.clock() + delay  # the first run
        self.stopped = False
        self.poked = False  # soon() was called: run again at once after the run under way
        self._running = threading.RLock()  # held while fn runs: stop() waits for a run under way

    def soon(self) -> None:
        """Runs ``fn()`` at once on the ticker's thread (after the job under way), then at its cadence again.

        For work handed over from another thread (the training thread's): a
        lock and a notify, never a wait for ``fn``. Calls while a run is under
        way make one run after it.
        """
        self._ticker._soon(self)

    def run(self) -> None:
        with self._running:
            if self.stopped:
                return
            self.poked = False  # what was handed over so far, this run sees
            try:
                self.fn()
            except BaseException as e:  # a periodic job never ends the thread, nor the other jobs (the watchdog)
                try:
                    self.on_error(e)
                except Exception:  # a warning turned into an error (-W error), say
                    logger.exception("keras_gpu_tools: reporting a failed periodic job failed")
            with self._ticker._changed:  # beside soon(): a call during the run is not lost
                # A fixed cadence; after a run longer than the interval, or when asked meanwhile, the next is at once.
                now = self._ticker.clock()
                self.next = now if self.poked else max(self.next + self.interval, now)

    def stop(self, timeout: float = 5.0) -> None:
        """No run after this returns (a run under way is waited for, up to ``timeout`` seconds)."""
        self._ticker._remove(self)
        if self._running.acquire(timeout=timeout):  # re-entrant: a job may stop itself
            self._running.release()


class Ticker:
    """Runs :class:`Job` s on one daemon thread, started with the first job, ended by :meth:`close`."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.clock = clock  # the schedule's clock (tests drive it in virtual time)
        self._jobs: list[Job] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def thread(self) -> threading.Thread | None:
        """The thread, once a job has started it."""
        return self._thread

    def every(
        self,
        interval: float,
        fn: Callable[[], None],
        on_error: Callable[[BaseException], None],
        delay: float = 0.0,
    ) -> Job:
        """Runs ``fn()`` after ``delay`` seconds, then every ``interval``; ``fn``'s exceptions go to ``on_error``."""
        job = Job(self, interval, fn, on_error, delay)
        with self._changed:
            if self._closed:
                raise RuntimeError(f"keras_gpu_tools: the thread {self.name!r} has ended")
            self._jobs.append(job)
            thread = None
            if self._thread is None:
                thread = self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._changed.notify()
        if thread is not None:
            thread.start()
        return job

    def close(self, timeout: float = 2.0) -> None:
        """Stops the thread after the job under way (waited for, up to ``timeout``, unless called from it)."""
        with self._changed:
            self._closed = True
            for job in self._jobs:
                job.stopped = True
            self._jobs.clear()
            self._changed.notify()
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            t.join(timeout)

    def _soon(self, job: Job) -> None:
        with self._changed:
            if job.stopped or self._closed:
                return
            job.poked = True
            job.next = min(job.next, self.clock())
            self._changed.notify()

    def _remove(self, job: Job) -> None:
        with self._changed:
            job.stopped = True
            if job in self._jobs:
                self._jobs.remove(job)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    if self._closed:
                        return
                    now = self.clock()
                    due = [job for job in self._jobs if job.next <= now]
                    if due:
                        break
                    wake = min((job.next for job in self._jobs), default=None)
                    self._changed.wait(None if wake is None else wake - now)
            for job in due:
                job.run()
