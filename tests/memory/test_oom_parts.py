"""The reducer's framework-free parts without a model: the job's agreement, the event log, the headroom."""

import json
import os

import pytest

from keras_gpu_tools.memory.agreement import JobAgreement
from keras_gpu_tools.memory.event_log import EventLog, unrecoverable_event
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.headroom import Headroom
from keras_gpu_tools.memory.search import plan_limit
from keras_gpu_tools.runtime.topology import ExchangeError


class FakeExchange:
    """The job's channel, answering with the other processes' votes."""

    def __init__(self, others=(), error=None):
        self.others, self.error, self.keys = list(others), error, []

    def gather(self, key, value, timeout_s):
        self.keys.append(key)
        if self.error is not None:
            raise self.error
        return [value] + self.others


class Runner:
    def __init__(self, error=None):
        self.error = error

    def rehearse(self, batch, n, k, state):
        if self.error is not None:
            raise self.error


class FakeOOM(Exception):
    pass


def agreement(exchange, scope="fit1", aborted=None):
    return JobAgreement(
        exchange,
        "oom",
        scope,
        "test",
        1.0,
        1,
        classify=lambda e: "fake" if isinstance(e, FakeOOM) else None,
        explain=lambda e, context: None,
        warn=lambda key, message: None,
        abort=lambda: aborted.append(True) if aborted is not None else None,
    )


def test_an_agreement_fits_where_every_process_fits_and_numbers_its_keys():
    exchange = FakeExchange([{"n": 8, "k": 2, "oom": False, "error": ""}])
    agree = agreement(exchange)
    assert agree(Runner(), None, 8, 2, None).fits
    assert agree(Runner(), None, 8, 2, None).fits
    assert exchange.keys == ["oom/fit1/agree1", "oom/fit1/agree2"] and agree.rounds == 2


def test_a_split_that_ran_out_of_memory_on_another_process_runs_nowhere():
    exchange = FakeExchange([{"n": 8, "k": 2, "oom": True, "error": "RESOURCE_EXHAUSTED"}])
    result = agreement(exchange)(Runner(), None, 8, 2, None)
    assert not result.fits and result.error is None and result.kind == "agreed"
    assert result.note.startswith("out of memory on process 1 of 2 in its rehearsal of 8 as 2 x 4")
    assert result.explanation["lines"][0] == result.note


def test_this_processs_own_rehearsal_error_is_kept_and_classified():
    error = FakeOOM("out of memory")
    result = agreement(FakeExchange())(Runner(error), None, 8, 2, None)
    assert not result.fits and result.error is error and result.kind == "fake"


def test_an_evaluate_outside_fit_numbers_its_scope_at_its_first_agreement():
    exchange = FakeExchange()
    agreement(exchange, scope=None)(Runner(), None, 4, 1, None)
    (key,) = exchange.keys
    assert key.startswith("oom/test") and key.endswith("/agree1")


@pytest.mark.parametrize(
    "exchange, message",
    [
        (FakeExchange(error=ExchangeError("no answer")), "could not agree"),
        (FakeExchange([{"n": 8, "k": 4, "oom": False, "error": ""}]), "different batches or splits"),
    ],
)
def test_processes_that_cannot_agree_stop_the_fit(exchange, message):
    aborted = []
    with pytest.raises(RuntimeError, match=message):
        agreement(exchange, aborted=aborted)(Runner(), None, 8, 2, None)
    assert aborted == [True]


def test_the_event_log_counts_each_event_and_writes_its_files(tmp_path):
    log = EventLog(lambda key, message: None, run_dir=lambda: str(tmp_path))
    event = OOMEvent(step=3, batch_size=16, failed_split=1, next_split=2, kind="fake", seconds=0.5, explanation={})
    log.record(event, {"snapshot.pickle": b"bytes"})
    assert log.events == [event] and log.epoch_events == 1 and log.recovery_seconds == 0.5
    folder = tmp_path / "oom_events"
    assert sorted(os.listdir(folder)) == ["train_step3_0.json", "train_step3_0.txt", "train_step3_0_snapshot.pickle"]
    assert json.loads((folder / "train_step3_0.json").read_text())["batch_size"] == 16
    assert log.end_epoch(2, step=4) == {"oom/events": 1.0, "oom/micro_batches": 2.0}
    summary = log.summary([], micro_batch_size=8)
    assert "step 3: out of memory at batch 16, retrying as 2 x 8" in summary
    assert summary.endswith("1 recovery(ies), 0.50 s in failed attempts; micro-batches of 8 now.")


def test_an_unrecoverable_event_reads_the_batch_size_from_the_signature():
    event = unrecoverable_event(FakeOOM(), (((32, 3), "float32"),), "test", 7, None, None)
    assert (event.batch_size, event.failed_split, event.next_split, event.kind, event.phase) == (
        32,
        1,
        None,
        "unknown",
        "test",
    )


def test_headroom_estimates_the_batch_that_fits_or_takes_the_plans():
    headroom = Headroom()
    headroom.record(lambda: {0: (6 * 2**30, 8 * 2**30)})
    headroom.record(lambda: {0: (4 * 2**30, None)})  # the highest peak and the known capacity are kept
    (row,) = headroom.rows(batch_size=16, state_bytes=0.0)
    assert (row["peak_bytes"], row["capacity_bytes"], row["fits_batch"]) == (6 * 2**30, 8 * 2**30, 19)
    planned = Headroom(plan_limit(64))
    planned.record(lambda: {0: (6 * 2**30, 8 * 2**30)})
    assert planned.rows(16, 0.0)[0]["fits_batch"] == 64 and planned.rows(16, 0.0)[0]["fits_from"] == "plan"
    with pytest.raises(ValueError, match="plan"):
        plan_limit(0)


# -- predicting: the default probe, and a job's rehearsals --------------------------------------
class PredictingRunner(Runner):
    """A rehearsal that fits up to `limit` samples per micro-batch, told from a memory analysis."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.rehearsed = limit, []
        self.alone_memory = {}

    def rehearse(self, batch, n, k, state):
        self.rehearsed.append((n, k))

    def predict_alone(self, batch, n, k, state):
        need = 100 * -(-n // k)
        self.alone_memory[(n, k)] = {"temporaries": need, "need": need}
        return need <= 100 * self.limit, need


def test_a_job_predicting_votes_a_split_out_without_rehearsing_it():
    exchange = FakeExchange([{"n": 8, "k": 1, "oom": False, "error": ""}])
    agree = agreement(exchange)
    agree.predict = True
    runner = PredictingRunner(limit=4)
    result = agree(runner, None, 8, 1, None)
    assert not result.fits and result.error is None and result.kind == "predicted"
    assert runner.rehearsed == []  # predicted not to fit here: neither compiled for running nor run
    assert "predicted to need 800 B more" in result.note and "not run" in result.note
    # A split predicted to fit is still rehearsed for real before the job runs it.
    exchange.others = [{"n": 8, "k": 2, "oom": False, "error": ""}]
    assert agree(runner, None, 8, 2, None).fits and runner.rehearsed == [(8, 2)]


def test_a_job_not_predicting_rehearses_every_split():
    exchange = FakeExchange([{"n": 8, "k": 1, "oom": False, "error": ""}])
    runner = PredictingRunner(limit=4)
    assert agreement(exchange)(runner, None, 8, 1, None).fits  # predict is off until the reducer says so
    assert runner.rehearsed == [(8, 1)]


class Backend:
    def __init__(self, predicts, limit):
        self.predicts_memory, self.limit, self.name = predicts, limit, "fake"

    def device_memory(self):
        return {"bytes_limit": self.limit} if self.limit else {}


@pytest.mark.parametrize(
    "probe, predicts, limit, expected, warned",
    [
        ("auto", True, 8 * 2**30, True, []),  # JAX on a GPU
        ("auto", True, None, False, []),  # JAX on a CPU: off, silently
        ("auto", False, 8 * 2**30, False, []),  # torch, TensorFlow: off, silently
        (True, True, 8 * 2**30, True, []),
        (True, True, None, False, ["probe-device"]),
        (True, False, 8 * 2**30, False, ["probe"]),
        (False, True, 8 * 2**30, False, []),
    ],
)
def test_the_probe_predicts_where_the_backend_and_device_can_tell(probe, predicts, limit, expected, warned):
    from keras_gpu_tools.memory.checks import resolve_probe

    keys = []
    assert resolve_probe(probe, Backend(predicts, limit), lambda key, message: keys.append(key)) is expected
    assert keys == warned
