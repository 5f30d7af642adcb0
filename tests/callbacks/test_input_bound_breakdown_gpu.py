"""InputBoundDetector's step breakdown on a real GPU: the parts add up to the measured step within 5%."""

import time

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.logdir import schema

pytestmark = pytest.mark.gpu

# The step's matmul FLOPs (6 x MACs x batch) and the fastest any card in the peak table runs them.
FLOPS = 6.0 * 512 * (1024 * 4096 + 2 * 4096 * 4096 + 4096)
PEAK_FLOPS = 1100e12  # B200, TF32 (telemetry/peaks.py)

PARTS = (
    schema.STEP_INPUT_MS,
    schema.STEP_DISPATCH_MS,
    schema.STEP_COMPUTE_MS,
    schema.STEP_COLLECTIVE_MS,
    schema.STEP_OTHER_MS,
)


class CallSpan(keras.callbacks.Callback):
    """Each epoch's time from its first call's start to its last call's end, and its calls, by Keras's batch hooks."""

    def on_epoch_begin(self, epoch, logs=None):
        self.first, self.calls = None, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.first = time.perf_counter() if self.first is None else self.first

    def on_train_batch_end(self, batch, logs=None):
        self.last, self.calls = time.perf_counter(), self.calls + 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs = getattr(self, "epochs", []) + [(self.last - self.first, self.calls)]


@pytest.mark.multibackend
def test_the_parts_add_up_to_the_measured_step_on_a_gpu():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((1024,))]
        + [keras.layers.Dense(4096, activation="relu") for _ in range(3)]
        + [keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    rng = np.random.default_rng(0)
    x, y = rng.random((512 * 200, 1024), dtype="float32"), rng.random((512 * 200, 1), dtype="float32")
    span = CallSpan()
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=50)
    h = model.fit(x, y, batch_size=512, epochs=3, verbose=0, callbacks=[det, span])
    compiles = h.history[schema.STEP_COMPILE_SECONDS]
    if keras.backend.backend() == "torch":  # eager torch compiles nothing: no compile time is claimed
        assert compiles == [0.0, 0.0, 0.0]
    else:
        assert compiles[0] > compiles[2]
    for e in (1, 2):
        logs = {k: v[e] for k, v in h.history.items()}
        parts = sum(logs.get(k, 0.0) for k in PARTS)
        assert parts == pytest.approx(logs[schema.STEP_STEP_MS], rel=0.05)
        seconds, calls = span.epochs[e]
        measured = (seconds - logs[schema.STEP_COMPILE_SECONDS]) / calls * 1e3
        assert logs[schema.STEP_STEP_MS] == pytest.approx(measured, rel=0.05)
        # The device's part is at least what the step's FLOPs need at the GPU's peak (on an H200 about
        # 0.24 ms of a ~2 ms step: Keras's per-step host work is most of this model's step).
        assert FLOPS / PEAK_FLOPS * 1e3 <= logs[schema.STEP_COMPUTE_MS] <= logs[schema.STEP_STEP_MS]
    print(det.summary())
