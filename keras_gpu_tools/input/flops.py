"""MFU's two inputs: the FLOPs of the training step and the peak FLOP/s of the devices that run it.

FLOPs come from the backend, once per fit (``Backend.step_flops``): XLA's
cost analysis of the step on JAX (or the matmul and convolution FLOPs of the
step's jaxpr, where a loop makes them more or JAX offers no analysis); on TensorFlow the dots and
convolutions of the step's XLA HLO when it is jit-compiled, else the matmuls
and convolutions of its traced graph; on torch ``FlopCounterMode`` over one
real training step. Or they come from the user. The peak comes from a table
of NVIDIA GPUs by NVML name and compute dtype (:mod:`keras_gpu_tools.telemetry.peaks`).
Either unknown leaves MFU out, with a warning once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.telemetry import peaks as gpu_peaks

Warn = Callable[[Any, str], None]  # WarnOnce: (key, message)


def trains_on_gpu(backend: Any) -> bool | None:
    """Whether the backend computes on a GPU (None: unknown)."""
    try:
        return bool(backend.gpu_devices())
    except Exception:
        return None


def table_peak(backend: Any, compute_dtype: str, warn: Warn) -> float | None:
    """One of this process's GPUs' peak FLOP/s in the model's compute dtype (None: no GPU, or unknown)."""
    try:
        if not backend.gpu_devices():
            return None
        from keras_gpu_tools.telemetry.devices import visible_gpus
        from keras_gpu_tools.telemetry.nvml import default_nvml

        gpus = visible_gpus(default_nvml())
        if not gpus:
            return None
        dtype = gpu_peaks.matmul_dtype(compute_dtype, backend.uses_tf32())
        peak = gpu_peaks.peak_flops(gpus[0].name, dtype)
        if peak is None:
            warn(
                ("peak", gpus[0].name, dtype),
                f"InputBoundDetector: no peak FLOP/s known for {gpus[0].name} in {dtype}; MFU is left out (pass `peak_flops=` to set it).",
            )
        return peak
    except Exception:
        return None


def step_flops(backend: Any, step_function: Any, specs: Any, warn: Warn) -> tuple[float | None, str | None]:
    """The FLOPs of one training step from the backend, and which count gave them (None, None: unknown)."""
    try:
        flops, source = backend.step_flops(step_function, specs)
    except Exception as e:
        warn(
            "flops",
            f"InputBoundDetector: counting the step's FLOPs failed ({type(e).__name__}: {e}); FLOP/s and MFU are left out.",
        )
        return None, None
    if not flops:
        warn("flops", "InputBoundDetector: the step's FLOP count came out empty; FLOP/s and MFU are left out.")
        return flops, None
    return flops, source
