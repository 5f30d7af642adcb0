"""The job's channel on JAX's real coordination service: two processes' clients in one test process."""

from __future__ import annotations

import socket
import threading

import pytest

from keras_gpu_tools.runtime import job_channel
from keras_gpu_tools.runtime.job_channel import JobChannel
from keras_gpu_tools.runtime.kv_exchange import KVExchange, PeerLost
from keras_gpu_tools.runtime.session import FitSession
from keras_gpu_tools.runtime.topology import ExchangeError

pytest.importorskip("jax")


@pytest.fixture
def store():
    """A coordination service of two processes and each one's client, as ``jax.distributed`` starts them."""
    from jax._src.lib import _jax

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    service = _jax.get_distributed_runtime_service(f"localhost:{port}", 2)
    clients = [
        _jax.get_distributed_runtime_client(f"localhost:{port}", i, shutdown_on_destruction=False) for i in (0, 1)
    ]
    both(lambda c: c.connect(), clients)
    yield clients
    both(lambda c: c.shutdown(), clients)
    service.shutdown()


def both(fn, items):
    """``fn`` on each item at once (two processes), their results in order; re-raises the first error."""
    out: list = [None, None]

    def run(i):
        try:
            out[i] = fn(items[i])
        except BaseException as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a wait did not end"
    return out


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(job_channel, "BEAT_S", 0.05)
    monkeypatch.setattr(job_channel, "SILENT_AFTER_S", 0.5)
    monkeypatch.setattr(job_channel, "ROSTER_TIMEOUT_S", 1.0)


def channels(clients):
    sessions = [FitSession(object(), None) for _ in clients]
    made = [JobChannel.of(s, KVExchange(c, i, 2)) for i, (s, c) in enumerate(zip(sessions, clients))]
    assert made[0] is JobChannel.of(sessions[0], KVExchange(clients[0], 0, 2))  # one per fit
    return sessions, made


class Member:
    def __init__(self, kind: str, name: str, agrees: bool = False):
        self.role = (kind, name, agrees)

    def _job_role(self):
        return self.role


def test_a_process_that_stops_beating_ends_the_others_wait_at_once(store, quick):
    sessions, (a, b) = channels(store)
    b.close()  # process 1 dies: its sign of life stops, and it never writes its value
    with pytest.raises(PeerLost, match=r"process 1 stopped answering .*stopped waiting for its 'x/epoch0'"):
        a.gather_round("x/epoch0", 1, 600.0, "epoch0")
    assert a.failure is not None
    with pytest.raises(ExchangeError, match="process 1 stopped answering"):  # no second wait in this fit
        a.gather_round("y/epoch0", 1, 600.0, "epoch0")
    sessions[0]._close()
    assert not a._ticker.thread.is_alive()  # the session's end stops the heartbeat


def test_a_live_process_that_answers_late_is_waited_for(store, quick):
    _, (a, b) = channels(store)

    def late(ch):
        if ch is b:
            threading.Event().wait(1.5)  # three times the silence that means death, beating all along
        return ch.gather_round("x/epoch0", ch.index, 600.0, "epoch0")

    assert both(late, [a, b]) == [[0, 1], [0, 1]]
    for ch in (a, b):
        ch.close()


def test_the_gathers_of_one_epoch_end_share_one_deadline(store, quick):
    _, (a, b) = channels(store)
    with pytest.raises(ExchangeError, match="process 1 gave no 'det/epoch3' within 0.3 s"):
        a.gather_round("det/epoch3", 1, 0.3, "epoch3")
    # The next callback at the same epoch end does not wait for its own key: the first wait's failure stands.
    with pytest.raises(ExchangeError, match="'det/epoch3'"):
        a.gather_round("gpu/epoch3", 1, 0.3, "epoch3")
    # Process 1 arrives late: it sees that process 0 gave up and does not wait either.
    with pytest.raises(ExchangeError, match="process 0 stopped exchanging"):
        b.gather_round("det/epoch3", 1, 600.0, "epoch3")
    for ch in (a, b):
        ch.close()


def test_a_callback_that_needs_every_process_and_is_missing_somewhere_is_refused_on_each(store, quick):
    _, (a, b) = channels(store)
    reducer, detector, logger = Member("Reducer", "oom", True), Member("Detector", "input"), Member("Logger", "gpu")
    both(lambda pair: pair[0].compare(pair[1]), [(a, [reducer, detector, logger]), (b, [detector])])
    for ch in (a, b):
        with pytest.raises(ValueError, match=r"Reducer \(run 'oom'\) runs on process\(es\) \[0\] but not on .*\[1\]"):
            ch.check(detector)
        ch.close()


def test_a_monitoring_callback_missing_somewhere_leaves_its_job_figures_out_with_no_wait(store, quick):
    _, (a, b) = channels(store)
    detector, logger = Member("Detector", "input"), Member("Logger", "gpu")
    both(lambda pair: pair[0].compare(pair[1]), [(a, [detector, logger]), (b, [detector])])
    assert a.check(detector) is None and b.check(detector) is None
    assert a.check(logger) == "Logger (run 'gpu') does not run on process(es) [1]"
    for ch in (a, b):
        ch.close()


def test_a_process_that_runs_none_of_ours_is_found_at_fit_start(store, quick):
    _, (a, b) = channels(store)
    reducer, detector = Member("Reducer", "oom", True), Member("Detector", "input")
    a.compare([reducer, detector])  # process 1 never compares: none of ours runs there
    with pytest.raises(ValueError, match="Reducer: every process of the job must run it.*process 1 gave no"):
        a.check(reducer)
    assert "runs none of keras_gpu_tools's callbacks" in a.check(detector)
    with pytest.raises(ExchangeError):  # and no epoch end waits for it
        a.gather_round("det/epoch0", 1, 600.0, "epoch0")
    # Had process 1 only been late, it learns that process 0 stopped waiting, and refuses alike.
    b.compare([reducer, detector])
    with pytest.raises(ValueError, match="process 0 stopped waiting"):
        b.check(reducer)
    for ch in (a, b):
        ch.close()
