"""plan_batch_size(objective="throughput") under data parallelism in one process: candidates per device.

TensorFlow's MirroredStrategy over 2 logical CPU devices, and JAX's
keras.distribution.DataParallel over 2 host devices: each test starts a fresh
process, since the devices are fixed before the framework initialises them.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.models import BACKEND

pytestmark = pytest.mark.multibackend


def run_script(script: str, backend: str, **env) -> dict:
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


MIRRORED = """
import json, math, keras, numpy as np, tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
from keras_gpu_tools import OOMBatchSizeReducer, plan_batch_size

class AtMost(keras.layers.Layer):  # fails the step where a replica is handed more rows than its share
    def __init__(self, rows, **kw):
        super().__init__(**kw)
        self.rows = rows
    def call(self, x):
        tf.debugging.assert_less_equal(tf.shape(x)[0], self.rows, message="a replica got more than its share")
        return x

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
r = np.random.RandomState(0)
x, y = r.rand(32, 4).astype("float32"), r.rand(32, 1).astype("float32")
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), AtMost(4), keras.layers.Dense(8), keras.layers.BatchNormalization(),
                              keras.layers.Dropout(0.3), keras.layers.Dense(1)])
    model.compile("adam", "mse", metrics=["mae"])
model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # a trained state; the metrics differ per replica

def state():  # every replica's value of every variable (a metric's differs between replicas)
    return [[c.numpy().tolist() for c in v.value.values] for v in model.variables + model.optimizer.variables
            + model.metrics_variables]

before = state()
out = {}
for name, inside in (("outside", False), ("inside", True)):
    if inside:
        with strategy.scope():
            plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=math.inf, global_batch_size=8)
    else:
        plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=math.inf, max_batch_size=8)
    out[name] = {
        "devices": plan.devices, "batch_size": plan.batch_size, "per_device": plan.per_device_batch_size,
        "sizes": [[c.batch_size, c.per_device_batch_size, c.measured] for c in plan.candidates],
        "micro_batches": plan.micro_batches, "unchanged": state() == before, "method": plan.method,
    }
reducer = OOMBatchSizeReducer(plan=plan)  # the fixed global batch of 8, split as planned
model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[reducer])
out["trained"] = [int(model.optimizer.iterations.numpy()), reducer.micro_batches, len(reducer.events)]
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow's; the test starts its own")
def test_a_mirrored_strategy_plans_per_replica_candidates_and_puts_every_replica_back():
    out = run_script(MIRRORED, "tensorflow")
    outside, inside = out["outside"], out["inside"]
    # Candidates per replica (2, 4 rows each), the global batch twice that; each replica trained its share
    # in every timed fit (a replica given more than 4 rows would have failed the step).
    assert outside["devices"] == 2 and outside["batch_size"] == 2 * outside["per_device"]
    assert outside["sizes"] == [[4, 2, True], [8, 4, True]]
    assert "each candidate timed" in outside["method"]
    # Every replica's value of every variable exactly as before: weights, optimizer, statistics, metrics.
    assert outside["unchanged"] and inside["unchanged"]
    # In the strategy's scope too, and a fixed global batch of 8 gets its fastest split per replica.
    assert inside["sizes"] == [[2, 1, True], [4, 2, True], [8, 4, True]]  # 4 has no divisor a multiple of 8
    assert inside["micro_batches"] == 8 // inside["batch_size"]
    iterations, micro_batches, events = out["trained"]
    assert iterations == 4 + 4 and micro_batches == inside["micro_batches"] and events == 0


DATA_PARALLEL = """
import json, math, keras, numpy as np
from keras_gpu_tools import plan_batch_size
from tests.helpers.fresh_process import tensorflow_hidden
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
with tensorflow_hidden():  # Keras seeds TensorFlow too where installed: an import this JAX fit never uses
    keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dropout(0.2), keras.layers.Dense(1)])
model.compile("adam", "mse")
r = np.random.RandomState(0)
x, y = r.rand(16, 8).astype("float32"), r.rand(16, 1).astype("float32")
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
state = lambda: [np.asarray(v.value).tolist() for v in model.variables + model.optimizer.variables]
before = state()
out = {}
for name, kwargs in (("bounded", {"max_batch_size": 8}), ("memory", {"memory_limit_mib": 64, "max_batch_size": 16})):
    plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=math.inf, **kwargs)
    out[name] = {
        "devices": plan.devices, "batch_size": plan.batch_size, "per_device": plan.per_device_batch_size,
        "sizes": [[c.batch_size, c.per_device_batch_size, c.measured] for c in plan.candidates],
        "peaks": [c.peak_mib for c in plan.candidates], "unchanged": state() == before,
    }
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution.DataParallel is JAX's; the test starts its own")
def test_data_parallel_over_two_devices_plans_per_device_candidates():
    out = run_script(DATA_PARALLEL, "jax", JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    bounded, memory = out["bounded"], out["memory"]
    assert bounded["devices"] == 2 and bounded["batch_size"] == 2 * bounded["per_device"]
    assert bounded["sizes"] == [[4, 2, True], [8, 4, True]]
    assert bounded["peaks"] == [None] * 2  # a CPU: no capacity, no memory analysis asked for
    # With a memory limit the candidates come from XLA's memory analysis, per device, compiled not run.
    assert memory["sizes"] == [[4, 2, True], [8, 4, True], [16, 8, True]]
    assert all(p is not None and p > 0 for p in memory["peaks"])
    assert memory["peaks"] == sorted(memory["peaks"])
    assert bounded["unchanged"] and memory["unchanged"]


MIRRORED_GPUS = """
import json, keras, numpy as np, tensorflow as tf
from keras_gpu_tools import plan_batch_size
gpus = tf.config.list_logical_devices("GPU")
strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
r = np.random.RandomState(0)
x, y = r.rand(256, 512).astype("float32"), r.rand(256, 1).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(4096, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
plan = plan_batch_size(model, x, y, objective="throughput", max_batch_size=4096 * len(gpus), max_seconds=120)
h = model.fit(x, y, batch_size=plan.batch_size, epochs=1, verbose=0).history
print(json.dumps({"gpus": len(gpus), "devices": plan.devices, "per_device": plan.per_device_batch_size,
                  "batch_size": plan.batch_size, "capacity": plan.capacity_mib, "trials": len(plan.trials),
                  "peaks": [c.peak_mib for c in plan.candidates], "text": str(plan), "loss": h["loss"][-1]}))
"""


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute is TensorFlow's; the test starts its own")
def test_a_mirrored_strategy_over_gpus_plans_each_replicas_memory():
    from tests.helpers.gpu import HAS_GPU

    if not HAS_GPU:
        pytest.skip("needs GPUs")
    out = run_script(MIRRORED_GPUS, "tensorflow")
    if out["gpus"] < 2:
        pytest.skip(f"a strategy of 2 replicas or more; this machine has {out['gpus']} GPU")
    # The memory search ran per replica on each GPU (its capacity, trial fit() steps), then the candidates.
    assert out["devices"] == out["gpus"] and out["batch_size"] == out["gpus"] * out["per_device"], out["text"]
    assert len(out["capacity"]) == out["gpus"] and out["trials"] > 0, out["text"]
    assert all(p is not None for p in out["peaks"]), out["text"]
    assert out["loss"] == out["loss"]  # the planned batch trains (not NaN)
