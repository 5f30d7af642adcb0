"""The step breakdown's collectives under data parallelism in one process: an all-reduce timed at fit start.

TensorFlow's MirroredStrategy over 2 logical CPU devices and JAX's
keras.distribution.DataParallel over 2 host devices: each fit runs in a fresh
process, since the devices are fixed before the framework initialises them.
"""

import json
import os
import subprocess
import sys

import pytest

from keras_gpu_tools.runtime.units import format_bytes

pytestmark = [pytest.mark.multibackend, pytest.mark.slow]

FIT = """
import contextlib, json, sys, keras, numpy as np
if keras.backend.backend() == "tensorflow":
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
    scope = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope  # a new context per model
else:
    from tests.helpers.fresh_process import tensorflow_hidden
    with tensorflow_hidden():  # Keras seeds TensorFlow too where installed: an import this JAX fit never uses
        keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    scope = contextlib.nullcontext
from keras_gpu_tools import InputBoundDetector, report

out = {}
for width in (32, 1536):  # 12 KiB and 9.4 MiB of trainable weights
    r = np.random.RandomState(0)
    x, y = r.rand(256, 64).astype("float32"), r.rand(256, 1).astype("float32")
    with scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
        model.compile("adam", "mse")
    det = InputBoundDetector(log_dir=sys.argv[1] + f"/{width}", verbose=0)
    h = model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[det])
    b = det.breakdown
    out[width] = {
        "history": {k: v for k, v in h.history.items() if k.startswith("step/")},
        "collective_how": b.collective_how, "collective_reason": b.collective_reason,
        "summary": det.summary(), "report": report(sys.argv[1] + f"/{width}").text(),
    }
print(json.dumps(out))
"""


def fit_both(backend: str, log_dir, **env) -> tuple[dict, dict]:
    """The small and the large model's fits, in a fresh process of ``backend``."""
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    run = subprocess.run(
        [sys.executable, "-c", FIT, str(log_dir)], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    return out["32"], out["1536"]


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_collectives_are_timed_and_scale_with_the_weights(backend, tmp_path):
    if os.environ.get("KERAS_BACKEND", "tensorflow") != backend:
        pytest.skip(
            f"a fit in a fresh {backend} process: run once, by the {backend} session (torch has no data "
            "parallelism in one process in Keras)"
        )
    small, large = fit_both(backend, tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    for fit in (small, large):
        h = fit["history"]
        assert fit["collective_reason"] is None
        assert fit["collective_how"].startswith("one all-reduce of ") and " over 2 " in fit["collective_how"]
        for i, step in enumerate(h["step/step_ms"]):
            parts = sum(h[k][i] for k in h if k.endswith("_ms") and k != "step/step_ms")
            assert parts == pytest.approx(step, rel=1e-6)  # the parts are carved out of the step: they add up
            # timed at fit start and carved out of compute (which is part of the step): positive and in the step
            assert 0 < h["step/collective_ms"][i] <= step
        assert "| collectives |" in fit["summary"] and "Collectives: one all-reduce of " in fit["summary"]
        assert "Collectives: one all-reduce of " in fit["report"]
    # What scales with the weights is the all-reduce's size: float32 weights of 3,169 and 2,462,209 parameters
    # (about 780 times the bytes). How long each takes is measured, so their ratio is left to a benchmark.
    for fit, params in ((small, 3 * 32 + 64 * 32 + 32 * 32 + 1), (large, 3 * 1536 + 64 * 1536 + 1536 * 1536 + 1)):
        assert fit["collective_how"].startswith(f"one all-reduce of {format_bytes(4 * params)} over 2 ")
    assert "scaled to the weights'" not in large["collective_how"]  # under the probe's 32 MiB: timed at its size


@pytest.mark.gpu
def test_collectives_on_two_gpus_run_at_the_interconnects_speed(tmp_path):
    if os.environ.get("KERAS_BACKEND") != "jax":
        pytest.skip("JAX's keras.distribution over the GPUs of one process")
    jax = pytest.importorskip("jax")
    if len([d for d in jax.devices() if d.platform == "gpu"]) < 2:
        pytest.skip("needs 2 GPUs")
    _, large = fit_both("jax", tmp_path, CUDA_VISIBLE_DEVICES="0,1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    ms = large["history"]["step/collective_ms"][-1]
    # 9.4 MiB over 2 GPUs: a bus bandwidth above 10 GB/s (PCIe 4 and later, any NVLink) takes under 1 ms.
    bus = 9.4 * 2**20 / (ms / 1e3)
    print(f"collectives: {ms:.3f} ms per step, bus bandwidth {bus / 1e9:.1f} GB/s")
    assert 0 < ms < 1.0
