"""Waits on events and virtual time for the tests of the package's thread (Ticker, Drawer, LiveView, FitSession).

The deadlines are generous: they cost nothing when the test passes, and a loaded machine never reaches them.
"""

import threading
import time
from types import SimpleNamespace

from keras_gpu_tools.callbacks import live_view
from keras_gpu_tools.live.drawer import Drawer

TIMEOUT_S = 30.0


def wait_until(predicate, timeout=TIMEOUT_S):
    """Polls ``predicate`` until it holds, up to ``timeout`` seconds; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


def package_threads():
    return [t for t in threading.enumerate() if t.name.startswith("keras_gpu_tools") and t.is_alive()]


def join_package_threads(timeout=TIMEOUT_S):
    """Joins the package's threads: nothing of theirs runs after this (asserted by the caller)."""
    for t in package_threads():
        t.join(timeout)
    return package_threads()


class VirtualClock:
    """A clock the test moves by hand (a Ticker's or LiveView's)."""

    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def step_ticker(clock, jobs, until, timeout=TIMEOUT_S):
    """Moves ``clock`` from one due time of ``jobs`` to the next, each once the ticker has run what was due.

    The ticker's thread then runs every job at exactly its scheduled virtual time, however late it wakes.
    """
    while True:
        assert wait_until(lambda: all(job.next > clock.now for job in jobs), timeout), "the ticker fell behind"
        if until():
            return
        clock.now = min(job.next for job in jobs)


class CallerThreadDrawer(Drawer):
    """A Drawer that never starts a job: every picture handed over is drawn at once, on the caller's thread."""

    def start(self, every):
        pass


def draw_on_callers_thread(monkeypatch):
    """LiveView draws each picture it hands over synchronously: the pictures are exactly the hand-overs."""
    monkeypatch.setattr(live_view, "Drawer", CallerThreadDrawer)


def patch_live_view_clock(monkeypatch, clock):
    """LiveView's monotonic clock (when to redraw) becomes ``clock``; its draw timer stays real."""
    monkeypatch.setattr(live_view, "time", SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter))
