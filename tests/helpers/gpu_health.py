"""A fake GPU health source: what a GPUUtilizationLogger publishes in the fit's session, with set figures."""

from __future__ import annotations

from keras_gpu_tools.telemetry.health_fields import SHARED_GPU_HEALTH


class FakeGPUHealth:
    """Implements ``GPUHealthSource``: the same figures for every epoch, per GPU label."""

    def __init__(self, figures: dict[str, dict[str, float]], unsupported: dict[str, dict[str, str]] | None = None):
        self.figures = figures
        self._unsupported = unsupported or {}
        self.calls = 0

    def last_epoch(self) -> dict[str, dict[str, float]]:
        self.calls += 1
        return {label: dict(fields) for label, fields in self.figures.items()}

    def unsupported(self) -> dict[str, dict[str, str]]:
        return {label: dict(fields) for label, fields in self._unsupported.items()}


def healthy(clock: float = 1980.0, **extra: float) -> dict[str, float]:
    """A GPU at full clock, not throttled, busy 90% of the time (figures as the logger's epoch gives them)."""
    return {
        "throttle_power_percent": 0.0,
        "throttle_thermal_percent": 0.0,
        "throttle_hw_slowdown_percent": 0.0,
        "sm_clock_mhz": clock,
        "sm_clock_max_mhz": 1980.0,
        "utilization_percent": 90.0,
        "temperature_celsius": 60.0,
        **extra,
    }


def publisher(source: FakeGPUHealth):
    """A Keras callback that publishes ``source`` in its fit's session, as the logger does (put it first)."""
    import keras

    from keras_gpu_tools.runtime.session import FitSession

    class PublishGPUHealth(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            FitSession.current(self.model).shared[SHARED_GPU_HEALTH] = source

    return PublishGPUHealth()
