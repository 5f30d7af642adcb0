"""Ticker: several periodic jobs on one thread (the fit session's watchdog and the logger's sampling)."""

import threading
import time

import pytest

from keras_gpu_tools.runtime.ticker import Ticker
from tests.helpers.timing_live import VirtualClock, step_ticker, wait_until


def alive(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_jobs_share_one_thread_at_their_own_intervals():
    # In virtual time (intervals of 1/1024 s and 8/1024 s, exact in binary): the schedule is exact, whatever the load.
    clock = VirtualClock()
    ticker = Ticker("test-ticker-share", clock=clock)
    fast, slow, threads = [], [], set()

    def tick(calls):
        calls.append(clock())
        threads.add(threading.get_ident())

    jobs = [
        ticker.every(1 / 1024, lambda: tick(fast), pytest.fail),
        ticker.every(8 / 1024, lambda: tick(slow), pytest.fail),
    ]
    step_ticker(clock, jobs, until=lambda: len(slow) == 3)
    ticker.close(timeout=30)
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert len(alive("test-ticker-share")) == 0
    # Each at its own cadence: eight of the fast job's runs to one of the slow job's.
    assert fast == [k / 1024 for k in range(17)]
    assert slow == [0.0, 8 / 1024, 16 / 1024]


def test_a_failing_job_is_reported_and_neither_it_nor_the_others_stop():
    ticker = Ticker("test-ticker-errors")
    calls, errors, other = [], [], []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")

    ticker.every(0.01, flaky, errors.append)
    ticker.every(0.01, lambda: other.append(1), pytest.fail)
    assert wait_until(lambda: len(calls) >= 5 and len(other) >= 5)
    ticker.close()
    assert [str(e) for e in errors] == ["boom"]


def test_an_error_handler_that_raises_does_not_end_the_thread():
    """With warnings turned into errors (-W error), the logger's warning raises in its error handler."""
    ticker = Ticker("test-ticker-handler")
    calls, other = [], []

    def fails():
        calls.append(1)
        raise RuntimeError("boom")

    def handler(error):
        raise UserWarning(f"as -W error makes a warning: {error}")

    ticker.every(0.01, fails, handler)
    ticker.every(0.01, lambda: other.append(1), pytest.fail)
    assert wait_until(lambda: len(calls) >= 3 and len(other) >= 3)
    assert alive("test-ticker-handler")
    ticker.close()


def test_stop_waits_for_a_run_under_way_and_no_run_follows():
    ticker = Ticker("test-ticker-stop")
    started, release, calls = threading.Event(), threading.Event(), []

    def slow():
        calls.append("begin")
        started.set()
        release.wait(60)
        calls.append("end")

    job = ticker.every(0.01, slow, pytest.fail)
    assert started.wait(30)
    stopper = threading.Thread(target=job.stop)
    stopper.start()
    stopper.join(0.1)
    assert stopper.is_alive()  # waiting for the run under way
    release.set()
    stopper.join(30)
    assert not stopper.is_alive() and calls == ["begin", "end"]
    time.sleep(0.05)
    assert calls == ["begin", "end"]  # none after stop() returned
    ticker.close()


def test_a_job_can_stop_itself_and_the_first_run_waits_for_its_delay():
    ticker = Ticker("test-ticker-self")
    calls = []
    t0 = time.monotonic()

    def once():
        calls.append(time.monotonic() - t0)
        job.stop()  # on the ticker's own thread: must not wait for itself

    job = ticker.every(0.01, once, pytest.fail, delay=0.1)
    assert wait_until(lambda: calls)
    time.sleep(0.05)
    assert len(calls) == 1 and calls[0] >= 0.1
    assert alive("test-ticker-self")  # the thread waits for jobs until closed
    ticker.close()
    assert not alive("test-ticker-self")


def test_a_closed_ticker_refuses_new_jobs_and_close_is_safe_from_its_own_thread():
    ticker = Ticker("test-ticker-close")
    done = threading.Event()

    def close_from_inside():
        ticker.close()  # as the watchdog does when it aborts the session
        done.set()

    ticker.every(0.01, close_from_inside, pytest.fail)
    assert done.wait(30)
    assert wait_until(lambda: not alive("test-ticker-close"))
    with pytest.raises(RuntimeError, match="test-ticker-close"):
        ticker.every(0.01, lambda: None, pytest.fail)
    ticker.close()  # twice: nothing happens


def test_no_job_no_thread():
    ticker = Ticker("test-ticker-none")
    assert ticker.thread is None
    ticker.close()
    assert ticker.thread is None and not alive("test-ticker-none")


def test_a_job_raising_a_base_exception_does_not_end_the_thread():
    ticker = Ticker("test-ticker-base")
    errors, other = [], []

    def exits():
        raise SystemExit(3)

    ticker.every(0.01, exits, errors.append)
    ticker.every(0.01, lambda: other.append(1), pytest.fail)
    assert wait_until(lambda: len(errors) >= 3 and len(other) >= 3)
    assert all(isinstance(e, SystemExit) for e in errors) and alive("test-ticker-base")
    ticker.close()


def test_soon_runs_a_job_at_once_and_a_call_during_a_run_is_not_lost():
    """LiveView's drawing: a job of a long cadence that runs when work is handed over."""
    entered, release, calls = threading.Event(), threading.Event(), []

    def draw():
        calls.append(clock())
        if len(calls) == 2:  # the first run asked for: held while another call comes
            entered.set()
            release.wait(60)

    # Virtual time stands still: with a cadence of 3600 s, only soon() can make the job run again.
    clock = VirtualClock()
    ticker = Ticker("test-ticker-soon", clock=clock)
    job = ticker.every(3600.0, draw, pytest.fail)
    assert wait_until(lambda: len(calls) == 1)  # the run at once of every()
    job.soon()
    assert entered.wait(30)
    job.soon()  # during the run: one more after it
    job.soon()
    release.set()
    assert wait_until(lambda: len(calls) == 3)
    # The calls during one run made one run, then the long cadence again: nothing is due before 3600 s.
    assert wait_until(lambda: job.next == 3600.0) and not job.poked and len(calls) == 3
    job.stop()
    job.soon()  # after stop(): nothing
    assert not job.poked and job.next == 3600.0
    ticker.close(timeout=30)
    assert not alive("test-ticker-soon") and calls == [0.0, 0.0, 0.0]
