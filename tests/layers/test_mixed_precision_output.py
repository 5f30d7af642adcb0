"""MixedPrecisionOutput on CPU, on every backend (float16 and bfloat16 policies)."""

import keras
import numpy as np
import pytest

from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput

MIXED = ["mixed_float16", "mixed_bfloat16"]


@pytest.fixture
def policy():
    """Sets the global dtype policy for one test, skipping where the backend cannot run it."""
    old = keras.config.dtype_policy()

    def set_policy(name):
        dtype = keras.dtype_policies.get(name).compute_dtype
        try:  # the ops these tests use, forward and through a model
            a = keras.ops.ones((4, 8), dtype=dtype)
            keras.ops.convert_to_numpy(keras.ops.softmax(keras.ops.matmul(a, keras.ops.transpose(a))))
        except Exception as e:  # e.g. an older torch without float16 matmul on CPU
            pytest.skip(f"the {keras.backend.backend()} backend cannot compute in {dtype} on this device: {e}")
        keras.config.set_dtype_policy(name)

    yield set_policy
    keras.config.set_dtype_policy(old)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _softmax64(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax64(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


# Logits a float16 layer can produce whose float16 softmax loses classes:
# exp(-20) = 2e-9 and below are under float16's smallest value (6e-8).
UNDERFLOW_LOGITS = np.array([[0.0, -20.0, -40.0, -60.0, -80.0], [3.0, 2.0, -25.0, 1.0, -18.0]], dtype="float16")
# float32 logits (a float32 layer, a temperature) that overflow float16 (65504).
OVERFLOW_LOGITS = np.array([[7e4, 0.0, -7e4], [1e5, 1e5 - 10.0, 0.0]], dtype="float32")


@pytest.mark.multibackend
@pytest.mark.parametrize("name", MIXED)
def test_model_output_is_float32_under_mixed_policy(policy, name):
    policy(name)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(8),
            MixedPrecisionOutput("softmax"),
        ]
    )
    compute = keras.dtype_policies.get(name).compute_dtype
    assert model.layers[1].compute_dtype == compute  # the rest of the model is mixed
    assert model.layers[-1].dtype_policy.name == "float32"
    assert keras.backend.standardize_dtype(model.outputs[0].dtype) == "float32"
    out = model.predict(np.random.default_rng(0).normal(size=(4, 16)).astype("float32"), verbose=0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)


@pytest.mark.multibackend
@pytest.mark.parametrize("name", MIXED)
def test_called_on_16_bit_tensors_and_inside_a_mixed_layer(policy, name):
    policy(name)
    dtype = keras.dtype_policies.get(name).compute_dtype
    layer = MixedPrecisionOutput("sigmoid")
    x = keras.ops.cast(keras.ops.convert_to_tensor(np.array([[-2.0, 0.0, 3.0]], dtype="float32")), dtype)
    assert keras.backend.standardize_dtype(layer(x).dtype) == "float32"

    class Head(keras.layers.Layer):  # a mixed layer calling it: an autocast scope is open
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)
            self.out = MixedPrecisionOutput("log_softmax")

        def call(self, x):
            return self.out(self.dense(x))

    head = Head()
    y = head(np.ones((2, 4), dtype="float32"))
    assert head.dense.compute_dtype == dtype
    assert keras.backend.standardize_dtype(y.dtype) == "float32"


@pytest.mark.multibackend
def test_softmax_keeps_probabilities_float16_loses(policy):
    policy("mixed_float16")
    naive = _np(keras.layers.Activation("softmax")(UNDERFLOW_LOGITS))
    assert (naive == 0).any()  # what the layer is for: float16 flushed them

    probs = _np(MixedPrecisionOutput("softmax")(UNDERFLOW_LOGITS))
    assert probs.dtype == np.float32
    ref = _softmax64(UNDERFLOW_LOGITS.astype("float64"))
    assert (probs > 0).all()
    np.testing.assert_allclose(probs, ref, rtol=2e-6, atol=0)

    logp = _np(MixedPrecisionOutput("log_softmax")(UNDERFLOW_LOGITS))
    np.testing.assert_allclose(logp, _log_softmax64(UNDERFLOW_LOGITS), rtol=1e-6, atol=1e-6)

    # Crossentropy of the rarest class, -log p: inf from float16, right from float32.
    target = np.array([4, 2])
    with np.errstate(divide="ignore"):
        naive_ce = -np.log(naive[np.arange(2), target].astype("float32"))
    ce = -np.log(probs[np.arange(2), target])
    assert np.isinf(naive_ce).all()
    np.testing.assert_allclose(ce, -_log_softmax64(UNDERFLOW_LOGITS)[np.arange(2), target], rtol=1e-6)


@pytest.mark.multibackend
def test_softmax_of_logits_beyond_float16_range(policy):
    policy("mixed_float16")
    target = np.array([0, 1])
    loss = keras.losses.SparseCategoricalCrossentropy()

    naive = keras.layers.Activation("softmax")(OVERFLOW_LOGITS)  # autocast to float16: inf - inf
    assert np.isnan(_np(naive)).any()
    assert not np.isfinite(float(_np(loss(target, naive))))

    probs = MixedPrecisionOutput("softmax")(OVERFLOW_LOGITS)
    np.testing.assert_allclose(_np(probs), _softmax64(OVERFLOW_LOGITS), rtol=2e-6, atol=1e-30)
    ref_ce = -_log_softmax64(OVERFLOW_LOGITS)[np.arange(2), target].mean()
    value = float(_np(loss(target, probs)))
    assert np.isfinite(value)
    np.testing.assert_allclose(value, ref_ce, rtol=1e-5, atol=1e-6)

    # Linear output for from_logits=True losses: exact float32 logits.
    logits = MixedPrecisionOutput()(OVERFLOW_LOGITS)
    np.testing.assert_array_equal(_np(logits), OVERFLOW_LOGITS)
    value = float(_np(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(target, logits)))
    np.testing.assert_allclose(value, ref_ce, rtol=1e-5, atol=1e-6)


@pytest.mark.multibackend
def test_softmax_over_a_vocabulary_larger_than_float16_max(policy):
    # 100,000 classes with similar logits: the sum of exp exceeds 65504.
    policy("mixed_float16")
    logits = np.random.default_rng(0).normal(scale=0.1, size=(2, 100_000)).astype("float16")
    probs = _np(MixedPrecisionOutput("softmax")(logits))
    np.testing.assert_allclose(probs, _softmax64(logits), rtol=1e-5)
    logp = _np(MixedPrecisionOutput("log_softmax")(logits))
    np.testing.assert_allclose(logp, _log_softmax64(logits), rtol=1e-6)


@pytest.mark.multibackend
def test_sigmoid_in_float32(policy):
    policy("mixed_float16")
    x = np.array([[-20.0, -5.0, 0.0, 9.0]], dtype="float16")
    naive = _np(keras.layers.Activation("sigmoid")(x))
    assert naive[0, 0] == 0 and naive[0, 3] == 1  # float16: 2e-9 -> 0, 0.99988 -> 1
    out = _np(MixedPrecisionOutput("sigmoid")(x))
    ref = 1 / (1 + np.exp(-x.astype("float64")))
    np.testing.assert_allclose(out, ref, rtol=2e-6)
    assert np.isfinite(-np.log(out)).all() and np.isfinite(-np.log1p(-out.astype("float64"))).all()


@pytest.mark.multibackend
@pytest.mark.parametrize("axis", [1, (1, 2)])
def test_softmax_axis(axis):
    x = np.random.default_rng(1).normal(scale=30, size=(2, 3, 4)).astype("float32")
    for name, ref in [("softmax", _softmax64), ("log_softmax", _log_softmax64)]:
        out = _np(MixedPrecisionOutput(name, axis=axis)(x))
        np.testing.assert_allclose(out, ref(x, axis=axis), rtol=1e-5, atol=1e-6)


@pytest.mark.multibackend
def test_callable_activation():
    layer = MixedPrecisionOutput(keras.activations.softplus)
    x = np.array([[-3.0, 0.0, 2.0]], dtype="float16")
    np.testing.assert_allclose(_np(layer(x)), np.log1p(np.exp(x.astype("float64"))), rtol=1e-6)


@pytest.mark.multibackend
def test_passes_masks_through(policy):
    policy("mixed_float16")
    inputs = keras.Input((3, 2))
    x = keras.layers.Masking(mask_value=0.0)(inputs)
    x = MixedPrecisionOutput()(x)
    outputs = keras.layers.GlobalAveragePooling1D()(x)  # averages the unmasked steps only
    model = keras.Model(inputs, outputs)
    data = np.array([[[1.0, 3.0], [0.0, 0.0], [3.0, 5.0]]], dtype="float32")
    np.testing.assert_allclose(model.predict(data, verbose=0), [[2.0, 4.0]], rtol=1e-6)


@pytest.mark.multibackend
@pytest.mark.parametrize(
    "save_policy, load_policy", [("mixed_float16", "mixed_bfloat16"), ("mixed_bfloat16", "float16")]
)
def test_keras_file_loads_with_float32_output_under_another_policy(policy, tmp_path, save_policy, load_policy):
    policy(save_policy)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), MixedPrecisionOutput("softmax", name="probs")])
    x = np.random.default_rng(2).normal(size=(3, 6)).astype("float32")
    before = model.predict(x, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)

    policy(load_policy)
    loaded = keras.saving.load_model(path)  # no custom_objects: the layer is registered
    layer = loaded.get_layer("probs")
    assert isinstance(layer, MixedPrecisionOutput)
    assert layer.dtype_policy.name == "float32"
    assert keras.backend.standardize_dtype(loaded.outputs[0].dtype) == "float32"
    after = loaded.predict(x, verbose=0)
    assert after.dtype == np.float32
    np.testing.assert_allclose(after, before, rtol=1e-6)


def test_config_round_trip():
    layer = MixedPrecisionOutput("log_softmax", axis=(1, 2), name="out")
    config = layer.get_config()
    assert config["activation"] == "log_softmax" and config["axis"] == [1, 2]
    clone = MixedPrecisionOutput.from_config(config)
    assert clone.activation is keras.activations.log_softmax
    assert clone.axis == (1, 2) and clone.name == "out" and clone.dtype_policy.name == "float32"
    assert keras.saving.get_registered_name(MixedPrecisionOutput) == "keras_gpu_tools>MixedPrecisionOutput"


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"activation": 3}, TypeError, ["`activation`", "activation=3"]),
        ({"activation": "sofmax"}, ValueError, ["`activation`", "'sofmax'"]),
        ({"activation": "softmax", "axis": "last"}, TypeError, ["`axis`", "'last'"]),
        ({"activation": "softmax", "axis": (1, 1)}, TypeError, ["`axis`", "(1, 1)"]),
        ({"activation": "sigmoid", "axis": 1}, ValueError, ["`axis`", "axis=1", "softmax"]),
        ({"dtype": "mixed_float16"}, ValueError, ["`dtype`", "'mixed_float16'", "float32"]),
        ({"dtype": "bfloat16"}, ValueError, ["`dtype`", "'bfloat16'"]),
    ],
)
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        MixedPrecisionOutput(**kwargs)
    for w in words:
        assert w in str(info.value)


def test_dtype_float32_is_accepted():
    assert MixedPrecisionOutput(dtype="float32").compute_dtype == "float32"


@pytest.mark.slow
@pytest.mark.multibackend
def test_mixed_float16_training_converges_like_float32(policy):
    """Same data, seed and model: per-epoch losses within 2% of float32's."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(32, 4))
    x = rng.normal(size=(2048, 32)).astype("float32")
    y = np.argmax(x @ w, axis=1)
    xv = rng.normal(size=(512, 32)).astype("float32")
    yv = np.argmax(xv @ w, axis=1)
    runs = {}
    for name in ["float32", "mixed_float16"]:
        policy(name)
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(4),
                MixedPrecisionOutput("softmax"),
            ]
        )
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
        if name == "mixed_float16":
            assert model.layers[0].compute_dtype == "float16"
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        history = model.fit(x, y, batch_size=64, epochs=5, shuffle=False, verbose=0)
        runs[name] = (np.array(history.history["loss"]), model.evaluate(xv, yv, verbose=0)[1])
    loss32, acc32 = runs["float32"]
    loss16, acc16 = runs["mixed_float16"]
    assert np.isfinite(loss16).all()
    assert loss16[-1] < 0.5 * loss16[0]  # it learned
    np.testing.assert_allclose(loss16, loss32, rtol=0.02)
    assert abs(acc16 - acc32) <= 0.02 and acc16 > 0.8
