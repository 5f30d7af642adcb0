import pytest

from keras_gpu_tools.telemetry import sampler


@pytest.fixture(autouse=True)
def every_field_every_tick(monkeypatch):
    """These tests read the fields of each sample they take back to back: no field waits for its period."""
    monkeypatch.setattr(sampler, "SLOW_PERIOD", 0.0)
    monkeypatch.setattr(sampler, "GPM_PERIOD", 0.0)
