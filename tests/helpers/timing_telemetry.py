"""Waits on events instead of the clock, for tests that would otherwise race a deadline.

``manual_sampling(monkeypatch)`` makes ``FitSession.every`` hand back a :class:`ManualJob` that nothing
schedules; a :class:`TickAt` callback (placed after the logger) runs it on the training thread at the
batches it names. What was sampled, and at which step, is then exact however loaded the machine is.

``fifo_reader_seen(fifo)`` tells whether anything ever opened a FIFO for reading, whatever the time it took.
"""

from __future__ import annotations

import contextlib
import os
import threading

import keras

from keras_gpu_tools.runtime.session import FitSession


class ManualJob:
    """Stands in for the session's periodic job: runs only when the test says."""

    def __init__(self, fn, on_error):
        self.fn, self.on_error, self.stopped, self.runs = fn, on_error, False, 0

    def run(self) -> None:
        if self.stopped:
            return
        self.runs += 1
        try:
            self.fn()
        except BaseException as e:  # as the session's thread reports it
            self.on_error(e)

    def soon(self) -> None:
        self.run()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True


def manual_sampling(monkeypatch) -> list[ManualJob]:
    """The jobs ``FitSession.every`` is asked for from now on, newest last; none of them runs by itself."""
    jobs: list[ManualJob] = []

    def every(session, interval, fn, on_error):
        jobs.append(ManualJob(fn, on_error))
        return jobs[-1]

    monkeypatch.setattr(FitSession, "every", every)
    return jobs


class TickAt(keras.callbacks.Callback):
    """Runs the newest job at the end of the batches in ``batches`` (indices within each epoch)."""

    def __init__(self, jobs: list[ManualJob], batches, on_batch=None):
        super().__init__()
        self.jobs, self.batches, self.on_batch = jobs, set(batches), on_batch

    def on_train_batch_end(self, batch, logs=None):
        if self.on_batch is not None:
            self.on_batch(batch)
        if batch in self.batches:
            self.jobs[-1].run()


@contextlib.contextmanager
def fifo_reader_seen(fifo, seconds=120.0):
    """Yields ``{"opened": bool}``: after ``seconds`` (if the block is still running) opens ``fifo`` for writing,
    which releases a reader blocked in open() and says whether there was one. ``seconds`` only bounds how long
    a failing test waits: a block that ends first never opened it, however slowly it ran."""
    seen = {"opened": False}

    def release():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no reader has it open
            return
        seen["opened"] = True

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield seen
    finally:
        timer.cancel()
        timer.join()
