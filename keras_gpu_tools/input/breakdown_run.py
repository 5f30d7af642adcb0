"""The detector's step breakdown over one fit: fed the hook's records, closed per epoch, written at the end.

The glue between :class:`~keras_gpu_tools.callbacks.input_bound_detector.InputBoundDetector`
and :mod:`keras_gpu_tools.input.breakdown`: it reads the backend (trace counts,
whether the step compiles, its cache line) and the model (trainable bytes), and
a failure here never reaches training (warned once, the breakdown left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from keras_gpu_tools.input.breakdown import StepBreakdown
from keras_gpu_tools.input.breakdown_advice import FitBreakdown, fit_breakdown
from keras_gpu_tools.runtime.units import format_bytes

if TYPE_CHECKING:
    from keras_gpu_tools.input.measure import Measurement

TRAIN = ("train_function",)
PROBE_BYTES = 32 * 2**20  # the all-reduce timed at fit start moves at most this; larger weights scale linearly


def trainable_bytes(model) -> float | None:
    """Bytes of the model's trainable weights: what a data-parallel step all-reduces."""
    try:
        import numpy as np

        return float(sum(math.prod(w.shape) * np.dtype(w.dtype).itemsize for w in model.trainable_weights))
    except Exception:
        return None


def tensor_cores(backend) -> bool | None:
    """Whether a GPU the framework trains on has tensor cores (compute capability 7.0 or later).

    False where the framework sees no GPU (the step runs on the CPU) or no visible GPU has them;
    None where it sees a GPU whose compute capability NVML does not give.
    """
    try:
        if not backend.gpu_devices():
            return False
        from keras_gpu_tools.telemetry.devices import visible_gpus
        from keras_gpu_tools.telemetry.nvml import default_nvml

        caps = [tuple(g.compute_capability) for g in visible_gpus(default_nvml()) if g.compute_capability]
    except Exception:  # no NVML, a broken driver: not known
        return None
    return any(c >= (7, 0) for c in caps) if caps else None


class BreakdownRun:
    """One fit's step breakdown, for the detector; ``warn(key, message)`` is its warn-once."""

    def __init__(self, backend, model, devices: int, warn):
        self.backend, self.model, self.warn = backend, model, warn
        self.ok = True
        self._counter: Callable[[], dict[int, int] | None] | None = None
        try:
            compiles = bool(backend.compiles_step(model))
            nbytes = trainable_bytes(model) if devices > 1 else None
            self.steps = StepBreakdown(compiles, devices, nbytes, None, self._traces() if compiles else None)
            self.steps.compile_line = backend.compile_cache_line
            self.steps.tensor_cores = tensor_cores(backend)
            if nbytes:
                self.steps.bandwidth, self.steps.collective_how = self._bus_bandwidth(devices, nbytes)
        except Exception as e:
            self._failed(e)
            self.steps = StepBreakdown(False)

    def _bus_bandwidth(self, devices: int, nbytes: float) -> tuple[float | None, str | None]:
        """The bus bandwidth (bytes/s) of one all-reduce over the step's devices, timed by the backend once."""
        size = int(min(nbytes, PROBE_BYTES))
        try:
            seconds, how = self.backend.time_allreduce(self.model, size)
        except Exception as e:  # (a device too full for the probe's buffer, a backend that moved)
            self.warn(
                "collective", f"InputBoundDetector: timing an all-reduce failed ({e!r}); collectives are left out."
            )
            return None, f"timing an all-reduce failed ({type(e).__name__})"
        if not seconds:
            return None, how
        if nbytes > size:
            how += f", scaled to the weights' {format_bytes(nbytes)}"
        return 2.0 * (devices - 1) / devices * size / seconds, how

    def _failed(self, e: Exception) -> None:
        self.ok = False
        self.warn("breakdown", f"InputBoundDetector: the step breakdown is off for this fit(): {e!r}")

    def _traces(self) -> dict[int, int] | None:
        """The framework's trace counts of the train step; its functions found once (again while none is)."""
        counts = self._counter() if self._counter is not None else None
        if counts is None:
            self._counter = self.backend.trace_counter(self.model, TRAIN)
            counts = self._counter()
        return counts

    def add(self, rec) -> None:
        if self.ok:
            self.steps.add(rec)

    def end_epoch(self, m: Measurement, logs: dict[str, float]) -> dict[str, float]:
        """Closes the epoch: its keys into ``logs``, and returned (for TensorBoard)."""
        if not self.ok:
            return {}
        try:
            out = self.steps.end_epoch(m, self._traces() if self.steps.compiles else None).logs()
        except Exception as ex:
            self._failed(ex)
            return {}
        logs.update(out)
        return out

    def result(self, steady: Sequence[bool] | None = None) -> FitBreakdown | None:
        """The fit's breakdown; ``steady``: per epoch, whether the input verdict counts it (its scope)."""
        if not self.ok:
            return None
        several = bool(getattr(self.backend, "several_steps_per_call", True))
        return fit_breakdown(self.steps, getattr(self.model, "jit_compile", None), several, steady)
