"""OOM classification, the split policy, the messages and the retry loop, without a model."""

import importlib.util
import os

import pytest

from keras_gpu_tools.backends import is_oom, oom_kind
from keras_gpu_tools.backends import oom_error as final_error
from keras_gpu_tools.errors import UnrecoverableOOM
from keras_gpu_tools.memory.agreement import Agreement
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.recovery import Recovery, final_message
from keras_gpu_tools.memory.split import SplitController, describe_split, split_sizes

has = lambda m: importlib.util.find_spec(m) is not None  # noqa: E731


def in_the_torch_session(test):
    """torch's own exception types, tested where torch is loaded anyway: imported late into a
    TensorFlow session, torch's import paid for earlier tests' garbage (minutes at a time)."""
    skip = pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "torch", reason="run in the torch session")
    return pytest.mark.multibackend(skip(test))


# -- classification: the real exception types -----------------------------------------
@pytest.mark.skipif(not has("tensorflow"), reason="needs TensorFlow")
def test_tensorflow_resource_exhausted_is_oom():
    import tensorflow as tf

    assert (
        oom_kind(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[8,1024]"))
        == "tensorflow"
    )
    assert not is_oom(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes"))


@pytest.mark.skipif(not has("jax"), reason="needs JAX")
def test_xla_resource_exhausted_is_oom():
    import jax

    assert (
        oom_kind(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8.00GiB."))
        == "jax"
    )
    # XLA's CPU runtime: a failed temporary allocation comes back as INTERNAL.
    assert is_oom(
        jax.errors.JaxRuntimeError(
            "INTERNAL: Error dispatching computation: Out of memory allocating 17592186044416 bytes."
        )
    )
    assert not is_oom(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes do not match"))


@in_the_torch_session
def test_torch_out_of_memory_is_oom():
    import torch

    assert oom_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "torch"
    assert is_oom(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 17592186044416 bytes."
        )
    )
    assert not is_oom(RuntimeError("CUDA error: device-side assert triggered"))


def test_other_errors_and_python_memory_error_are_not_oom():
    assert not is_oom(ValueError("out of memory"))  # by type, not by words
    assert not is_oom(MemoryError())
    assert not is_oom(KeyboardInterrupt())


# -- the split ----------------------------------------------------------------------------
def test_split_sizes_are_even_and_cover_the_batch():
    assert split_sizes(16, 4) == [4, 4, 4, 4]
    assert split_sizes(10, 4) == [3, 3, 2, 2]
    assert split_sizes(3, 8) == [1, 1, 1]
    assert sum(split_sizes(257, 8)) == 257
    assert describe_split(256, 4) == "4 x 64"
    assert describe_split(10, 4) == "2 x 3 + 2 x 2"
    with pytest.raises(ValueError):
        split_sizes(0, 2)


def test_controller_doubles_until_min_batch_size():
    c = SplitController(min_batch_size=1)
    assert c.split_for(256) == 1
    assert c.on_oom(256, 1) == 2
    assert c.on_oom(256, 2) == 4
    assert c.micro_size == 64
    assert c.split_for(256) == 4
    assert c.split_for(100) == 2  # the last, smaller batch keeps micro-batches of 64
    c = SplitController(min_batch_size=4)
    ks = [1]
    while True:
        nxt = c.on_oom(16, ks[-1])
        if nxt is None:
            break
        ks.append(nxt)
    assert ks == [1, 2, 4]
    c = SplitController()
    assert c.on_oom(100, 64) == 100  # capped at one sample per micro-batch
    assert c.on_oom(100, 100) is None


def test_controller_never_runs_a_micro_batch_below_min_batch_size():
    # Known issue: 16 with a minimum of 3 ran as 4 x 3 + 2 x 2.
    for n in range(1, 70):
        for low in range(1, 9):
            c = SplitController(min_batch_size=low)
            k, largest = 1, n
            while True:
                nxt = c.on_oom(n, k)
                if nxt is None:
                    break
                sizes = split_sizes(n, nxt)
                assert min(sizes) >= min(low, n), (n, low, nxt, sizes)
                assert max(sizes) < largest, (n, low, nxt, sizes)  # every retry is strictly smaller
                assert c.split_for(n) == nxt
                k, largest = nxt, max(sizes)
            # it gave up only where no smaller split keeps the minimum
            if largest > 1:
                assert all(min(split_sizes(n, j)) < low for j in range(1, n + 1) if max(split_sizes(n, j)) < largest)
    c = SplitController(min_batch_size=3)
    ks = [1]
    while (nxt := c.on_oom(16, ks[-1])) is not None:
        ks.append(nxt)
    assert ks == [1, 2, 4]  # 4 x 4; micro-batches of 3 cannot cover 16 with none below 3
    c.micro_size = 4
    assert c.split_for(5) == 1  # 3 + 2 would go below the minimum: the last batch of 5 runs whole
    assert c.split_for(9) == 3  # 3 x 3


def test_controller_starts_at_and_regrows_to_the_plan_never_past_it():
    c = SplitController(regrow_after=1, max_micro_size=64)
    assert c.split_for(256) == 4 and c.split_for(64) == 1  # split from the start, no OOM needed
    c.on_oom(256, 4)  # 4 x 64 ran out anyway: 8 x 32
    assert c.micro_size == 32
    c.on_success(256, 8)
    assert c.in_trial and c.micro_size == 64  # grows back to the plan
    c.on_success(256, 4)
    c.on_success(256, 4)
    assert not c.in_trial and c.micro_size == 64  # never past it


def test_controller_regrows_and_backs_off():
    c = SplitController(regrow_after=3)
    c.on_oom(64, 1)
    c.on_oom(64, 2)  # micro 16
    for _ in range(3):
        assert c.split_for(64) == 4
        c.on_success(64, 4)
    assert c.in_trial and c.split_for(64) == 2  # trial at micro 32
    assert c.on_oom(64, 2) == 4  # failed trial: back to 4
    for _ in range(5):
        c.on_success(64, 4)
    assert not c.in_trial  # the wait doubled to 6
    c.on_success(64, 4)
    assert c.in_trial
    c.on_success(64, 2)  # the trial worked
    assert c.micro_size == 32 and not c.in_trial


# -- messages -------------------------------------------------------------------------------
def test_event_lines_in_plain_words():
    assert OOMEvent(57, 256, 1, 4, "jax").line() == "step 57: out of memory at batch 256, retrying as 4 x 64"
    assert "while trying a smaller split; back to 2 x 128" in OOMEvent(9, 256, 1, 2, "torch", regrow=True).line()
    assert "no smaller split is allowed" in OOMEvent(1, 8, 8, None, "torch").line()


def test_final_message_says_what_was_tried_and_what_to_do():
    msg = final_message(
        [(16, 1), (16, 2), (16, 4)],
        4,
        {"device": "NVIDIA H100", "bytes_limit": 80 * 2**30, "bytes_in_use": 79 * 2**30},
        RuntimeError("Something\nCUDA out of memory. Tried to allocate 2 GiB"),
    )
    assert "Batch sizes tried: 16, 16 as 2 x 8, 16 as 4 x 4." in msg
    assert "memory limit 80.0 GiB" in msg and "NVIDIA H100" in msg
    assert "mixed precision" in msg and "rematerialisation" in msg and "smaller model" in msg
    assert "Last error: RuntimeError: CUDA out of memory" in msg


def test_final_message_names_the_split_that_was_tried():
    # min_batch_size above the batch: only the whole batch ran.
    msg = final_message([(16, 1)], 32)
    assert msg.splitlines()[0] == (
        "OOMBatchSizeReducer: out of memory at the whole batch of 16; min_batch_size=32 allows no split of it. "
        "Batch sizes tried: 16."
    )
    assert "micro-batches of 32" not in msg and "Batch sizes tried: 16." in msg
    assert "lower `min_batch_size` below 16" in msg
    # An uneven last split: the sizes that ran, not min_batch_size.
    msg = final_message([(16, 1), (16, 2), (16, 4), (16, 5)], 3)
    assert "out of memory even at micro-batches of at most 4 (16 as 1 x 4 + 4 x 3; min_batch_size=3)" in msg
    assert "min_batch_size=3 allows no smaller split of 16" in msg and "Lower `min_batch_size`" in msg
    assert "Even one micro-batch does not fit" not in msg  # the minimum, not the device, stopped it
    msg = final_message([(9, 1), (9, 2), (9, 3)], 3)
    assert "out of memory even at micro-batches of 3 (9 as 3 x 3; min_batch_size=3)" in msg
    assert "Even one micro-batch does not fit" in msg
    msg = final_message([(16, 1), (16, 2), (16, 4)], 4)
    assert "out of memory even at micro-batches of 4 (16 as 4 x 4; min_batch_size=4)" in msg
    assert "out of memory at a batch of 1" in final_message([(1, 1)], 1)


@in_the_torch_session
def test_final_error_keeps_the_backend_type():
    import torch

    original = torch.OutOfMemoryError("CUDA out of memory")
    err = final_error(original, "the message")
    assert type(err) is torch.OutOfMemoryError and str(err) == "the message" and err.oom_original is original


# -- the retry loop ---------------------------------------------------------------------------
class FakeOOM(Exception):
    pass


class FakeRunner:
    """Runs out of memory above `limit` samples per micro-batch; records the calls."""

    def __init__(self, limit, fail_other=None):
        self.limit = limit
        self.fail_other = fail_other
        self.calls = []
        self.restores = 0
        self.in_except_at_restore = []

    def protect(self, state, guarded):
        return ("snap", guarded)

    def run(self, batch, n, k, state, guarded):
        self.calls.append((n, k, guarded))
        if self.fail_other:
            raise self.fail_other
        if -(-n // k) > self.limit:
            raise FakeOOM("out of memory")
        return f"logs of {n} as {k}"

    def restore(self, snap, state):
        import sys

        self.restores += 1
        self.in_except_at_restore.append(sys.exc_info()[0] is not None)
        return state


def fake_kind(e):
    return "fake" if isinstance(e, FakeOOM) else None


@pytest.fixture
def fake_oom():
    return fake_kind


def test_recovery_retries_and_remembers(fake_oom):
    events = []
    rec = Recovery(SplitController(), classify=fake_kind, on_event=events.append)
    runner = FakeRunner(limit=64)
    assert rec.run(runner, None, 256, "sig") == ("logs of 256 as 4", 4)
    assert [e.line() for e in events] == [
        "step 0: out of memory at batch 256, retrying as 2 x 128",
        "step 0: out of memory at batch 256 (as 2 x 128), retrying as 4 x 64",
    ]
    assert runner.restores == 2 and runner.in_except_at_restore == [False, False]  # restored outside except
    runner.calls.clear()
    assert rec.run(runner, None, 256, "sig", step=1) == ("logs of 256 as 4", 4)
    assert runner.calls == [(256, 4, False)]  # starts at the split that worked, unguarded now


def test_recovery_passes_other_errors_through_unchanged(fake_oom):
    boom = KeyError("not memory")
    runner = FakeRunner(limit=1, fail_other=boom)
    with pytest.raises(KeyError) as info:
        Recovery(SplitController(), classify=fake_kind).run(runner, None, 8, "sig")
    assert info.value is boom and runner.restores == 0


def test_recovery_gives_up_at_min_batch_size(fake_oom):
    runner = FakeRunner(limit=0)
    with pytest.raises(MemoryError, match="Batch sizes tried: 8, 8 as 2 x 4, 8 as 4 x 2"):
        Recovery(SplitController(min_batch_size=2), classify=fake_kind).run(runner, None, 8, "sig")


def test_recovery_skips_attempts_predicted_not_to_fit(fake_oom):
    runner = FakeRunner(limit=64)
    runner.predict = lambda batch, n, k, state: (-(-n // k) <= 64, 123)
    events = []
    rec = Recovery(SplitController(), classify=fake_kind, on_event=events.append, probe=True)
    assert rec.run(runner, None, 256, "sig") == ("logs of 256 as 4", 4)
    assert runner.calls == [(256, 4, True)] and [e.kind for e in events] == ["predicted", "predicted"]


def test_unrecoverable_restore_is_chained_to_the_oom(fake_oom):
    runner = FakeRunner(limit=0)

    def restore(snap, state):
        raise UnrecoverableOOM("state was donated")

    runner.restore = restore
    with pytest.raises(UnrecoverableOOM) as info:
        Recovery(SplitController(), classify=fake_kind).run(runner, None, 8, "sig")
    assert isinstance(info.value.__cause__, FakeOOM)


# -- data parallelism: each device's share is split; a job agrees before it runs ---------------
def test_split_sizes_under_data_parallelism_split_each_device_share():
    assert split_sizes(24, 8, granule=2) == [4, 4, 4, 4, 2, 2, 2, 2]  # 12 per device: 2,2,2,2,1,1,1,1
    assert describe_split(24, 8, 2) == "4 x 4 + 4 x 2"
    assert split_sizes(16, 4, granule=2) == [4, 4, 4, 4]
    assert split_sizes(9, 2, granule=2) == [5, 4]  # an uneven batch (tf.distribute): split as a whole
    ctl = SplitController()
    ctl.granule = 2
    assert [ctl.on_oom(16, k) for k in (1, 2, 4)] == [2, 4, 8]
    assert ctl.on_oom(16, 8) is None  # one sample per device: no smaller split
    event = OOMEvent(step=0, batch_size=24, failed_split=4, next_split=8, kind="jax", granule=2)
    assert event.line() == "step 0: out of memory at batch 24 (as 4 x 6), retrying as 4 x 4 + 4 x 2"


def test_final_message_at_one_sample_per_device():
    message = final_message([(8, 1), (8, 2), (8, 4)], 1, granule=2)
    assert "Batch sizes tried: 8, 8 as 2 x 4, 8 as 4 x 2." in message
    assert "over 2 devices each micro-batch holds at least one sample per device" in message
    whole = final_message([(2, 1)], 1, granule=2)
    assert "the whole batch of 2, one sample per device of the 2 data-parallel devices" in whole


def test_recovery_runs_only_what_every_process_agreed_to(fake_oom):
    runner = FakeRunner(limit=10**9)  # fits here; another process runs out of memory above 64
    asked = []

    def agree(runner_, batch, n, k, state):
        asked.append(k)
        fits = -(-n // k) <= 64
        return Agreement(fits=fits, note="out of memory on process 1 of 2")

    events = []
    rec = Recovery(SplitController(), classify=fake_kind, on_event=events.append)
    rec.agree = agree
    assert rec.run(runner, None, 256, "sig") == ("logs of 256 as 4", 4)
    assert asked == [1, 2, 4] and runner.calls == [(256, 4, True)]  # the failing splits ran nowhere
    assert [e.kind for e in events] == ["agreed", "agreed"] and runner.restores == 0
    assert rec.run(runner, None, 256, "sig", step=1)[1] == 4 and asked == [1, 2, 4]  # not asked again
    rec.agree = lambda *a: Agreement(fits=False, note="out of memory on process 1 of 2")
    with pytest.raises(MemoryError, match="out of memory on process 1 of 2"):
        rec.run(runner, None, 4, "other")


def test_an_oom_after_the_job_agreed_is_not_retried(fake_oom):
    runner = FakeRunner(limit=0)  # agreed, then runs out of memory in the job's step itself
    rec = Recovery(SplitController(), classify=fake_kind)
    rec.agree = lambda *a: Agreement(fits=True)
    with pytest.raises(UnrecoverableOOM, match="waiting in the step's collective") as info:
        rec.run(runner, None, 8, "sig")
    assert isinstance(info.value.__cause__, FakeOOM) and runner.calls == [(8, 1, True)]


def test_a_step_on_this_process_own_data_is_neither_agreed_nor_refused(fake_oom):
    # In a job, a step whose batch is this process's own (a predict() on one process) has no
    # collective: it runs and retries alone, and asking the others would wait for nobody.
    runner = FakeRunner(limit=2)
    runner.spans_processes = lambda batch: batch == "job"
    asked = []
    rec = Recovery(SplitController(), classify=fake_kind)
    rec.agree = lambda runner_, batch, n, k, state: asked.append(k) or Agreement(fits=True)
    assert rec.run(runner, "own", 8, "sig") == ("logs of 8 as 4", 4)
    assert asked == [] and [c[:2] for c in runner.calls] == [(8, 1), (8, 2), (8, 4)]
    runner.limit = 0
    with pytest.raises(UnrecoverableOOM, match="waiting in the step's collective"):
        rec.run(runner, "job", 8, "other")  # a step of the job: agreed, and an OOM in it is not retried
    assert asked == [4]


def test_free_failed_step_collects_everything_unless_told_the_memory_is_free():
    import gc
    import weakref

    from keras_gpu_tools.memory.freeing import free_failed_step

    class Node:
        pass

    def old_garbage():
        # A reference cycle in the oldest generation, then dropped: only a full collection frees it.
        a, b = Node(), Node()
        a.other, b.other = b, a
        gc.collect()
        return weakref.ref(a)

    def failure():
        try:
            raise MemoryError("out of memory")
        except MemoryError as e:
            return e

    gc.disable()  # no automatic collection between the steps below
    try:
        ref = old_garbage()
        free_failed_step(failure(), held=lambda: False)  # the step's memory is free: the young generations only
        assert ref() is not None
        free_failed_step(failure(), held=lambda: True)  # still held: a full collection
        assert ref() is None
        ref = old_garbage()
        free_failed_step(failure(), held=lambda: None)  # cannot tell: a full collection
        assert ref() is None
        ref = old_garbage()
        free_failed_step(failure())
        assert ref() is None
    finally:
        gc.enable()


def test_held_since_compares_the_device_figure_with_the_one_before_the_attempt():
    from keras_gpu_tools.memory.freeing import held_since, in_use

    figures = {"bytes_in_use": 1000}
    memory = lambda: dict(figures)  # noqa: E731 - a backend's device_memory()
    before = in_use(memory)
    assert before == 1000
    held = held_since(memory, before)
    figures["bytes_in_use"] = 1000 + 65 * 2**20  # the failed attempt's tensors still allocated
    assert held() is True
    figures["bytes_in_use"] = 900  # freed
    assert held() is False
    assert held_since(lambda: {}, None)() is None  # a CPU: no figure, cannot tell
    assert held_since(memory, None)() is None  # no figure from before the attempt
    assert in_use(lambda: 1 / 0) is None  # a backend that fails to answer


def test_each_event_says_where_its_seconds_went(fake_oom):
    events = []
    ticks = iter(range(100))
    rec = Recovery(SplitController(), classify=fake_kind, on_event=events.append, clock=lambda: float(next(ticks)))
    rec.run(FakeRunner(limit=64), None, 128, "sig")
    (event,) = events
    assert list(event.phases) == ["protect", "run", "explain", "free", "restore"]
    assert all(v == 1.0 for v in event.phases.values()) and sum(event.phases.values()) <= event.seconds


def test_smallest_failing_micro_batch_from_a_real_errors_figures():
    from keras_gpu_tools.memory.recovery import smallest_failing

    gib = 2**30
    # 8 GiB in use before; the attempt at 1000 samples held 60 GiB more and asked 100: it needed 160 at least.
    figures = {"requested_bytes": 100 * gib, "in_use_bytes": 68 * gib, "capacity_bytes": 80 * gib}
    floor = smallest_failing(figures, 8 * gib, 1000)
    # 160 GiB per 1000 samples against 72 GiB of room (79.2 with a tenth to spare): 496 and more cannot fit.
    assert floor == 496
    assert smallest_failing(dict(figures, requested_bytes=gib), 8 * gib, 1000) is None  # 61 GiB: could fit
    assert smallest_failing({"requested_bytes": 100 * gib}, 8 * gib, 1000) is None  # a CPU: no capacity
    assert smallest_failing(figures, None, 1000) is None


def test_splits_a_real_errors_figures_rule_out_are_not_run(fake_oom):
    gib = 2**30
    runner = FakeRunner(limit=100)
    events = []
    memory = iter([{"bytes_in_use": 0}, {"bytes_in_use": 70 * gib}])  # before the attempt; at the free
    # The attempt at 1024 held 70 GiB and asked 700 of 80: it needed 770 GiB, so 512, 256 and 128 cannot fit.
    explain = lambda e, context: {"requested_bytes": 700 * gib, "in_use_bytes": 70 * gib, "capacity_bytes": 80 * gib}  # noqa: E731
    rec = Recovery(
        SplitController(),
        classify=fake_kind,
        on_event=events.append,
        memory=lambda: next(memory, {"bytes_in_use": 0}),
        explain=explain,
    )
    assert rec.run(runner, None, 1024, "sig") == ("logs of 1024 as 16", 16)
    assert runner.calls == [(1024, 1, True), (1024, 16, True)]  # 2, 4 and 8 never ran
    assert [(e.failed_split, e.next_split, e.kind) for e in events] == [
        (1, 2, "fake"),
        (2, 4, "predicted"),
        (4, 8, "predicted"),
        (8, 16, "predicted"),
    ]
    assert "not run: 1024 as 2 x 512" in events[1].why()[0]


def test_when_the_figures_rule_out_every_split_the_last_real_error_is_raised(fake_oom):
    gib = 2**30
    runner = FakeRunner(limit=0)
    explain = lambda e, context: {"requested_bytes": 900 * gib, "in_use_bytes": 0, "capacity_bytes": 80 * gib}  # noqa: E731
    rec = Recovery(
        SplitController(min_batch_size=2), classify=fake_kind, memory=lambda: {"bytes_in_use": 0}, explain=explain
    )
    with pytest.raises(MemoryError, match="Batch sizes tried: 8, 8 as 2 x 4, 8 as 4 x 2") as info:
        rec.run(runner, None, 8, "sig")
    assert "The last splits were not run" in str(info.value) and isinstance(info.value.__cause__, FakeOOM)
    assert runner.calls == [(8, 1, True)]


@pytest.mark.parametrize("frees", [False, True])
def test_a_full_collection_that_frees_nothing_is_not_repeated(fake_oom, monkeypatch, frees):
    # Each failure leaves 256 MiB in use past its own cycles. Where a collection of every object frees
    # it (a cycle through older objects), every failure gets one; where it frees nothing (live memory:
    # the batch on the device), only the first does: it costs a large fraction of a second each time.
    import gc

    mem = {"bytes_in_use": 0}
    runner = FakeRunner(limit=32)
    run = runner.run

    def failing_run(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        except FakeOOM:
            mem["bytes_in_use"] += 256 * 2**20
            raise

    deep = []  # the memory in use at each collection of every object
    collect = gc.collect

    def collecting(*args):
        if not args and deep and deep[-1] is None:  # the collection of every object
            deep[-1] = mem["bytes_in_use"]
            if frees:
                mem["bytes_in_use"] = 0
        return collect(*args)

    runner.run = failing_run
    monkeypatch.setattr(gc, "collect", collecting)
    rec = Recovery(SplitController(), classify=fake_kind, memory=lambda: dict(mem))
    collect_all = rec._collect_all

    def spied():
        deep.append(None)
        collect_all()

    rec._collect_all = spied
    assert rec.run(runner, None, 256, "sig") == ("logs of 256 as 8", 8)
    assert deep == ([256 * 2**20] * 3 if frees else [256 * 2**20]) and rec.deep_collect is frees


# -- the retry loop as a state machine ---------------------------------------------------------
def test_every_stage_of_the_retry_loop_is_either_terminal_or_has_a_transition():
    from keras_gpu_tools.memory.recovery import TERMINAL, TRANSITIONS, Stage

    assert set(TRANSITIONS) | TERMINAL == set(Stage) and not set(TRANSITIONS) & TERMINAL
    assert TERMINAL == {Stage.DONE, Stage.GAVE_UP}


def _walk(monkeypatch, rec, *args):
    """The stages the retry loop goes through, each with the stage its transition returned."""
    from keras_gpu_tools.memory import recovery

    path = []
    for stage, transition in list(recovery.TRANSITIONS.items()):

        def spied(self, loop, stage=stage, transition=transition):
            path.append((stage.name, (nxt := transition(self, loop)).name))
            return nxt

        monkeypatch.setitem(recovery.TRANSITIONS, stage, spied)
    try:
        rec.run(*args)
    except MemoryError:
        pass
    return path


def test_the_retry_loop_goes_from_stage_to_stage_until_a_terminal_one(fake_oom, monkeypatch):
    failed = [("ATTEMPT", "RUN"), ("RUN", "RESTORE"), ("RESTORE", "RECORD"), ("RECORD", "ATTEMPT")]
    rec = Recovery(SplitController(), classify=fake_kind)
    assert _walk(monkeypatch, rec, FakeRunner(limit=64), None, 256, "sig") == [
        *failed,
        *failed,
        ("ATTEMPT", "RUN"),
        ("RUN", "DONE"),
    ]
    assert _walk(monkeypatch, rec, FakeRunner(limit=64), None, 256, "sig") == [("ATTEMPT", "RUN"), ("RUN", "DONE")]
    predicting = FakeRunner(limit=64)
    predicting.predict = lambda batch, n, k, state: (-(-n // k) <= 64, 123)
    rec = Recovery(SplitController(), classify=fake_kind, probe=True)
    skipped = [("ATTEMPT", "PREDICTED"), ("PREDICTED", "RECORD"), ("RECORD", "ATTEMPT")]
    assert _walk(monkeypatch, rec, predicting, None, 256, "sig") == [
        *skipped,
        *skipped,
        ("ATTEMPT", "RUN"),
        ("RUN", "DONE"),
    ]
    rec = Recovery(SplitController(min_batch_size=4), classify=fake_kind)
    rec.agree = lambda *a: Agreement(fits=False, note="out of memory on process 1 of 2")
    refused = [("ATTEMPT", "REFUSED"), ("REFUSED", "RECORD")]
    assert _walk(monkeypatch, rec, FakeRunner(limit=0), None, 8, "sig") == [
        *refused,
        ("RECORD", "ATTEMPT"),
        *refused,
        ("RECORD", "GAVE_UP"),
    ]
    gib = 2**30
    explain = lambda e, context: {"requested_bytes": 900 * gib, "in_use_bytes": 0, "capacity_bytes": 80 * gib}  # noqa: E731
    rec = Recovery(
        SplitController(min_batch_size=2), classify=fake_kind, memory=lambda: {"bytes_in_use": 0}, explain=explain
    )
    ruled_out = [("ATTEMPT", "RULED_OUT"), ("RULED_OUT", "RECORD")]
    assert _walk(monkeypatch, rec, FakeRunner(limit=0), None, 8, "sig") == [
        *failed,
        *ruled_out,
        ("RECORD", "ATTEMPT"),
        *ruled_out,
        ("RECORD", "GAVE_UP"),
    ]
