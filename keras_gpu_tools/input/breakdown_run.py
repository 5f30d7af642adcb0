"""The detector's step breakdown over one fit: fed the hook's records, closed per epoch, written at the end.

The glue between :class:`~keras_gpu_tools.callbacks.input_bound_detector.InputBoundDetector`
and :mod:`keras_gpu_tools.input.breakdown`: it reads the backend (trace counts,
whether the step compiles, its cache line) and the model (trainable bytes), and
a failure here never reaches training (warned once, the breakdown left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from keras_gpu_tools.input.breakdown import StepBreakdown
from keras_gpu_tools.input.breakdown_advice import FitBreakdown, fit_breakdown

if TYPE_CHECKING:
    from keras_gpu_tools.input.measure import Measurement

TRAIN = ("train_function",)


def trainable_bytes(model) -> float | None:
    """Bytes of the model's trainable weights: what a data-parallel step all-reduces."""
    try:
        import numpy as np

        return float(sum(math.prod(w.shape) * np.dtype(w.dtype).itemsize for w in model.trainable_weights))
    except Exception:
        return None


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
        except Exception as e:
            self._failed(e)
            self.steps = StepBreakdown(False)

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

    def result(self) -> FitBreakdown | None:
        if not self.ok:
            return None
        several = bool(getattr(self.backend, "several_steps_per_call", True))
        return fit_breakdown(self.steps, getattr(self.model, "jit_compile", None), several)
