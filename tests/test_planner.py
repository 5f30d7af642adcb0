"""plan_batch_size on CPU, with a memory limit: XLA's memory analysis (JAX), real trial steps (TensorFlow, torch).

A CPU reports no memory capacity, so each test plans for `memory_limit_mib`.
The plan must fit (its peak within the limit less the margin), a batch not
much larger must not (the search's last failing trial), the model must come
out as it went in, and `OOMBatchSizeReducer(plan=...)` must start training
split at the plan's size, with no out-of-memory error at all.
"""

import tracemalloc

import keras
import numpy as np
import pytest
from keras import ops

from keras_gpu_tools import BatchPlan, OOMBatchSizeReducer, plan_batch_size
from tests.helpers.gpu import HAS_GPU
from tests.helpers.models import BACKEND, MemoryCliff, held_activations_model, real_oom

pytestmark = pytest.mark.multibackend
# These plan against the CPU's allocator figures (a device with no memory limit of its own, tensor
# storage counted op by op); on a GPU the device's own capacity and allocator apply instead.
cpu_only = pytest.mark.skipif(HAS_GPU, reason="plans against the CPU's allocator; a GPU machine plans against its GPU")
# TensorFlow plans from its CPU allocator's statistics, kept only by the allocator that a session of
# their own turns on (tests/conftest.py); on JAX and torch the mark changes nothing.
allocator_stats = pytest.mark.tf_allocator_stats
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="JAX plans from shapes; TensorFlow and torch run trial steps")


def limit_mib(free: float) -> float:
    """A memory limit ``free`` MiB above what the CPU allocator already holds.

    TensorFlow's allocator keeps about 12 MiB of each earlier fit of a
    million-parameter Adam model in the process, `clear_session()` or not (the
    test suite runs many fits before these); on a GPU that memory would be taken
    too, so the plan counts it. JAX plans from shapes and torch's CPU trial
    steps measure what the step adds.
    """
    if BACKEND != "tensorflow":
        return free
    import tensorflow as tf

    return free + tf.config.experimental.get_memory_info("CPU:0")["current"] / 2**20


def wide_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


@cpu_only
@allocator_stats
def test_the_plan_fits_the_limit_a_larger_batch_does_not_and_the_model_is_unchanged():
    model = wide_model()
    x = np.random.RandomState(0).rand(10, 64).astype("float32")
    y = np.random.RandomState(1).rand(10, 1).astype("float32")
    limit = limit_mib(48)
    plan = plan_batch_size(model, x, y, memory_limit_mib=limit, margin=0.1)
    assert isinstance(plan, BatchPlan) and plan.devices == 1 and plan.capacity_mib == [limit]
    assert 0 < plan.batch_size == plan.per_device_batch_size
    assert plan.peak_mib[0] <= 0.9 * limit
    fitting = [t.batch_size for t in plan.trials if t.fits]
    failing = [t.batch_size for t in plan.trials if not t.fits]
    assert max(fitting) == plan.batch_size and min(failing) <= 1.5 * plan.batch_size
    # the peaks grow with the batch (the memory model the search relies on), by the activations' size
    peaks = dict(sorted((t.batch_size, t.peak_bytes[0]) for t in plan.trials if t.peak_bytes))
    activations = 1024 * 2048 * 4  # the hidden layer's output at batch 1024, float32
    assert activations <= peaks[1024] - peaks[1] <= 4 * activations
    assert plan.method and str(plan).startswith(f"batch size {plan.batch_size}: predicted peak")
    # trial steps (TensorFlow, torch) trained the model; it is put back
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 0
    fresh = wide_model()
    fresh.build((None, 64))
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)
    capped = plan_batch_size(model, x, y, memory_limit_mib=limit, max_batch_size=100)
    assert capped.batch_size == 100 and max(t.batch_size for t in capped.trials) == 100


@cpu_only
def test_bad_arguments_are_refused_with_keras_style_messages():
    model = wide_model()
    x = np.zeros((4, 64), "float32")
    y = np.zeros((4, 1), "float32")
    with pytest.raises(ValueError, match="Received: memory_limit_mib=None, but this device reports no memory"):
        plan_batch_size(model, x, y)  # a CPU has no capacity to plan for
    with pytest.raises(ValueError, match="Invalid value for argument `margin`"):
        plan_batch_size(model, x, y, memory_limit_mib=64, margin=1.0)
    with pytest.raises(ValueError, match="needs a compiled model"):
        plan_batch_size(keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)]), x, y, memory_limit_mib=64)


@allocator_stats
def test_the_reducer_starts_split_at_the_plan_and_regrows_only_to_it():
    model = wide_model()
    r = np.random.RandomState(3)
    x, y = r.rand(64, 64).astype("float32"), r.rand(64, 1).astype("float32")
    plan = plan_batch_size(model, x, y, memory_limit_mib=limit_mib(48), max_batch_size=16)
    assert plan.batch_size == 16
    reducer = OOMBatchSizeReducer(plan=plan, regrow_after=1)
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0, callbacks=[reducer])
    assert reducer.events == [] and reducer.micro_batches == 4 and reducer.micro_batch_size == 16
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 2  # accumulated: one update per batch
    with pytest.raises(ValueError, match="Invalid value for argument `plan`"):
        OOMBatchSizeReducer(plan=0)


@cpu_only
@real_oom
@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow's CPU allocator that fails at once keeps no statistics")
def test_training_at_the_plan_never_runs_out_of_memory_and_regrows_only_to_it():
    n = 32
    r = np.random.RandomState(2)
    x, y = r.randn(n, 3).astype("float32"), r.randn(n, 1).astype("float32")

    def cliff_model():
        keras.utils.set_random_seed(1)
        inp = keras.Input((3,))
        out = keras.layers.Dense(1)(keras.layers.Dense(8)(MemoryCliff(4)(inp)))
        model = keras.Model(inp, out)
        model.compile("sgd", "mse")
        return model

    model = cliff_model()
    # Above 4 samples the step needs TiBs: JAX predicts it, TensorFlow and torch run out of memory in the trial.
    plan = plan_batch_size(model, x, y, memory_limit_mib=1024)
    assert plan.batch_size == 4
    reducer = OOMBatchSizeReducer(plan=plan, regrow_after=1)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[reducer])
    assert reducer.events == [] and reducer.micro_batches == 4  # split from the first step; never grown past 4
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 4
    reference = cliff_model()
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[OOMBatchSizeReducer()])
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # the same training as recovering would give


@jax_only
def test_jax_plans_from_shapes_and_builds_no_host_batch_of_the_trial_size():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4096,)), keras.layers.Dense(1)])  # wide input: the batch is the peak
    model.compile("sgd", "mse")
    x, y = np.random.RandomState(0).rand(8, 4096), np.zeros((8, 1), "float32")  # float64: trained on as float32
    tracemalloc.start()
    try:
        plan = plan_batch_size(model, x, y, memory_limit_mib=256)
        host_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    largest_trial = max(t.batch_size for t in plan.trials)
    assert plan.batch_size * 4096 * 4 > 128 * 2**20  # a host batch at the plan's size: over 128 MiB of float32
    assert largest_trial > plan.batch_size
    assert host_peak < 16 * 2**20, f"{host_peak / 2**20:.0f} MiB on the host planning up to batch {largest_trial}"


@pytest.mark.slow
@jax_only
def test_jax_predicts_the_same_peak_from_shapes_as_from_real_batches():
    from keras_gpu_tools import backends
    from keras_gpu_tools.memory.search import sample_batch

    keras.utils.set_random_seed(0)
    a, b = keras.Input((16,), name="a"), keras.Input((8,), name="b", dtype="int32")
    hidden = keras.layers.Concatenate()([keras.layers.Dense(256)(a), keras.layers.Embedding(50, 32)(b)[:, 0]])
    model = keras.Model({"a": a, "b": b}, [keras.layers.Dense(1)(hidden), keras.layers.Dense(3)(hidden)])
    model.compile("adam", ["mse", "sparse_categorical_crossentropy"])
    r = np.random.RandomState(0)
    x = {"a": r.rand(5, 16), "b": r.randint(0, 50, (5, 8))}  # float64 and int64, as users pass them
    y = [r.rand(5, 1), r.randint(0, 3, (5,))]
    # Builds the model and its optimizer. A small limit: the plan's batch (about 250 rows) takes a
    # few compiled trials; the sizes compared below do not depend on it.
    plan = plan_batch_size(model, x, y, memory_limit_mib=1)
    backend = backends.get()
    for size in (1, 5, 300, plan.batch_size):
        real = backend.step_memory(model, sample_batch(x, y, size, 5), 1)
        assert backend.step_memory(model, sample_batch(x, y, size, 5, shapes_only=True), 1) == real
    fitting = [t for t in plan.trials if t.fits and t.batch_size == plan.batch_size]
    assert fitting and fitting[0].peak_bytes == real[0]  # the plan's peak is a real batch's


@pytest.mark.skipif(BACKEND != "torch", reason="the CUDA caching allocator is torch's")
def test_torch_hands_the_trial_steps_cached_blocks_back_after_planning(monkeypatch):
    # No GPU here: a stand-in for torch.cuda records the call; the model is put back for real.
    from keras_gpu_tools.backends.torch import backend as torch_backend
    from keras_gpu_tools.backends.torch import planner as torch_planner

    calls = []

    class FakeCuda:
        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def empty_cache():
            calls.append("empty_cache")

    model = wide_model()
    x = np.random.RandomState(0).rand(8, 64).astype("float32")
    y = np.random.RandomState(1).rand(8, 1).astype("float32")
    backend = torch_backend.TorchBackend()
    snapshot = backend.plan_snapshot(model, (x, y))
    before = [np.array(w) for w in model.get_weights()]
    model.train_on_batch(x, y)
    monkeypatch.setattr(torch_planner, "available_cuda", lambda: FakeCuda)
    backend.plan_restore(model, snapshot)
    assert calls == ["empty_cache"]
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(
    BACKEND != "torch", reason="the failed step's tensors are Python objects on torch only (see HeldActivations)"
)
def test_a_failed_trials_tensors_are_freed_before_the_next_trial():
    # Left held, a failed trial's tensors count in every later trial's peak (on a GPU), and the
    # plan comes out smaller than what fits.
    model, act = held_activations_model(limit=24)
    x, y = np.ones((64, 3), "float32"), np.ones((64, 1), "float32")
    plan = plan_batch_size(model, x, y, memory_limit_mib=1024)
    assert plan.batch_size == 24 and len(act.failed) >= 2  # 32 failed, then the search between 16 and 32
    assert act.alive and max(act.alive) == 0


@allocator_stats
def test_planning_puts_the_compiled_metrics_state_back():
    model = wide_model()
    r = np.random.RandomState(4)
    x, y = r.rand(10, 64).astype("float32"), r.rand(10, 1).astype("float32")
    model.fit(x, y, batch_size=5, epochs=1, shuffle=False, verbose=0)
    before = {k: float(ops.convert_to_numpy(v)) for k, v in model.get_metrics_result().items()}
    assert set(before) == {"loss", "mae"} and all(v > 0 for v in before.values())
    plan_batch_size(model, x, y, memory_limit_mib=48, max_batch_size=8)
    after = {k: float(ops.convert_to_numpy(v)) for k, v in model.get_metrics_result().items()}
    assert after == pytest.approx(before, rel=1e-6)


def test_data_that_cannot_train_is_refused_before_anything_is_touched():
    model = wide_model()
    x, y = np.zeros((10, 64), "float32"), np.zeros((7, 1), "float32")
    with pytest.raises(ValueError, match=r"`x`.*`y`.*10.*7"):
        plan_batch_size(model, x, y, memory_limit_mib=48)
    with pytest.raises(ValueError, match=r"`x`.*`y`.*10.*7"):
        plan_batch_size(model, {"a": x}, [y], memory_limit_mib=48)
    with pytest.raises(ValueError, match=r"Received: y=None.*loss"):
        plan_batch_size(model, x, None, memory_limit_mib=48)
    assert not model.optimizer.built  # nothing was built for training
    model.fit(x, np.zeros((10, 1), "float32"), epochs=1, verbose=0)


def test_max_batch_size_below_the_device_count_is_refused(monkeypatch):
    from keras_gpu_tools import backends

    monkeypatch.setattr(type(backends.get()), "replicas", lambda self, model: 2)
    model = wide_model()
    x, y = np.zeros((10, 64), "float32"), np.zeros((10, 1), "float32")
    with pytest.raises(ValueError, match=r"Received: max_batch_size=1.*2 devices"):
        plan_batch_size(model, x, y, memory_limit_mib=48, max_batch_size=1)
    assert not model.optimizer.built


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution.DataParallel is JAX's; the test starts its own")
def test_max_batch_size_is_respected_under_data_parallelism(tmp_path):
    import os
    import subprocess
    import sys

    script = """
import keras, numpy as np
from keras_gpu_tools import plan_batch_size
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile("adam", "mse")
x, y = np.zeros((10, 8), "float32"), np.zeros((10, 1), "float32")
try:
    plan_batch_size(model, x, y, memory_limit_mib=64, max_batch_size=1)
except ValueError as e:
    print("REFUSED", e)
for m in (2, 5, 6):
    plan = plan_batch_size(model, x, y, memory_limit_mib=64, max_batch_size=m)
    print("PLAN", m, plan.batch_size, plan.per_device_batch_size, plan.devices)
"""
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    refused = [ln for ln in lines if ln.startswith("REFUSED")]
    assert refused and "max_batch_size=1" in refused[0] and "2 devices" in refused[0], out.stdout
    plans = [ln.split()[1:] for ln in lines if ln.startswith("PLAN")]
    assert plans == [["2", "2", "1", "2"], ["5", "4", "2", "2"], ["6", "6", "3", "2"]], out.stdout


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow's; the test starts its own")
def test_a_memory_plan_over_a_strategys_cpu_devices_is_refused_before_anything_is_touched():
    import os
    import subprocess
    import sys

    # Logical devices are fixed before TensorFlow initialises its devices: a fresh process.
    script = """
import keras, numpy as np, tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
from keras_gpu_tools import plan_batch_size
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("adam", "mse", metrics=["mae"])
for inside in (True, False):
    try:
        if inside:
            with strategy.scope():
                plan_batch_size(model, x, y, memory_limit_mib=64)
        else:
            plan_batch_size(model, x, y, memory_limit_mib=64)
    except ValueError as e:
        print("REFUSED", inside, model.optimizer.built, str(e).replace(chr(10), " "))
h = model.fit(x, y, batch_size=4, epochs=1, verbose=0).history
print("FIT", int(model.optimizer.iterations.numpy()), sorted(h))
"""
    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    refused = [ln.split(" ", 3) for ln in out.stdout.splitlines() if ln.startswith("REFUSED")]
    assert [r[1:3] for r in refused] == [["True", "False"], ["False", "False"]], out.stdout
    # Logical CPU devices share one allocator: no replica's own peak.
    assert all("the 2 replicas of this MirroredStrategy are CPU devices" in r[3] for r in refused), out.stdout
    assert all("share one allocator" in r[3] and "objective='throughput'" in r[3] for r in refused), out.stdout
    assert "FIT 2 ['loss', 'mae']" in out.stdout, out.stdout + out.stderr[-3000:]
