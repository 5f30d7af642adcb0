"""InputBoundDetector on a real GPU (JAX and torch backends on an H100/H200).

The slow input's delay is on a fake clock (``tests/helpers/timing_input.py``): every batch
taken costs ``DELAY`` and every step ``COMPUTE``, so the verdict is exact; the GPU, its logger
and the FLOP count are real. How the GPU's figures confirm a verdict is checked on fixed figures.
"""

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import categories
from keras_gpu_tools.input.verdict import gpu_evidence
from keras_gpu_tools.telemetry import peaks as gpu_peaks
from tests.helpers import timing_input

pytestmark = pytest.mark.gpu

DELAY = 0.02  # fake seconds per batch taken
COMPUTE = 0.002  # fake seconds per step


def gpu_model(width=2048, depth=3, inputs=1024):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((inputs,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    return model


class Slow(keras.utils.PyDataset):
    """The same batch ``n`` times; slow only through the fake clock."""

    def __init__(self, x, y, n):
        super().__init__()
        self.x, self.y, self.n = x, y, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.x, self.y


def arrays(batch=512, inputs=1024, n=1):
    rng = np.random.default_rng(0)
    return rng.random((batch * n, inputs), dtype="float32"), rng.random((batch * n, 1), dtype="float32")


def test_runs_on_the_gpu(backend):
    from keras_gpu_tools import backends as backends

    assert backends.get(backend).gpu_devices(), "the framework sees no GPU"


def test_slow_input_is_highly_input_bound_and_the_gpu_confirms(backend, monkeypatch):
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger

    timing_input.install(monkeypatch, compute=COMPUTE, fetch=lambda k: DELAY)
    x, y = arrays()
    gpu_log = GPUUtilizationLogger(log_dir=None, interval=0.05, pcie=False)
    det = InputBoundDetector(window=20, sample_every=5, log_dir=None, verbose=0)
    gpu_model().fit(Slow(x, y, 60), epochs=1, verbose=0, callbacks=[gpu_log, det])
    assert det.verdict.category == categories.HIGH, det.summary()
    assert det.measurement.wait_fraction == pytest.approx(DELAY / (DELAY + COMPUTE), rel=1e-9)
    # the step's fake time is spent in the call: JAX and torch on a GPU book it as dispatch, TensorFlow as compute
    assert det.measurement.step == pytest.approx(DELAY + COMPUTE, rel=1e-9)
    assert det._gpu_logger is gpu_log
    # What the GPU says, on fixed figures: a GPU idle while steps wait confirms the verdict.
    assert gpu_evidence(categories.HIGH, {"gpu/0/utilization_percent": 5.0}) == [
        "Confirmed by the GPU: GPU utilization 5% while steps wait for input."
    ]


def test_fast_input_is_not_input_bound(backend, monkeypatch):
    # Few input features, wide layers, large batches: the device is the limit (on the fake clock:
    # slicing arrays costs nothing against the step's compute).
    timing_input.install(monkeypatch, compute=COMPUTE)
    x, y = arrays(batch=2048, inputs=64, n=60)
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=10)
    model = gpu_model(width=4096, inputs=64)
    model.fit(x, y, batch_size=2048, epochs=2, verbose=0, shuffle=False, callbacks=[det])
    m = det.measurement
    assert m.step == pytest.approx(COMPUTE, rel=1e-9) and m.steps_per_sec == pytest.approx(1 / COMPUTE, rel=1e-9)
    assert det.verdict.category == categories.NOT, det.summary()
    assert m.wait_fraction == 0.0


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
    logs = hist.history
    mfu, flops, steps = (
        logs["throughput/mfu"][0],
        logs["throughput/flops_per_sec"][0],
        logs["throughput/steps_per_sec"][0],
    )
    # MFU is the counted FLOPs per step at the measured rate over the table's peak: an identity, whatever the speed.
    assert mfu > 0 and flops / steps > 0 and det._fit.peak, det.summary()
    assert mfu == pytest.approx(flops / det._fit.peak, rel=1e-6)


def test_torch_syncs_only_on_cuda(backend):
    if backend != "torch":
        pytest.skip("torch only")
    import torch

    x, y = arrays(n=20)
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=2)
    gpu_model().fit(x, y, batch_size=512, epochs=1, verbose=0, callbacks=[det])
    assert torch.cuda.is_initialized()
    assert det.measurement.compute > 0
