"""The package's Keras callbacks, one module each, imported on first use.

Each callback module imports Keras, and Keras its backend; resolving the names
through a module ``__getattr__`` (PEP 562) keeps ``import keras_gpu_tools.callbacks``
free of both until a callback is actually used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keras_gpu_tools.runtime.lazy import lazy_module

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.callbacks.live_view import LiveView
    from keras_gpu_tools.callbacks.memory_leak_detector import MemoryLeakDetector
    from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

# Public name -> the module that defines it.
_LAZY = {
    "GPUUtilizationLogger": "keras_gpu_tools.callbacks.gpu_utilization_logger",
    "InputBoundDetector": "keras_gpu_tools.callbacks.input_bound_detector",
    "LiveView": "keras_gpu_tools.callbacks.live_view",
    "MemoryLeakDetector": "keras_gpu_tools.callbacks.memory_leak_detector",
    "MixedPrecisionCheck": "keras_gpu_tools.callbacks.mixed_precision_check",
    "OOMBatchSizeReducer": "keras_gpu_tools.callbacks.oom_batch_size_reducer",
    "ProfilerWindow": "keras_gpu_tools.callbacks.profiler_window",
}

__all__ = [
    "GPUUtilizationLogger",
    "InputBoundDetector",
    "LiveView",
    "MemoryLeakDetector",
    "MixedPrecisionCheck",
    "OOMBatchSizeReducer",
    "ProfilerWindow",
]


# Hidden from type checkers: they would take a module __getattr__ to mean that any
# attribute exists, and miss a misspelt name; they see the imports above instead.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_module(__name__, _LAZY, globals())
