"""Mixed precision on a real GPU (JAX and torch backends on the GPU machine).

Run there with, for each backend:
    KERAS_BACKEND=jax python -m pytest -q -m gpu tests/layers/test_mixed_precision_gpu.py
The CPU tests of tests/layers/test_mixed_precision_output.py run on the GPU
too when run there (they use the framework's default device). The speedup is
measured by benchmarks/mixed_precision_speedup.py.
"""

import keras
import numpy as np
import pytest

from keras_gpu_tools import backends as backends
from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput
from keras_gpu_tools.mixed_precision.check import check_mixed_precision, gpu_compute_capabilities

pytestmark = pytest.mark.gpu


@pytest.fixture
def gpu_policy():
    if not backends.get(keras.backend.backend()).gpu_devices():
        pytest.skip(f"the {keras.backend.backend()} backend sees no GPU (CPU-only build?)")
    old = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(old)


def _data(features=256, classes=16, n=8192, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(features, classes))
    x = rng.normal(size=(n, features)).astype("float32")
    return x, np.argmax(x @ w, axis=1).astype("int32")


def _train(policy_name, set_policy, x, y, epochs=4):
    set_policy(policy_name)
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((x.shape[1],)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(16),
            MixedPrecisionOutput("softmax"),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, batch_size=256, epochs=epochs, verbose=0, shuffle=False)
    set_policy("float32")
    return model, history.history


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_policy_trains_with_finite_losses_like_float32(gpu_policy, name):
    x, y = _data()
    _, ref = _train("float32", gpu_policy, x, y)
    model, hist = _train(name, gpu_policy, x, y)
    assert model.layers[0].compute_dtype == keras.dtype_policies.get(name).compute_dtype
    assert keras.backend.standardize_dtype(model.outputs[0].dtype) == "float32"
    if name == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.isfinite(hist["loss"]).all()
    assert hist["loss"][-1] < 0.5 * hist["loss"][0]
    # Within 5% of float32 each epoch (float32 on the GPU may itself use TF32).
    np.testing.assert_allclose(hist["loss"], ref["loss"], rtol=0.05)
    assert hist["accuracy"][-1] >= ref["accuracy"][-1] - 0.02
    probs = model.predict(x[:64], verbose=0)
    assert probs.dtype == np.float32 and np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)


def test_underflow_and_overflow_on_gpu(gpu_policy):
    gpu_policy("mixed_float16")
    logits16 = np.array([[0.0, -20.0, -40.0, -80.0]], dtype="float16")
    probs = keras.ops.convert_to_numpy(MixedPrecisionOutput("softmax")(logits16))
    x = logits16.astype("float64")
    ref = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(probs, ref, rtol=1e-5)
    big = np.array([[7e4, 0.0, -7e4]], dtype="float32")
    naive = keras.ops.convert_to_numpy(keras.layers.Activation("softmax")(big))
    assert np.isnan(naive).any()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(MixedPrecisionOutput("softmax")(big)), [[1.0, 0.0, 0.0]])


def test_check_reads_the_gpus_compute_capability(gpu_policy):
    capabilities = gpu_compute_capabilities()
    assert capabilities, "NVML sees no GPU, yet the framework does"
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        assert capabilities[0] == tuple(torch.cuda.get_device_capability(0))
    elif backend == "jax":
        import jax

        cc = getattr(jax.devices()[0], "compute_capability", None)
        if cc:
            assert capabilities[0] == tuple(int(v) for v in str(cc).split("."))
    gpu_policy("mixed_bfloat16")
    model = keras.Sequential(
        [keras.Input((256,)), keras.layers.Dense(512), keras.layers.Dense(16), MixedPrecisionOutput()]
    )
    findings = check_mixed_precision(model)
    if min(capabilities) >= (8, 0):  # Ampere, Hopper: bfloat16 tensor cores
        assert findings == []
    else:
        assert [f.kind for f in findings] == ["no_tensor_cores"]
