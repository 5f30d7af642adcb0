"""InputBoundDetector's step breakdown end to end: real fit(), compile and retraces, parts that add up."""

import statistics

import keras
import numpy as np
import pytest

from keras_gpu_tools.backends import get as get_backend
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import breakdown as bd
from keras_gpu_tools.logdir import schema
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_profile import FakeStepTime, fake_step_clock

BACKEND = keras.backend.backend()
COMPILES = BACKEND != "torch"  # torch without jit_compile runs eagerly: nothing compiles
PARTS = (schema.STEP_INPUT_MS, schema.STEP_DISPATCH_MS, schema.STEP_COMPUTE_MS, schema.STEP_COLLECTIVE_MS)
# The step hook reads a fake clock that only the train function moves (tests.helpers.timing_profile): a call
# "takes" COMPUTE seconds and the fit's first call LUMP more, so compile time and the parts are exact under load.
COMPUTE, LUMP = 0.004, 0.5


class BatchTimes(keras.callbacks.Callback):
    """Keras's own batch hooks around each train-function call: each call's wall time, and each epoch's from
    its first call's start to its last call's end (the epoch's own set-up, its iterator, left out), on ``clock``."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def on_epoch_begin(self, epoch, logs=None):
        self.calls, self.first = [], None

    def on_train_batch_begin(self, batch, logs=None):
        self.t = self.clock()
        self.first = self.t if self.first is None else self.first

    def on_train_batch_end(self, batch, logs=None):
        self.last = self.clock()
        self.calls.append(self.last - self.t)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs = getattr(self, "epochs", []) + [(self.last - self.first, list(self.calls))]


def _data(n, features=8):
    rng = np.random.default_rng(0)
    return rng.random((n, features), dtype="float32"), rng.random((n, 1), dtype="float32")


def _framework_retraces(model):
    """The framework's own count, read apart: every trace of the train step's functions but each one's first."""
    traces = get_backend().compiled_functions(model, ("train_function",)) or {}
    return sum(traces.values()) - sum(1 for c in traces.values() if c)


def _adds_up(logs):
    """The parts add up to the step, and the step is the one the fake clock gave each call."""
    parts = sum(logs.get(k, 0.0) for k in PARTS) + logs[schema.STEP_OTHER_MS]
    step = logs[schema.STEP_STEP_MS]
    return parts == pytest.approx(step, rel=1e-9) and step == pytest.approx(COMPUTE * 1e3, rel=1e-9)


def _timed(clock):
    return FakeStepTime(clock, compute=COMPUTE, compile=LUMP)


@pytest.mark.multibackend
def test_a_smaller_last_batch_is_one_retrace_counted_exactly(tmp_path, monkeypatch):
    step_clock = fake_step_clock(monkeypatch)
    x, y = _data(330)  # 10 batches of 32 and one of 10
    det = InputBoundDetector(log_dir=tmp_path, verbose=0)
    model = tiny_dense_model()
    h = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[det, _timed(step_clock)])
    retraces, compile_s = h.history[schema.STEP_RETRACES], h.history[schema.STEP_COMPILE_SECONDS]
    if COMPILES:
        # JAX compiles the step once per batch shape; TensorFlow's fit() loop takes any batch size, and the
        # per-batch tf.function of the timed calls (reduce_retracing) traces again or not: its own count says.
        assert retraces == ([1, 0] if BACKEND == "jax" else [_framework_retraces(model), 0])
        # the first call's lump, and nothing in an epoch that traces nothing new (the retrace's own call
        # takes no longer than a normal one on the fake clock)
        assert compile_s == pytest.approx([LUMP, 0.0], abs=1e-9)
        assert "(10, 8) (10, 1)" in det.breakdown.shapes
    else:
        assert retraces == [0, 0] and compile_s == [0.0, 0.0]
    for e in range(2):
        assert _adds_up({k: v[e] for k, v in h.history.items()})
    fb = det.breakdown
    assert fb.largest is not None and fb.advice
    assert "Step breakdown" in det.summary()
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(tmp_path / "input"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars(schema.STEP_RETRACES)] == retraces
    text = acc.Tensors(schema.STEP_BREAKDOWN)[-1].tensor_proto.string_val[0].decode()
    assert "Largest part" in text


@pytest.mark.multibackend
def test_compile_seconds_match_the_first_calls_timed_by_kerass_batch_hooks(monkeypatch):
    step_clock = fake_step_clock(monkeypatch)
    if not COMPILES:
        pytest.skip("torch without jit_compile compiles nothing")
    x, y = _data(32 * 40)  # no partial batch: the first call(s) compile, nothing retraces
    timer = BatchTimes(step_clock)  # Keras's batch hooks on the step hook's clock: one stopwatch, two readers
    det = InputBoundDetector(log_dir=None, verbose=0)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    x = np.repeat(x, 8, axis=1)
    h = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[det, _timed(step_clock), timer])
    calls = timer.epochs[0][1]
    normal = statistics.median(calls)
    by_hand = sum(t - normal for t in calls if t > 10 * normal)  # the compiling calls' lumps
    assert len(calls) == 40 and normal == pytest.approx(COMPUTE, rel=1e-9)
    assert by_hand == pytest.approx(LUMP, rel=1e-9)
    assert h.history[schema.STEP_COMPILE_SECONDS][0] == pytest.approx(by_hand, rel=1e-9)
    # TensorFlow's count has a retrace where the first call creates the optimizer's variables (Adam)
    assert h.history[schema.STEP_RETRACES] == [_framework_retraces(model) if BACKEND == "tensorflow" else 0]


@pytest.mark.multibackend
def test_a_custom_train_step_is_broken_down_too(monkeypatch):
    step_clock = fake_step_clock(monkeypatch)

    class Custom(keras.Sequential):
        calls = 0

        def train_step(self, *args):
            Custom.calls += 1  # traced (TF, JAX) or run (torch)
            return super().train_step(*args)

    keras.utils.set_random_seed(0)
    model = Custom([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = _data(330)
    det = InputBoundDetector(log_dir=None, verbose=0)
    h = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[det, _timed(step_clock)])
    assert Custom.calls > 0
    assert h.history[schema.STEP_RETRACES] == [_framework_retraces(model) if COMPILES else 0, 0]
    if BACKEND == "jax":
        assert h.history[schema.STEP_RETRACES] == [1, 0]
    assert all(_adds_up({k: v[e] for k, v in h.history.items()}) for e in range(2))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="jit_compile=False: TensorFlow's tf.function without XLA")
def test_tensorflow_without_xla_traces_and_retraces(monkeypatch):
    step_clock = fake_step_clock(monkeypatch)
    model = tiny_dense_model()
    model.compile("sgd", "mse", jit_compile=False)
    x, y = _data(330)
    det = InputBoundDetector(log_dir=None, verbose=0)
    h = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[det, _timed(step_clock)])
    assert h.history[schema.STEP_RETRACES] == [_framework_retraces(model), 0]
    assert h.history[schema.STEP_COMPILE_SECONDS] == pytest.approx([LUMP, 0.0], abs=1e-9)
    assert all(_adds_up({k: v[e] for k, v in h.history.items()}) for e in range(2))


def _storm(sizes):
    rng = np.random.default_rng(0)
    while True:
        for n in sizes:
            yield rng.random((n, 8), dtype="float32"), rng.random((n, 1), dtype="float32")


@pytest.mark.slow
@pytest.mark.multibackend
def test_a_retrace_storm_is_counted_exactly_and_keeps_little(monkeypatch):
    monkeypatch.setattr(bd, "MAX_SHAPES", 4)
    sizes = list(range(2, 32))  # 30 shapes, each once an epoch
    model = tiny_dense_model()
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=7)
    h = model.fit(_storm(sizes), steps_per_epoch=len(sizes), epochs=2, verbose=0, callbacks=[det])
    retraces = h.history[schema.STEP_RETRACES]
    if not COMPILES:
        assert retraces == [0, 0]
    else:
        assert sum(retraces) == _framework_retraces(model) and retraces[1] == 0
        if BACKEND == "jax":
            assert retraces == [len(sizes) - 1, 0]  # a jitted step compiles once per shape
    steps = det._steps.steps
    assert len(steps.shapes) <= 4 and len(steps._seen) <= 5
    assert len(steps._calls) <= bd.MAX_CALLS and len(steps._intervals) <= bd.MAX_INTERVALS


@pytest.mark.slow
@pytest.mark.multibackend
def test_the_parts_add_up_to_the_measured_step_time(monkeypatch):
    """Steady epochs: step/step_ms is the time per step between Keras's own batch hooks on the same clock."""
    step_clock = fake_step_clock(monkeypatch)
    timer = BatchTimes(step_clock)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = _data(256 * 60, 256)
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=10)
    h = model.fit(x, y, batch_size=256, epochs=3, verbose=0, callbacks=[det, _timed(step_clock), timer])
    for e in (1, 2):
        wall, calls = timer.epochs[e]
        logs = {k: v[e] for k, v in h.history.items()}
        assert _adds_up(logs)
        measured = (wall - logs[schema.STEP_COMPILE_SECONDS]) / len(calls) * 1e3
        assert len(calls) == 60 and logs[schema.STEP_STEP_MS] == pytest.approx(measured, rel=1e-9)


def test_the_report_and_the_live_view_show_the_breakdown(tmp_path, monkeypatch):
    step_clock = fake_step_clock(monkeypatch)
    from keras_gpu_tools.live.render import breakdown_line
    from keras_gpu_tools.reporting import html, text
    from keras_gpu_tools.reporting.from_callbacks import gather
    from keras_gpu_tools.reporting.from_logdir import gather_log_dir

    x, y = _data(330)
    det = InputBoundDetector(log_dir=tmp_path, verbose=0)
    h = tiny_dense_model().fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[det, _timed(step_clock)])
    from_logs, from_callbacks = gather_log_dir(str(tmp_path)), gather([det])
    assert from_logs.breakdown == from_callbacks.breakdown
    b = from_logs.breakdown
    assert b["retraces"] == det.breakdown.retraces and b["largest"] and b["advice"]
    assert sum(b["parts"].values()) == pytest.approx(b["step"], rel=1e-6)
    assert b["step"] == pytest.approx(COMPUTE, rel=1e-9)  # seconds per step, from the fake clock
    assert b["compile_seconds"] == pytest.approx(LUMP if COMPILES else 0.0, abs=1e-9)
    if COMPILES:  # 0.5 s of a fit of 0.5 + 22 x 4 ms: the largest part, whatever the machine
        assert b["largest"] == "compile/trace" and "85.0% of the fit" in b["advice"][0]
    page, report = html.render(from_logs, {}), text.render(from_logs)
    assert "Step breakdown" in page and "Step breakdown" in report
    assert f"Largest part: {b['largest']}" in report
    line = breakdown_line({k: v[-1] for k, v in h.history.items()})
    assert "compute" in line and line.endswith("ms")


class CompileEveryCall(FakeStepTime):
    """The fake clock moves ``compile`` seconds more on every call: a storm where every batch has a new shape
    (each shape once), so its compile time is known exactly: ``compile`` times the calls."""

    def inner(self, fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.clock.advance(self.compute + self.compile)
            self.calls += 1
            return out

        return call


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="a jitted step compiles once per batch shape")
def test_a_retrace_storm_on_the_fast_path_is_compile_time_and_named_the_cause(monkeypatch):
    step_clock = fake_step_clock(monkeypatch)
    sizes = list(range(2, 22))  # 20 shapes: most of them first run on calls the hook does not time
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=7)
    timed = CompileEveryCall(step_clock, compute=COMPUTE, compile=LUMP)
    tiny_dense_model().fit(_storm(sizes), steps_per_epoch=len(sizes), epochs=1, verbose=0, callbacks=[det, timed])
    fb = det.breakdown
    assert fb.retraces == len(sizes) - 1
    assert timed.calls == len(sizes) and fb.compile_seconds == pytest.approx(LUMP * timed.calls, rel=0.1)
    assert fb.largest == "retraces"
    text = " ".join(fb.advice)
    assert "drop_remainder=True" in text and "steps_per_execution" not in text
