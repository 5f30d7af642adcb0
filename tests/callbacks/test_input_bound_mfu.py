"""MFU on every backend: the detector's FLOPs per step against the hand count, with a real fit().

The hand count of an MLP's training step is 6 x MACs x batch (forward 2x,
backward 4x). The backends' counts leave out the input gradient of the first
layer (nothing needs it), about 2% of this MLP's, and count the matmuls only
(TensorFlow, torch) or the elementwise work too (XLA's cost analysis on JAX).
"""

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from tests.helpers.models import mlp_model, mlp_step_flops

BATCH = 128
PEAK = 1e12  # given: no GPU, so no table peak


def _data(n=512):
    rng = np.random.default_rng(0)
    return rng.random((n, 16), dtype="float32"), rng.random((n, 1), dtype="float32")


def _fit(model, callbacks, epochs=2):
    x, y = _data()
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)


@pytest.mark.multibackend
@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager-or-graph", "jit"])
def test_flops_per_step_match_the_hand_count(backend, jit_compile):
    if backend == "jax" and not jit_compile:
        pytest.skip("JAX's FLOPs come from the jitted step")
    if backend == "torch" and jit_compile:
        pytest.skip("torch.compile: the same counter over the same step; compiling is slow on the CPU")
    det = InputBoundDetector(sample_every=2, log_dir=None, verbose=0, peak_flops=PEAK)
    hist = _fit(mlp_model(jit_compile=jit_compile), [det])
    flops_per_sec = hist.history["throughput/flops_per_sec"][-1]
    per_step = flops_per_sec / hist.history["throughput/steps_per_sec"][-1]
    assert per_step == pytest.approx(mlp_step_flops(BATCH), rel=0.10), det.flops_source
    assert hist.history["throughput/mfu"][-1] == pytest.approx(flops_per_sec / PEAK)
    expected = {"tensorflow": "XLA HLO" if jit_compile else "TensorFlow graph", "torch": "FlopCounterMode"}
    assert expected.get(backend, "XLA cost analysis") in det.flops_source


def _stateful_model():
    keras.utils.set_random_seed(0)
    layers = [keras.Input((16,)), keras.layers.Dense(64, activation="relu"), keras.layers.BatchNormalization()]
    model = keras.Sequential(layers + [keras.layers.Dropout(0.3), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


@pytest.mark.multibackend
def test_counting_the_flops_changes_nothing_trained(backend):
    # The same seeded model trained with and without the count: the same weights, BatchNormalization statistics,
    # dropout generator state and optimizer state, the same number of updates.
    det = InputBoundDetector(sample_every=2, log_dir=None, verbose=0, peak_flops=PEAK)
    counted = _stateful_model()
    _fit(counted, [det])
    plain = _stateful_model()
    _fit(plain, [])
    assert det.flops_source is not None
    assert int(counted.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy()) == 8
    for a, b in zip(counted.variables + counted.optimizer.variables, plain.variables + plain.optimizer.variables):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-6, atol=1e-7)


@pytest.mark.multibackend
def test_a_second_fit_of_the_model_has_the_same_flops(backend):
    # TensorFlow and torch keep each batch shape's count for the compiled step: the second fit reuses it.
    model, per_step = mlp_model(), []
    for _ in range(2):
        det = InputBoundDetector(sample_every=2, log_dir=None, verbose=0, peak_flops=PEAK)
        hist = _fit(model, [det])
        per_step.append(hist.history["throughput/flops_per_sec"][-1] / hist.history["throughput/steps_per_sec"][-1])
        assert det.flops_source is not None
    assert per_step[1] == pytest.approx(per_step[0], rel=1e-6)


@pytest.mark.multibackend
def test_a_recurrent_layer_counts_every_timestep(backend):
    # XLA's HLO and cost analysis count a loop's body once; the graph (TensorFlow) and the jaxpr (JAX)
    # know the trip count, and torch's Keras LSTM loops in Python.
    keras.utils.set_random_seed(0)
    steps, features, units, batch = 32, 64, 32, 32
    model = keras.Sequential([keras.Input((steps, features)), keras.layers.LSTM(units), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.zeros((8 * batch, steps, features), "float32"), np.zeros((8 * batch, 1), "float32")
    det = InputBoundDetector(sample_every=2, log_dir=None, verbose=0, peak_flops=PEAK)
    hist = model.fit(x, y, batch_size=batch, epochs=2, verbose=0, callbacks=[det])
    per_step = hist.history["throughput/flops_per_sec"][-1] / hist.history["throughput/steps_per_sec"][-1]
    macs = steps * 4 * units * (features + units)  # per sample, every timestep
    recurrent = steps * 4 * units * units
    # forward 2x, the kernels' gradients 2x, the hidden state's gradient 2x (none for the input: it is data)
    hand = batch * (4 * macs + 2 * recurrent)
    assert per_step == pytest.approx(hand, rel=0.05), det.flops_source


def test_a_convolution_step_on_tensorflow_counts_forward_and_both_gradients():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's graph and HLO counts")
    keras.utils.set_random_seed(0)
    for jit in (False, True):
        model = keras.Sequential(
            [keras.Input((16, 16, 8)), keras.layers.Conv2D(32, 3), keras.layers.Flatten(), keras.layers.Dense(1)]
        )
        model.compile("sgd", "mse", jit_compile=jit)
        x, y = np.zeros((64, 16, 16, 8), "float32"), np.zeros((64, 1), "float32")
        det = InputBoundDetector(sample_every=2, log_dir=None, verbose=0, peak_flops=PEAK)
        hist = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[det])
        per_step = hist.history["throughput/flops_per_sec"][-1] / hist.history["throughput/steps_per_sec"][-1]
        conv = 14 * 14 * 32 * 3 * 3 * 8  # MACs per sample
        dense = 14 * 14 * 32
        # The conv's input gradient is not needed (the input is no variable); HLO counts the padded positions.
        low, high = 16 * (4 * conv + 6 * dense), 16 * (6 * conv + 6 * dense) * 1.1
        assert low * 0.99 <= per_step <= high, (jit, per_step, det.flops_source)
