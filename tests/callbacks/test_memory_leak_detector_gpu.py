"""MemoryLeakDetector on a real GPU: tensors kept on the device read as device growth (JAX and torch backends).

KERAS_BACKEND=jax python -m pytest -m gpu -s tests/callbacks/test_memory_leak_detector_gpu.py
KERAS_BACKEND=torch python -m pytest -m gpu -s tests/callbacks/test_memory_leak_detector_gpu.py
"""

import keras
import pytest

from keras_gpu_tools import MemoryLeakDetector
from keras_gpu_tools.leaks import advice
from keras_gpu_tools.logdir import schema
from tests.helpers.callbacks import KeepTensors
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _on_a_gpu_backend():
    if keras.backend.backend() not in ("jax", "torch"):
        pytest.skip("device arrays are kept with JAX or torch here")
    if not MemoryLeakDetector().backend.gpu_devices():
        pytest.skip(f"{keras.backend.backend()} sees no GPU")
    MemoryLeakDetector.forget_fits()


def _fit(kept_mib, epochs=10):
    det = MemoryLeakDetector(log_dir=None, verbose=2)
    model = tiny_dense_model(features=16, hidden=32)
    x, y = regression_data(256, features=16)
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=[KeepTensors(kept_mib), det])
    return det, model.history.history


def test_tensors_kept_on_the_device_read_as_device_growth():
    det, hist = _fit(64.0)
    growth = hist[schema.MEMORY_DEVICE_GROWTH]
    print(det.summary())
    assert growth[-1] == pytest.approx(64.0, abs=6.0), growth
    assert hist[schema.MEMORY_DEVICE_IN_USE_MIB][-1] - hist[schema.MEMORY_DEVICE_IN_USE_MIB][1] >= 7 * 60
    v = det.verdict
    assert v.category == "grows" and "device per epoch" in v.grows
    assert advice.TENSORS_KEPT in v.causes
    assert any("device 0" in x for x in v.exhaustion), v.exhaustion  # the device's capacity is known


def test_a_clean_run_on_the_device_is_stable():
    det, hist = _fit(0.0)
    assert abs(hist[schema.MEMORY_DEVICE_GROWTH][-1]) < 2.0
    assert det.verdict.category == "stable", det.summary()
