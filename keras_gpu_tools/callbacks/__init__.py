"""The package's Keras callbacks, one module each, imported on first use.

Each callback module imports Keras, and Keras its backend; resolving the names
through a module ``__getattr__`` (PEP 562) keeps ``import keras_gpu_tools.callbacks``
free of both until a callback is actually used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.callbacks.live_view import LiveView
    from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

# Public name -> the module that defines it.
_LAZY = {
    "GPUUtilizationLogger": "keras_gpu_tools.callbacks.gpu_utilization_logger",
    "InputBoundDetector": "keras_gpu_tools.callbacks.input_bound_detector",
    "LiveView": "keras_gpu_tools.callbacks.live_view",
    "MixedPrecisionCheck": "keras_gpu_tools.callbacks.mixed_precision_check",
    "OOMBatchSizeReducer": "keras_gpu_tools.callbacks.oom_batch_size_reducer",
    "ProfilerWindow": "keras_gpu_tools.callbacks.profiler_window",
}

__all__ = [
    "GPUUtilizationLogger",
    "InputBoundDetector",
    "LiveView",
    "MixedPrecisionCheck",
    "OOMBatchSizeReducer",
    "ProfilerWindow",
]


# Hidden from type checkers: they would take a module __getattr__ to mean that any
# attribute exists, and miss a misspelt name; they see the imports above instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """Imports the module that defines the public name `name` and returns it."""
        try:
            module = _LAZY[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups find it without calling __getattr__
        return value


def __dir__() -> list[str]:
    """The module's names, the not yet imported public ones included."""
    return sorted(set(globals()) | set(__all__))
