"""MixedPrecisionCheck: warns at the start of fit(), once per finding."""

import logging
import warnings

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
from keras_gpu_tools.errors import MixedPrecisionWarning
from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput

X = np.random.default_rng(0).normal(size=(32, 16)).astype("float32")
Y = np.zeros(32, dtype="int32")


@pytest.fixture
def policy():
    old = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(old)


def _model(output_layer):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"), *output_layer])
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _fit(model, callback, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, Y, batch_size=16, epochs=1, verbose=0, callbacks=[callback], **kwargs)
    return [w for w in caught if issubclass(w.category, MixedPrecisionWarning)]


@pytest.mark.multibackend
def test_warns_when_training_starts_then_not_again(policy):
    policy("mixed_float16")
    model = _model([keras.layers.Dense(8, activation="softmax", name="head")])
    check = MixedPrecisionCheck(compute_capabilities=[(9, 0)])
    first = _fit(model, check)
    assert len(first) == 1
    assert "MixedPrecisionCheck: Output `head` of the model is float16" in str(first[0].message)
    assert [f.kind for f in check.findings] == ["output_dtype"]
    assert _fit(model, check) == []  # second fit(): the same finding is not repeated
    assert [f.kind for f in check.findings] == ["output_dtype"]


@pytest.mark.multibackend
def test_no_warning_for_the_recipe_or_float32(policy):
    policy("mixed_float16")
    model = _model([keras.layers.Dense(8), MixedPrecisionOutput("softmax")])
    check = MixedPrecisionCheck(compute_capabilities=[(9, 0)])
    assert _fit(model, check) == [] and check.findings == []
    policy("float32")
    assert _fit(_model([keras.layers.Dense(8, activation="softmax")]), MixedPrecisionCheck()) == []


def test_defaults_two_fits_and_no_gpu(policy):
    # Constructible with defaults; without NVML here, GPU findings are skipped, not fatal.
    policy("mixed_bfloat16")
    model = _model([keras.layers.Dense(8), MixedPrecisionOutput("softmax")])
    check = MixedPrecisionCheck()
    assert _fit(model, check) == []
    assert _fit(model, check) == []


def test_ignore_and_new_findings_after_recompile(policy):
    policy("mixed_float16")
    model = _model([keras.layers.Dense(8, activation="softmax")])
    check = MixedPrecisionCheck(ignore=["output_dtype"], compute_capabilities=[(9, 0)])
    assert _fit(model, check) == []
    model.compile("adam", "sparse_categorical_crossentropy", auto_scale_loss=False)
    caught = _fit(model, check)
    assert len(caught) == 1 and "does not scale the loss" in str(caught[0].message)


def test_a_failing_check_does_not_stop_training(policy, monkeypatch, caplog):
    import keras_gpu_tools.callbacks.mixed_precision_check as module

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(module, "check_mixed_precision", broken)
    policy("mixed_float16")
    model = _model([keras.layers.Dense(8, activation="softmax")])
    check = MixedPrecisionCheck()
    with caplog.at_level(logging.WARNING, logger="keras_gpu_tools"):
        _fit(model, check)
    assert "the check failed (RuntimeError: boom)" in caplog.text
    assert check.findings == []


def test_fit_that_raised_then_fit_again(policy):
    policy("mixed_float16")
    model = _model([keras.layers.Dense(8, activation="softmax")])
    check = MixedPrecisionCheck(compute_capabilities=[(9, 0)])

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt):
            model.fit(X, Y, epochs=1, verbose=0, callbacks=[check, Boom()])
    assert sum(issubclass(w.category, MixedPrecisionWarning) for w in caught) == 1
    history = model.fit(X, Y, epochs=1, verbose=0, callbacks=[check])
    assert len(history.history["loss"]) == 1


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"ignore": "output_dtype"}, TypeError, ["`ignore`"]),
        ({"ignore": ["nope"]}, ValueError, ["`ignore`", "'nope'"]),
        ({"compute_capabilities": [(8,)]}, ValueError, ["`compute_capabilities`", "(8,)"]),
    ],
)
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        MixedPrecisionCheck(**kwargs)
    for w in words:
        assert w in str(info.value)
