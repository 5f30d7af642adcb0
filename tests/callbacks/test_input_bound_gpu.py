"""InputBoundDetector on a real GPU (JAX and torch backends on an H100/H200)."""

import time

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import categories
from keras_gpu_tools.telemetry import peaks as gpu_peaks

pytestmark = pytest.mark.gpu


def gpu_model(width=2048, depth=3, inputs=1024):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((inputs,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    return model


class Slow(keras.utils.PyDataset):
    def __init__(self, x, y, delay, n):
        super().__init__()
        self.x, self.y, self.delay, self.n = x, y, delay, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x, self.y


def arrays(batch=512, inputs=1024, n=1):
    rng = np.random.default_rng(0)
    return rng.random((batch * n, inputs), dtype="float32"), rng.random((batch * n, 1), dtype="float32")


def test_runs_on_the_gpu(backend):
    from keras_gpu_tools import backends as backends

    assert backends.get(backend).gpu_devices(), "the framework sees no GPU"


def test_slow_input_is_highly_input_bound_and_the_gpu_confirms(backend):
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger

    x, y = arrays()
    gpu_log = GPUUtilizationLogger(log_dir=None, interval=0.05, pcie=False)
    det = InputBoundDetector(window=20, sample_every=5, log_dir=None, verbose=0)
    gpu_model().fit(Slow(x, y, 0.02, 60), epochs=1, verbose=0, callbacks=[gpu_log, det])
    assert det.verdict.category == categories.HIGH, det.summary()
    assert det.measurement.wait_fraction > 0.7
    assert det.measurement.compute < 0.01
    assert det._gpu_logger is gpu_log
    assert any("Confirmed by the GPU" in e for e in det.verdict.evidence), det.summary()


def test_fast_input_is_not_input_bound(backend):
    # Few input features, wide layers, large batches: the device is the limit.
    x, y = arrays(batch=2048, inputs=64, n=60)
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=10)
    model = gpu_model(width=4096, inputs=64)
    model.fit(x, y, batch_size=2048, epochs=2, verbose=0, shuffle=False, callbacks=[det])
    m = det.measurement
    assert m.compute > 0 and m.steps_per_sec > 0
    assert det.verdict.category in (categories.NOT, categories.MODERATE), det.summary()
    assert m.wait_fraction < 0.2


def test_mfu_from_the_peak_table_on_jax(backend):
    if backend != "jax":
        pytest.skip("FLOPs come from XLA cost analysis on JAX")
    from keras_gpu_tools.telemetry.devices import visible_gpus
    from keras_gpu_tools.telemetry.nvml import default_nvml

    name = visible_gpus(default_nvml())[0].name
    assert gpu_peaks.lookup(name) is not None, f"{name} missing from the peak table"
    x, y = arrays(n=100)
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=10)
    hist = gpu_model(width=4096).fit(x, y, batch_size=512, epochs=1, verbose=0, shuffle=False, callbacks=[det])
    mfu = hist.history["throughput/mfu"][0]
    assert 0.005 < mfu < 1.0, det.summary()
    assert hist.history["throughput/flops_per_sec"][0] > 1e12


def test_torch_syncs_only_on_cuda(backend):
    if backend != "torch":
        pytest.skip("torch only")
    import torch

    x, y = arrays(n=20)
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=2)
    gpu_model().fit(x, y, batch_size=512, epochs=1, verbose=0, callbacks=[det])
    assert torch.cuda.is_initialized()
    assert det.measurement.compute > 0
