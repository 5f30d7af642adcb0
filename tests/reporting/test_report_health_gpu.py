"""The GPU health section of a real fit's report, on a real GPU (the logger's health fields from NVML).

KERAS_BACKEND=jax python -m pytest -m gpu -s tests/reporting/test_report_health_gpu.py
"""

import keras
import pytest

from keras_gpu_tools import GPUUtilizationLogger, report
from keras_gpu_tools.reporting import text
from keras_gpu_tools.reporting.sections import gpu_health as health
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS

pytestmark = pytest.mark.gpu


def test_every_health_field_is_reported_or_named_unsupported_and_the_section_reads_it(tmp_path):
    import numpy as np

    model = keras.Sequential(
        [keras.Input((64,))] + [keras.layers.Dense(4096) for _ in range(4)] + [keras.layers.Dense(8)]
    )
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).random((8192, 64), dtype="float32")
    y = np.zeros((8192, 8), dtype="float32")
    lg = GPUUtilizationLogger(log_dir=str(tmp_path), interval=0.1)
    model.fit(x, y, batch_size=256, epochs=3, verbose=0, callbacks=[lg])
    data = report(str(tmp_path)).data
    assert health.has_health(data)
    label = data.gpu_indices()[0]
    for field in HEALTH_FIELDS:  # never a silent absence: a figure per epoch, or the reason it has none
        per_epoch = data.gpu_epochs.get(f"gpu/{label}/{field}")
        assert (per_epoch is not None and len(per_epoch) == 3) or field in data.gpu_unsupported.get(label, {}), field
    lines = dict(text.sections(data))[health.HEADING]
    print("\n".join(lines))
    assert lines[0].startswith(health.NOTHING) or lines[0] == f"GPU {label}:"
    if "energy_joules" not in data.gpu_unsupported.get(label, {}):
        assert any(line.startswith(f"- GPU {label}: ") and "per epoch" in line for line in lines)
    # The callbacks' view and the log directory's agree.
    assert dict(text.sections(report(lg).data)).get(health.HEADING) == lines
