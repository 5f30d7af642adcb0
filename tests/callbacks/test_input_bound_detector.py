"""InputBoundDetector end to end: real fit() with inputs of known delay.

The delays are on a fake clock (``tests/helpers/timing_input.py``): every batch the
training thread takes costs ``DELAY`` and every step ``COMPUTE``, so the figures,
categories and scopes of a real fit are exact on any machine, loaded or not.
"""

import time
import types

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import categories
from keras_gpu_tools.input.advice import workers_needed
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.runtime.step_hook import StepHook
from tests.helpers import timing_input
from tests.helpers.data import uniform_regression_data
from tests.helpers.models import tiny_dense_model

DELAY = 0.02  # fake seconds per batch taken: large against the step's compute
COMPUTE = 0.001  # fake seconds per training step
WAIT_FRACTION = DELAY / (DELAY + COMPUTE)  # 20/21: the whole fetch waits, nothing overlaps on the fake clock


@pytest.fixture
def slow_input(monkeypatch):
    """Every batch taken costs DELAY and every step COMPUTE, on a fake clock."""
    return timing_input.install(monkeypatch, compute=COMPUTE, fetch=lambda k: DELAY)


class SlowSequence(keras.utils.PyDataset):
    """Batches of 16 in order; slow only through the fake clock (see `slow_input`)."""

    def __init__(self, x, y, batch_size=16, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, i):
        s = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.x[s], self.y[s]


def slow_generator(x, y, batch_size=16):
    """Batches of 16 forever; slow only through the fake clock."""
    while True:
        for i in range(0, len(x) - batch_size + 1, batch_size):
            yield x[i : i + batch_size], y[i : i + batch_size]


def wait_until(predicate, timeout=30.0):
    """True once ``predicate()`` holds (checked every 20 ms), False after ``timeout`` s: free when it passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def read_events(run_dir):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


# -- construction ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"window": 0}, "`window`. Received: window=0. Expected a positive integer"),
        ({"window": 2.5}, "`window`"),
        ({"window": True}, "`window`"),
        ({"sample_every": -3}, "`sample_every`. Received: sample_every=-3"),
        ({"sample_every": "10"}, "`sample_every`"),
        ({"moderate_threshold": 0.3, "high_threshold": 0.2}, "Expected moderate_threshold < high_threshold"),
        ({"high_threshold": 1.5}, "`high_threshold`"),
        ({"peak_flops": 0}, "`peak_flops`"),
        ({"verbose": 3}, "`verbose`"),
        ({"run_name": ""}, "`run_name`"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InputBoundDetector(**kwargs)


def test_bad_gpu_logger_type():
    with pytest.raises(TypeError, match="`gpu_logger`"):
        InputBoundDetector(gpu_logger=3)


def test_defaults():
    d = InputBoundDetector()
    assert (d.window, d.sample_every, d.moderate_threshold, d.high_threshold) == (100, 400, 0.05, 0.2)
    assert d.verdict is None and "no training step" in d.summary()


# -- verdicts on known pipelines ----------------------------------------------------------
@pytest.mark.multibackend
def test_slow_pydataset_is_highly_input_bound(tmp_path, capsys, slow_input):
    x, y = uniform_regression_data(256)
    model = tiny_dense_model()
    det = InputBoundDetector(window=8, sample_every=4, log_dir=str(tmp_path), verbose=2)
    hist = model.fit(SlowSequence(x, y), epochs=1, verbose=0, callbacks=[det])
    assert det.verdict.category == categories.HIGH
    logs = hist.history
    assert logs["input/wait_fraction"][0] == pytest.approx(WAIT_FRACTION, rel=1e-9)
    assert logs["input/wait_ms"][0] == pytest.approx(1e3 * DELAY, rel=1e-9)
    assert "input/fetch_ms" not in logs  # one series per figure: the fetch is the wait here, and in the summary
    assert det.measurement.fetch == pytest.approx(DELAY, rel=1e-9)
    assert logs["input/compute_ms"][0] == pytest.approx(1e3 * COMPUTE, rel=1e-9)
    assert logs["input/step_ms"][0] == pytest.approx(1e3 * (DELAY + COMPUTE), rel=1e-9)
    assert logs["input/other_ms"][0] == pytest.approx(0.0, abs=1e-9)
    assert "throughput/mfu" not in logs  # no GPU here: left out, never guessed
    # Every batch holds 16 examples, and on one clock the rate is the step time's inverse.
    assert logs["throughput/samples_per_sec"][0] == pytest.approx(16 * logs["throughput/steps_per_sec"][0], rel=1e-6)
    assert 1e3 / logs["throughput/steps_per_sec"][0] == pytest.approx(logs["input/step_ms"][0], rel=1e-9)
    report = det.summary()
    assert "workers=1" in report and "HIGHLY input-bound" in report
    out = capsys.readouterr().out
    assert "InputBoundDetector: highly input-bound (epoch 1): " in out  # verbose=2: a line per epoch
    acc = read_events(det.run_dir)
    assert "input/wait_fraction" in acc.Tags()["scalars"]
    points = acc.Scalars("input/wait_fraction")
    assert len(points) == 2 and all(p.value == pytest.approx(WAIT_FRACTION, rel=1e-6) for p in points)
    assert [p.step for p in points] == sorted(p.step for p in points)
    assert "input/verdict" in acc.Tags()["tensors"]
    assert model.train_function is StepHook.installed(model) or StepHook.installed(model) is None
    assert StepHook.installed(model) is None  # restored


@pytest.mark.multibackend
def test_generator_is_highly_input_bound_with_generator_advice(slow_input):
    x, y = uniform_regression_data(256)
    model = tiny_dense_model()
    det = InputBoundDetector(window=10, sample_every=3, log_dir=None, verbose=0)
    model.fit(slow_generator(x, y), steps_per_epoch=12, epochs=2, verbose=0, callbacks=[det])
    assert [v.category for v in det.epoch_verdicts] == [categories.HIGH, categories.HIGH]
    assert [v.wait_fraction for v in det.epoch_verdicts] == pytest.approx([WAIT_FRACTION] * 2, rel=1e-9)
    assert det.global_step == 24
    assert any("PyDataset" in a for a in det.verdict.advice)


@pytest.mark.multibackend
def test_heavy_model_on_arrays_is_not_input_bound(monkeypatch):
    # Slicing in-memory arrays costs nothing against the step's compute: no wait on the fake clock.
    timing_input.install(monkeypatch, compute=0.005)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((32,))] + [keras.layers.Dense(768, activation="relu") for _ in range(3)] + [keras.layers.Dense(1)]
    )
    model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x = rng.random((256 * 14, 32), dtype="float32")
    y = rng.random((256 * 14, 1), dtype="float32")
    det = InputBoundDetector(window=100, sample_every=3, log_dir=None, verbose=0)
    model.fit(x, y, batch_size=256, epochs=1, verbose=0, shuffle=False, callbacks=[det])
    m = det.measurement
    assert m.compute == pytest.approx(0.005, rel=1e-9) and m.step == pytest.approx(0.005, rel=1e-9)
    assert m.wait == 0.0 and m.wait_fraction == 0.0, det.summary()
    assert det.verdict.category == categories.NOT and det.verdict.advice == []
    assert det.pipeline["kind"] == "arrays"


@pytest.mark.multibackend
def test_tf_data_pipeline_is_inspected(slow_input):
    tf = pytest.importorskip("tensorflow")
    x, y = uniform_regression_data(256)

    def slow(a, b):  # a Python step per batch, as a slow reader would be (its cost: the fake clock's DELAY)
        return tf.numpy_function(lambda v: v, [a], tf.float32), b

    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(16)
        .map(slow)
        .map(lambda a, b: (tf.ensure_shape(a, [None, 8]), b))
    )
    det = InputBoundDetector(window=8, sample_every=3, log_dir=None, verbose=0)
    tiny_dense_model().fit(ds, epochs=1, verbose=0, callbacks=[det])
    assert det.pipeline["kind"] == "tf.data" and det.pipeline["sequential_map"]
    assert det.verdict.category == categories.HIGH
    assert det.measurement.wait_fraction == pytest.approx(WAIT_FRACTION, rel=1e-9)
    advice = "\n".join(det.verdict.advice)
    assert "num_parallel_calls=tf.data.AUTOTUNE" in advice and ".prefetch(tf.data.AUTOTUNE)" in advice


@pytest.mark.multibackend
def test_one_process_reads_no_gpu_health_and_its_verdict_is_unchanged():
    # A logger's health source in the fit (a fake: no GPU here): one process has no job and nothing to compare.
    from tests.helpers.gpu_health import FakeGPUHealth, healthy, publisher

    source = FakeGPUHealth({"0": healthy(throttle_power_percent=60.0), "1": healthy()})
    x, y = uniform_regression_data(64)
    det = InputBoundDetector(window=4, log_dir=None, verbose=0)
    tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[publisher(source), det])
    assert source.calls == 0 and det.job_verdict is None and "throttl" not in det.summary()


# -- one set of figures, the steady state ----------------------------------------------------
def _time_weighted(rows, key):
    """sum(steps x key) / sum(steps x step_ms) over `rows` of logged figures: how the detector adds up."""
    rows = [r for r in rows if key in r and "input/step_ms" in r]
    return sum(r["input/steps"] * r[key] for r in rows) / sum(r["input/steps"] * r["input/step_ms"] for r in rows)


@pytest.mark.multibackend
def test_windows_epochs_and_fit_add_up(tmp_path, monkeypatch):
    import json

    timing_input.install(monkeypatch, compute=COMPUTE, fetch=lambda k: DELAY / 2)
    x, y = uniform_regression_data(192)
    det = InputBoundDetector(window=4, sample_every=2, log_dir=str(tmp_path), verbose=0)
    hist = tiny_dense_model().fit(SlowSequence(x, y), epochs=3, verbose=0, callbacks=[det])
    epochs = [{k: v[i] for k, v in hist.history.items()} for i in range(3)]
    assert [e["input/steps"] for e in epochs] == [12, 12, 12]
    # The fit is its epochs, time-weighted: a reader of the epoch logs gets the headline's whole-fit figure.
    fit = det.fit_measurement
    assert fit.wait_fraction == pytest.approx(_time_weighted(epochs, "input/wait_ms"), rel=1e-9)
    assert det.verdict.fit_wait_fraction == fit.wait_fraction
    # The steady state is its epochs, the same way.
    kept = [e for e, p in zip(epochs, det.verdict.phases) if p.steady]
    assert det.measurement.wait_fraction == pytest.approx(_time_weighted(kept, "input/wait_ms"), rel=1e-9)
    assert [p.label for p in det.verdict.phases] == ["epoch 1", "epoch 2", "epoch 3"]
    # One process: no job, so no job keys, no job verdict, no job run.
    assert not [k for k in hist.history if k.startswith("job/")] and det.job_verdict is None
    assert det.job_run_dir is None and "The job" not in det.summary()
    assert not (tmp_path / "input" / "job").exists()
    # Each epoch is its TensorBoard windows (which never span two epochs), the same way.
    acc = read_events(det.run_dir)
    points = {}
    for tag in ("input/steps", "input/wait_ms", "input/step_ms"):
        for e in acc.Scalars(tag):
            points.setdefault(e.step, {})[tag] = e.value
    ends = sorted(points)
    assert ends[-1] == 36 and {12, 24, 36} <= set(ends)
    for i, (lo, hi) in enumerate(((0, 12), (12, 24), (24, 36))):
        windows = [points[s] for s in ends if lo < s <= hi]
        assert sum(w["input/steps"] for w in windows) == 12
        assert epochs[i]["input/wait_fraction"] == pytest.approx(_time_weighted(windows, "input/wait_ms"), rel=1e-5)
    # The JSON for report(): the verdict with its scope, phases and bound; both sets of figures.
    record = json.loads(acc.Tensors("input/verdict/data")[-1].tensor_proto.string_val[0])
    assert record["scope"] == "fit" and record["verdict"]["scope"] == det.verdict.scope
    assert [p["label"] for p in record["verdict"]["phases"]] == ["epoch 1", "epoch 2", "epoch 3"]
    assert record["verdict"]["speedup_bound"] == pytest.approx(det.verdict.speedup_bound)
    assert record["fit_figures"]["input/wait_fraction"] == pytest.approx(fit.wait_fraction)
    assert record["figures"]["input/wait_fraction"] == pytest.approx(det.measurement.wait_fraction)
    assert "job" not in record


@pytest.mark.multibackend
def test_a_cache_filling_first_epoch_is_left_out_of_the_verdict(monkeypatch):
    tf = pytest.importorskip("tensorflow")
    x, y = uniform_regression_data(160)
    # Epoch 1 (10 batches) reads through the slow map and fills the cache; epochs 2-3 are served from it.
    timing_input.install(monkeypatch, compute=COMPUTE, fetch=lambda k: DELAY if k < 10 else 0.0)

    def slow(a, b):
        return tf.ensure_shape(tf.numpy_function(lambda v: v, [a], tf.float32), [None, 8]), b

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(slow).cache().prefetch(tf.data.AUTOTUNE)
    det = InputBoundDetector(window=5, sample_every=3, log_dir=None, verbose=0)
    tiny_dense_model().fit(ds, epochs=3, verbose=0, callbacks=[det])
    v = det.verdict
    assert v.scope == "epochs 2-3" and [p.steady for p in v.phases] == [False, True, True], det.summary()
    assert v.phases[0].reason == "while the cache filled"
    assert "Left out: epoch 1, which waited 95.2% while the cache filled" in v.message
    assert det.epoch_history[0]["input/wait_fraction"] == pytest.approx(WAIT_FRACTION, rel=1e-9)  # as it was
    assert det.measurement.wait_fraction == 0.0 and v.category == categories.NOT
    assert det.measurement.step == pytest.approx(COMPUTE, rel=1e-9)
    assert det.fit_measurement.step == pytest.approx((DELAY + 3 * COMPUTE) / 3, rel=1e-9)
    assert "interleave" not in "\n".join(v.advice)
    summary = det.summary()
    assert f"| figure | steady state, {v.scope} | whole fit |" in summary and "no: while the cache filled" in summary


@pytest.mark.multibackend
def test_one_epoch_is_split_into_its_windows(monkeypatch):
    # The first 8 batches wait, as while a remote store warms up; the rest come at once.
    timing_input.install(monkeypatch, compute=COMPUTE, fetch=lambda k: DELAY if k < 8 else 0.0)
    x, y = uniform_regression_data(384)
    det = InputBoundDetector(window=8, sample_every=2, log_dir=None, verbose=0)
    tiny_dense_model().fit(SlowSequence(x, y), epochs=1, shuffle=False, verbose=0, callbacks=[det])
    v = det.verdict
    assert [p.label for p in v.phases] == ["steps 1-8", "steps 9-16", "steps 17-24"]
    assert v.scope == "steps 9-24" and [p.steady for p in v.phases] == [False, True, True], det.summary()
    assert v.phases[0].reason.startswith("during warm-up")
    assert v.wait_fraction == 0.0 < v.fit_wait_fraction, det.summary()


# -- what is trained does not change --------------------------------------------------------
@pytest.mark.multibackend
def test_same_weights_batches_and_steps_with_and_without_detector():
    x, y = uniform_regression_data(160)
    results = []
    for with_detector in (False, True):
        model = tiny_dense_model(seed=3)
        seen = []

        class Count(keras.callbacks.Callback):
            def __init__(self, sink):
                super().__init__()
                self.sink = sink

            def on_train_batch_end(self, batch, logs=None):
                self.sink.append(batch)

        cbs = [Count(seen)]
        if with_detector:
            cbs.append(InputBoundDetector(window=4, sample_every=2, log_dir=None, verbose=0))
        keras.utils.set_random_seed(7)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0, callbacks=cbs)
        keras.utils.set_random_seed(7)
        model.fit(slow_generator(x, y), steps_per_epoch=5, epochs=1, verbose=0, callbacks=cbs)
        results.append(([np.array(w) for w in model.get_weights()], seen, int(model.optimizer.iterations)))
    (w0, s0, i0), (w1, s1, i1) = results
    assert s0 == s1 and i0 == i1 == 25
    for a, b in zip(w0, w1):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


# -- life cycle (contract) -------------------------------------------------------------------
@pytest.mark.multibackend
def test_two_fits_in_a_row(tmp_path):
    x, y = uniform_regression_data(64)
    model = tiny_dense_model()
    original = None
    det = InputBoundDetector(window=2, sample_every=2, log_dir=str(tmp_path), verbose=0)
    for _ in range(2):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det])
        original = original or model.train_function
        assert model.train_function is original
    assert det.global_step == 8
    assert len(det.epoch_history) == 2
    assert StepHook.installed(model) is None


@pytest.mark.multibackend
def test_cleans_up_after_a_fit_that_raised():
    x, y = uniform_regression_data(64)
    model = tiny_dense_model()
    model.fit(x[:16], y[:16], batch_size=16, verbose=0)
    original = model.train_function

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("boom")

    det = InputBoundDetector(sample_every=1, log_dir=None, verbose=0)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det, Boom()])
    # The session's watchdog restores Keras's function on its own thread: waited for, with a margin for load.
    assert wait_until(lambda: model.train_function is original)
    assert not det._running
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det])  # usable again
    assert model.train_function is original


@pytest.mark.multibackend
def test_stale_hook_removed_by_the_next_fit_when_the_guard_has_not_run_yet():
    x, y = uniform_regression_data(64)
    model = tiny_dense_model()
    model.fit(x[:16], y[:16], batch_size=16, verbose=0)
    original = model.train_function

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt

    det = InputBoundDetector(sample_every=1, log_dir=None, verbose=0)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det, Boom()])
    det2 = InputBoundDetector(sample_every=1, log_dir=None, verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det2])  # immediately, guard or not
    assert det2.global_step == 4
    assert wait_until(lambda: model.train_function is original)


# -- other callbacks and backends ----------------------------------------------------------------
@pytest.mark.multibackend
def test_gpu_logger_found_in_the_same_fit_and_quoted(monkeypatch):
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger

    x, y = uniform_regression_data(64)
    logger_cb = GPUUtilizationLogger(log_dir=None, interval=0.05)
    det = InputBoundDetector(log_dir=None, verbose=0)
    with pytest.warns(Warning):
        tiny_dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[logger_cb, det])
    assert det._gpu_logger is logger_cb

    timing_input.install(monkeypatch, compute=COMPUTE, fetch=lambda k: DELAY)  # the fit below: exactly HIGH
    fake = types.SimpleNamespace(timeline=[(time.time() + 1e6, 1, {"gpu/0/utilization_percent": 12.0})])
    det = InputBoundDetector(window=8, sample_every=3, log_dir=None, verbose=0, gpu_logger=fake)
    tiny_dense_model().fit(SlowSequence(*uniform_regression_data(256)), epochs=1, verbose=0, callbacks=[det])
    assert det.verdict.category == categories.HIGH
    assert det.verdict.evidence == ["Confirmed by the GPU: GPU utilization 12% while steps wait for input."]


@pytest.mark.multibackend
def test_torch_dataloader_on_torch(backend, slow_input):
    if backend != "torch":
        pytest.skip("torch DataLoader input needs the torch backend")
    import torch

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 160

        def __getitem__(self, i):  # a batch of 16 taken costs DELAY on the fake clock
            return torch.rand(8), torch.rand(1)

    loader = torch.utils.data.DataLoader(Slow(), batch_size=16)
    det = InputBoundDetector(window=5, sample_every=3, log_dir=None, verbose=0)
    tiny_dense_model().fit(loader, epochs=1, verbose=0, callbacks=[det])
    assert det.pipeline["kind"] == "torch DataLoader" and det.pipeline["num_workers"] == 0
    assert det.verdict.category == categories.HIGH
    assert det.measurement.wait_fraction == pytest.approx(WAIT_FRACTION, rel=1e-9)
    n = workers_needed(0, Measurement(step=DELAY + COMPUTE, compute=COMPUTE), cores=1)  # 1.25 x 21 ms / 1 ms
    assert n == 27 and any(f"Raise `num_workers` to {n} (now 0)" in a for a in det.verdict.advice)


@pytest.mark.multibackend
def test_steps_per_execution_on_tensorflow(backend, slow_input):
    if backend != "tensorflow":
        pytest.skip("steps_per_execution > 1 is measured per execution on TensorFlow")
    x, y = uniform_regression_data(256)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=4)
    det = InputBoundDetector(window=8, sample_every=2, log_dir=None, verbose=0)
    model.fit(slow_generator(x, y), steps_per_epoch=16, epochs=1, verbose=0, callbacks=[det])
    assert det.global_step == 16
    assert int(model.optimizer.iterations) == 16
    assert det.verdict.category == categories.HIGH
    assert det.measurement.wait == pytest.approx(DELAY, rel=1e-9)  # per step, not per execution
    assert det.measurement.compute == pytest.approx(COMPUTE, rel=1e-9)
    assert any("steps_per_execution=4" in n for n in det.notes)


@pytest.mark.multibackend
def test_jax_flops_and_mfu(backend):
    if backend != "jax":
        pytest.skip("XLA cost analysis is read on the JAX backend")
    x, y = uniform_regression_data(128)
    det = InputBoundDetector(sample_every=2, log_dir=None, verbose=0, peak_flops=1e12)
    hist = tiny_dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det])
    flops = hist.history["throughput/flops_per_sec"][0]
    steps = hist.history["throughput/steps_per_sec"][0]
    per_step = flops / steps
    dense = 2 * 16 * (8 * 16 + 16 * 1)  # forward matmul FLOPs of one batch
    assert 2 * dense < per_step < 20 * dense  # forward + backward + update
    assert hist.history["throughput/mfu"][0] == pytest.approx(flops / 1e12)
    assert hist.history["throughput/flops_per_sec_per_device"][0] == pytest.approx(flops)  # one device


def test_a_train_function_replaced_mid_epoch_does_not_stop_the_fit(tmp_path):
    # Another tool swaps Keras's own train function in and out in the middle of
    # an epoch: steps run without the hook, and on JAX the outputs the hook kept
    # have had their buffers donated to those steps ("BlockHostUntilReady()
    # called on deleted or donated buffer" at the epoch end, before the fix).
    # Monitoring never stops training.
    class Unhook(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.hooked = self.model.train_function

        def on_train_batch_begin(self, batch, logs=None):
            if batch in (5, 15):  # Keras's own function from here
                self.model.train_function = self.hooked.__wrapped__
            elif batch == 10:  # and ours again
                self.model.train_function = self.hooked

    model = tiny_dense_model()
    x, y = uniform_regression_data(320)
    det = InputBoundDetector(log_dir=str(tmp_path), verbose=0, sample_every=1000)
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[det, Unhook()])
    assert len(history.history["loss"]) == 2
    assert det.epoch_verdicts, "the detector still gave its verdicts"
