"""MFU on a real GPU, on every backend: the detector's figure against the hand count over the table's peak."""

import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.telemetry import peaks as gpu_peaks
from tests.helpers.models import mlp_model, mlp_step_flops

pytestmark = pytest.mark.gpu

INPUTS, WIDTHS, BATCH = 1024, (4096, 4096, 4096), 512


def test_mfu_is_the_hand_count_over_the_table_peak(backend):
    from keras_gpu_tools import backends
    from keras_gpu_tools.telemetry.devices import visible_gpus
    from keras_gpu_tools.telemetry.nvml import default_nvml

    name = visible_gpus(default_nvml())[0].name
    dtype = gpu_peaks.matmul_dtype("float32", backends.get(backend).uses_tf32())
    peak = gpu_peaks.peak_flops(name, dtype)
    assert peak is not None, f"{name} ({dtype}) missing from the peak table"
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * 100, INPUTS), dtype="float32")
    y = rng.random((BATCH * 100, 1), dtype="float32")
    det = InputBoundDetector(log_dir=None, verbose=0, sample_every=10)
    model = mlp_model(INPUTS, WIDTHS)
    hist = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[det])
    steps_per_sec = hist.history["throughput/steps_per_sec"][-1]
    hand = mlp_step_flops(BATCH, INPUTS, WIDTHS) * steps_per_sec / peak
    mfu = hist.history["throughput/mfu"][-1]
    print(
        f"{backend} on {name}: MFU {mfu:.3f} (hand count {hand:.3f}, {dtype} peak {peak / 1e12:.1f} TFLOP/s, "
        f"FLOPs from {det.flops_source})"
    )
    assert mfu == pytest.approx(hand, rel=0.10), det.summary()
    assert 0.0 < mfu < 1.0
