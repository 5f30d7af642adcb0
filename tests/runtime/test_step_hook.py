"""The shared step hook: exact timing with a fake clock, and real fit() on every backend."""

import time

import numpy as np
import pytest

from keras_gpu_tools import backends
from keras_gpu_tools.errors import KerasInternalsError
from keras_gpu_tools.runtime import keras_internals as compat
from keras_gpu_tools.runtime.session import FitSession
from keras_gpu_tools.runtime.step_hook import MARK, StepHook, batch_signature, leading_dim
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_live import wait_until


def attach(model, observer, clock=time.perf_counter, session=None, backend="jax"):
    """A hook for a fake model driven from the test itself (a session that found no fit() frame)."""
    return StepHook.attach(model, observer, backends.get(backend), session or FitSession(model, None), clock=clock)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def advance(self, s):
        self.t += s


class FakeJaxModel:
    """The JAX train function's contract: f(state, iterator) -> (logs, state)."""

    steps_per_execution = 1

    def __init__(self, clock, compute):
        self.clock = clock
        self.compute = compute

        def train_function(state, iterator):
            batch = next(iterator)
            clock.advance(compute)
            return {"loss": float(batch[0].sum())}, state + 1

        self.train_function = train_function
        self.original = train_function

    def make_train_function(self):
        pass


class Recorder:
    def __init__(self, every=1):
        self.records = []
        self.every = every
        self.detached = []

    def sample(self, index):
        return index > 0 and index % self.every == 0

    def on_step(self, rec):
        self.records.append(rec)

    def on_detach(self, stale):
        self.detached.append(stale)


class LightRecorder(Recorder):
    """Asks for calls 0 and 1 in full (1 sampled) and for the fetch of every `fetch_every`-th call."""

    def __init__(self, fetch_every=3):
        super().__init__()
        self.fetch_every = fetch_every

    def sample(self, index):
        return index == 1

    def next_sample(self, index):
        return index if index <= 1 else None

    def next_fetch(self, index):
        return index + -index % self.fetch_every


def slow_batches(clock, wait, n):
    for i in range(n):
        clock.advance(wait)
        yield (np.full((8, 2), i, "float32"), np.zeros((8, 1), "float32"))


def test_fake_clock_exact_split_on_the_jax_path(monkeypatch):
    # The fake step runs on the host: time it as on a synchronous device, also where an
    # earlier test in the process started JAX on a GPU (whose compute is timed from the dispatch).
    monkeypatch.setattr(backends.get("jax"), "_async", False)
    clock = FakeClock()
    model = FakeJaxModel(clock, compute=0.003)
    rec = Recorder(every=2)
    att = attach(model, rec, clock)
    assert getattr(model.train_function, MARK).original is model.original
    it = slow_batches(clock, 0.007, 5)
    state = 0
    for _ in range(5):
        _, state = model.train_function(state, it)
        clock.advance(0.001)  # callbacks between steps
    att.hook.flush()
    assert state == 5
    assert [r.index for r in rec.records] == [0, 1, 2, 3, 4]
    assert rec.records[0].warmup and not rec.records[1].warmup
    for r in rec.records:
        assert r.fetch == pytest.approx(0.007)
        assert r.samples == 8 and r.steps == 1
    sampled = [r for r in rec.records if r.sampled]
    assert [r.index for r in sampled] == [2, 4]
    assert sampled[0].compute == pytest.approx(0.003)
    assert rec.records[1].gap == pytest.approx(0.001)
    assert rec.records[1].interval == pytest.approx(0.011)
    assert rec.records[-1].gap is None  # flushed at "epoch end"
    att.detach()
    assert model.train_function is model.original
    assert rec.detached == [False]


def test_a_light_call_times_its_fetch_into_the_pending_record_and_nothing_else():
    from keras_gpu_tools.input.timing import StepStats

    clock = FakeClock()
    model = FakeJaxModel(clock, compute=0.003)
    arounds = []

    class Light(LightRecorder):
        def around(self, rec, call):
            arounds.append(rec.index)
            return call()

    rec = Light()
    att = attach(model, rec, clock)
    it = slow_batches(clock, 0.007, 10)
    state = 0
    for _ in range(10):
        _, state = model.train_function(state, it)
        clock.advance(0.001)
    att.hook.flush()
    assert state == 10  # every step ran
    # 0: the first; 1: sampled; 2: right after it; 3, 6, 9: light; the rest fast.
    assert [r.index for r in rec.records] == [0, 1, 2] and arounds == [0, 1, 2]
    last = rec.records[2]
    assert last.covers == 7 and last.covered_fetch_steps == 3
    assert last.covered_fetch == pytest.approx(3 * 0.007)
    assert last.interval == pytest.approx(8 * 0.011)  # from call 2's start to the end of call 9
    stats = StepStats()
    for r in rec.records:
        stats.add(r)
    m = stats.measurement()
    assert stats.steps == 10
    assert m.fetch == pytest.approx(0.007)  # the light calls' fetches, not the synced ones
    att.detach()
    assert model.train_function is model.original


def test_a_light_call_that_raises_passes_the_error_on_and_keeps_the_schedule():
    clock = FakeClock()
    model = FakeJaxModel(clock, compute=0.0)

    rec = LightRecorder(fetch_every=4)
    att = attach(model, rec, clock)
    for _ in range(4):  # calls 0, 1 (sampled) and 2 (right after it): full; 3: fast
        model.train_function(0, slow_batches(clock, 0.0, 1))
    with pytest.raises(StopIteration):
        model.train_function(0, iter([]))  # call 4: light, out of data
    assert att.hook.next_index == 5 and att.hook.wants_full() is False  # call 8 is the next light one
    for _ in range(3):  # calls 5, 6, 7: fast
        model.train_function(0, slow_batches(clock, 0.0, 1))
    assert att.hook.wants_full()
    att.detach()
    assert model.train_function is model.original


def test_one_wrapper_for_many_observers_and_around_order():
    clock = FakeClock()
    model = FakeJaxModel(clock, compute=0.001)
    calls = []

    class Around(Recorder):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def around(self, rec, call):
            calls.append((self.name, "in", rec.index))
            try:
                return call()
            finally:
                calls.append((self.name, "out", rec.index))

    a, b = Around("a"), Around("b")
    shared = FitSession(model, None)
    att_a = attach(model, a, clock, session=shared)
    wrapper = model.train_function
    att_b = attach(model, b, clock, session=shared)
    assert model.train_function is wrapper  # never wrapped twice
    model.train_function(0, slow_batches(clock, 0.0, 1))
    assert calls == [("a", "in", 0), ("b", "in", 0), ("b", "out", 0), ("a", "out", 0)]
    att_a.detach()
    assert model.train_function is wrapper  # b still uses it
    att_b.detach()
    att_b.detach()  # twice is harmless
    assert model.train_function is model.original


def test_stale_wrapper_from_another_fit_is_replaced():
    clock = FakeClock()
    model = FakeJaxModel(clock, compute=0.0)
    old = Recorder()
    attach(model, old, clock)  # as if installed by a fit() that died: another session
    stale_hook = StepHook.installed(model)
    new = Recorder()
    att = attach(model, new, clock)
    assert old.detached == [True]
    assert StepHook.installed(model) is not stale_hook
    assert StepHook.installed(model).original is model.original  # never wraps a wrapper
    att.detach()
    assert model.train_function is model.original


def test_errors_pass_through_and_drop_the_pending_step():
    clock = FakeClock()
    model = FakeJaxModel(clock, compute=0.0)
    rec = Recorder()
    att = attach(model, rec, clock)
    with pytest.raises(StopIteration):
        model.train_function(0, iter([]))
    att.hook.flush()
    assert rec.records == []
    att.detach()


def test_batch_helpers():
    b = ({"a": np.zeros((4, 3)), "b": np.zeros((4,), "int32")}, np.zeros((4, 1)))
    assert leading_dim(b) == 4
    assert batch_signature(b) == (((4, 3), "float64"), ((4,), "int32"), ((4, 1), "float64"))
    assert leading_dim(()) is None and leading_dim(3) is None


class _ListShaped:
    shape = [4, 3]  # an unhashable shape: the signature must still be hashable
    dtype = "float32"


def test_the_signature_of_a_flat_tuple_equals_and_hashes_like_the_general_one():
    x, y = np.zeros((4, 3), "float32"), np.zeros((4,), "int32")
    flat = batch_signature((x, y))  # the quick path
    assert flat == (((4, 3), "float32"), ((4,), "int32"))
    assert flat == batch_signature([x, y])  # a list takes the general walk
    assert hash(flat) == hash(batch_signature([x, y]))
    assert batch_signature((x, y, None)) == flat  # a None (no sample weight) is skipped by the walk
    assert batch_signature((x, np.zeros((5,), "int32"))) != flat
    assert batch_signature((x, y.astype("int64"))) != flat
    odd = batch_signature((_ListShaped(), y))
    assert odd == (((4, 3), "float32"), ((4,), "int32")) and hash(odd)


@pytest.mark.multibackend
def test_the_signature_of_the_backends_tensors_equals_that_of_numpy():
    import keras

    x, y = np.zeros((4, 3), "float32"), np.zeros((4,), "int32")
    tensors = (keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y))
    sig = batch_signature(tensors)
    assert [shape for shape, _ in sig] == [(4, 3), (4,)]
    assert {sig: 1}[batch_signature(tuple(keras.ops.convert_to_tensor(a) for a in (x, y)))] == 1
    assert sig != batch_signature((keras.ops.convert_to_tensor(np.zeros((5, 3), "float32")), tensors[1]))


# -- real fit() on every backend --------------------------------------------------------
class HookObserverCallback:
    """A keras callback that attaches a Recorder through the hook."""

    def __new__(cls, recorder, fail_at=None):
        import keras

        class _CB(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.session = FitSession.current(self.model)
                self.att = StepHook.attach(self.model, recorder, backends.get(), self.session)
                self.wrapped_during_fit = StepHook.installed(self.model) is not None

            def on_train_batch_end(self, batch, logs=None):
                if fail_at is not None and batch == fail_at:
                    raise RuntimeError("boom")

            def on_epoch_end(self, epoch, logs=None):
                self.att.hook.flush()

            def on_train_end(self, logs=None):
                self.att.detach()
                self.session.release(self)

        return _CB()


@pytest.mark.multibackend
def test_real_fit_records_every_step_and_restores():
    model = tiny_dense_model(features=4, hidden=8, seed=None)
    x = np.random.rand(64, 4).astype("float32")
    y = np.random.rand(64, 1).astype("float32")
    model.fit(x[:8], y[:8], batch_size=8, verbose=0)  # builds the train function
    original = model.train_function
    rec = Recorder(every=3)
    cb = HookObserverCallback(rec)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
    assert cb.wrapped_during_fit
    assert model.train_function is original
    assert sum(r.steps for r in rec.records) == 16
    assert [r.index for r in rec.records] == list(range(16))
    sampled = [r for r in rec.records if r.sampled]
    assert sampled and all(r.compute is not None and r.compute >= 0 for r in sampled)
    assert all(r.fetch is not None for r in sampled)
    assert all(r.samples == 8 for r in sampled)
    assert rec.detached == [False]


@pytest.mark.multibackend
def test_real_fit_times_the_fetch_of_light_calls_where_the_backend_can():
    import keras

    model = tiny_dense_model(features=4, hidden=8, seed=None)
    x = np.random.rand(64, 4).astype("float32")
    y = np.random.rand(64, 1).astype("float32")

    rec = LightRecorder()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[HookObserverCallback(rec)])
    assert sum(r.steps + r.covers for r in rec.records) == 16  # every step, once
    light = sum(r.covered_fetch_steps for r in rec.records)
    if keras.backend.backend() == "tensorflow":  # fetches inside its compiled step: no light path
        assert light == 0
    else:  # calls 3, 6, ..., 15
        assert light == 5
        assert all(r.covered_fetch > 0 for r in rec.records if r.covered_fetch_steps)


@pytest.mark.multibackend
def test_restored_after_a_fit_that_raised():
    model = tiny_dense_model(features=4, hidden=8, seed=None)
    x = np.random.rand(64, 4).astype("float32")
    y = np.random.rand(64, 1).astype("float32")
    model.fit(x[:8], y[:8], batch_size=8, verbose=0)
    original = model.train_function
    rec = Recorder()

    class Guarded(HookObserverCallback.__new__(HookObserverCallback, rec, fail_at=2).__class__):
        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            att = self.att
            self.session.add(self, lambda aborted: att.detach())

    cb = Guarded()
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert wait_until(lambda: model.train_function is original)  # the session's watchdog restores it
    assert rec.detached == [False]
    # and the next fit works, wrapped and restored again
    rec2 = Recorder()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[HookObserverCallback(rec2)])
    assert model.train_function is original and len(rec2.records) == 8


@pytest.mark.multibackend
def test_stale_wrapper_left_by_a_dead_fit_is_removed_at_next_fit():
    import keras

    model = tiny_dense_model(features=4, hidden=8, seed=None)
    x = np.random.rand(32, 4).astype("float32")
    y = np.random.rand(32, 1).astype("float32")
    model.fit(x[:8], y[:8], batch_size=8, verbose=0)
    original = model.train_function
    dead = Recorder()
    attach(model, dead, backend=keras.backend.backend())  # outside any fit: what a dead fit leaves
    rec = Recorder()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[HookObserverCallback(rec)])
    assert dead.detached == [True]
    assert model.train_function is original
    assert len(rec.records) == 4


def test_compat_reports_the_keras_version():
    class NoTrainFunction:
        pass

    with pytest.raises(KerasInternalsError, match="keras_gpu_tools relies on a Keras internal .*3.15"):
        compat.get_train_function(NoTrainFunction())


@pytest.mark.multibackend
def test_compat_finds_fit_locals():
    import keras

    seen = {}

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen["ei"] = compat.find_epoch_iterator(self.model)
            seen["cbs"] = compat.find_callback_list(self.model)
            seen["pipe"] = compat.describe_pipeline(self.model)

    model = tiny_dense_model(features=4, hidden=8, seed=None)
    probe = Probe()
    model.fit(np.zeros((16, 4), "float32"), np.zeros((16, 1), "float32"), batch_size=8, verbose=0, callbacks=[probe])
    assert seen["ei"] is not None
    assert probe in seen["cbs"]
    assert seen["pipe"]["kind"] == "arrays"
    assert compat.find_epoch_iterator(model) is None  # outside fit()


def test_inspect_tf_dataset():
    tf = pytest.importorskip("tensorflow")
    ds = tf.data.Dataset.range(10).map(lambda v: v + 1).batch(2)
    info = compat.inspect_tf_dataset(ds)
    assert info["sequential_map"] and not info["parallel_map"] and not info["ends_with_prefetch"] and not info["cache"]
    ds = (
        tf.data.Dataset.range(10)
        .cache()
        .map(lambda v: v, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(2)
        .prefetch(tf.data.AUTOTUNE)
    )
    info = compat.inspect_tf_dataset(ds)
    assert info["parallel_map"] and info["ends_with_prefetch"] and info["cache"] and not info["sequential_map"]


@pytest.mark.multibackend
def test_a_plain_fit_after_a_dead_one_never_runs_through_the_old_hook(monkeypatch):
    """Defect 1: a fit() with no callbacks after one that died ran through the dead fit's hook."""
    import keras

    monkeypatch.setattr(FitSession, "interval", 60.0)  # the watchdog does not get there first
    model = tiny_dense_model(features=4, hidden=8, seed=None)
    x = np.random.rand(32, 4).astype("float32")
    y = np.random.rand(32, 1).astype("float32")
    model.fit(x[:8], y[:8], batch_size=8, verbose=0)
    original = model.train_function
    rec = Recorder()

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[HookObserverCallback(rec), Interrupt()])
    steps_seen = len(rec.records)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0)  # no callbacks of ours
    assert len(rec.records) == steps_seen  # not one step of the plain fit went through the old hook
    assert rec.detached == [True]  # removed as stale, by the plain fit's first call
    assert model.train_function is original
