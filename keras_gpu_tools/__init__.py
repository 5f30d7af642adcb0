"""keras_gpu_tools: Keras 3 callbacks that make GPU training fast and its problems visible.

The callbacks, the layer and the report import Keras (and through it TensorFlow,
JAX or torch), which takes seconds. They are therefore resolved on first access
through a module ``__getattr__`` (PEP 562): ``import keras_gpu_tools`` and
``keras-gpu-tools --help`` import no framework, while
``from keras_gpu_tools import GPUUtilizationLogger`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Framework-free, so imported eagerly: users filter warnings by these classes.
from keras_gpu_tools.errors import (
    GPUMonitoringWarning,
    InexactAccumulationError,
    InputPipelineWarning,
    KerasGPUToolsWarning,
    KerasInternalsError,
    KerasVersionWarning,
    MemoryLeakWarning,
    MissingDependency,
    MixedPrecisionWarning,
    OOMWarning,
    OutOfMemoryError,
    ProfilerWarning,
    UnrecoverableOOM,
)

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from keras_gpu_tools.callbacks import (
        GPUUtilizationLogger,
        InputBoundDetector,
        LiveView,
        MemoryLeakDetector,
        MixedPrecisionCheck,
        OOMBatchSizeReducer,
        ProfilerWindow,
    )
    from keras_gpu_tools.layers import MixedPrecisionOutput
    from keras_gpu_tools.mixed_precision.check import MixedPrecisionFinding, check_mixed_precision
    from keras_gpu_tools.planner import BatchPlan, plan_batch_size
    from keras_gpu_tools.reporting.report import TrainingReport, report
    from keras_gpu_tools.speedups.find import find_speedups
    from keras_gpu_tools.speedups.report import SpeedupReport
    from keras_gpu_tools.speedups.rows import SpeedupRow

# Public name -> the module it is taken from. Callbacks and layers go through
# their subpackages, which map each name to its defining module.
_LAZY = {
    "GPUUtilizationLogger": "keras_gpu_tools.callbacks",
    "InputBoundDetector": "keras_gpu_tools.callbacks",
    "LiveView": "keras_gpu_tools.callbacks",
    "MemoryLeakDetector": "keras_gpu_tools.callbacks",
    "MixedPrecisionCheck": "keras_gpu_tools.callbacks",
    "OOMBatchSizeReducer": "keras_gpu_tools.callbacks",
    "ProfilerWindow": "keras_gpu_tools.callbacks",
    "MixedPrecisionOutput": "keras_gpu_tools.layers",
    "MixedPrecisionFinding": "keras_gpu_tools.mixed_precision.check",
    "check_mixed_precision": "keras_gpu_tools.mixed_precision.check",
    "TrainingReport": "keras_gpu_tools.reporting.report",
    "report": "keras_gpu_tools.reporting.report",
    "BatchPlan": "keras_gpu_tools.planner",
    "plan_batch_size": "keras_gpu_tools.planner",
    "find_speedups": "keras_gpu_tools.speedups.find",
    "SpeedupReport": "keras_gpu_tools.speedups.report",
    "SpeedupRow": "keras_gpu_tools.speedups.rows",
}
# Subpackages that `import keras_gpu_tools` used to bind: `keras_gpu_tools.callbacks.X`
# keeps working without an explicit `import keras_gpu_tools.callbacks`.
_SUBPACKAGES = ("callbacks", "layers")

__all__ = [
    "BatchPlan",
    "GPUMonitoringWarning",
    "GPUUtilizationLogger",
    "InexactAccumulationError",
    "InputBoundDetector",
    "InputPipelineWarning",
    "KerasGPUToolsWarning",
    "KerasInternalsError",
    "KerasVersionWarning",
    "LiveView",
    "MemoryLeakDetector",
    "MemoryLeakWarning",
    "MissingDependency",
    "MixedPrecisionCheck",
    "MixedPrecisionFinding",
    "MixedPrecisionOutput",
    "MixedPrecisionWarning",
    "OOMBatchSizeReducer",
    "OOMWarning",
    "OutOfMemoryError",
    "ProfilerWarning",
    "ProfilerWindow",
    "SpeedupReport",
    "SpeedupRow",
    "TrainingReport",
    "UnrecoverableOOM",
    "__version__",
    "check_mixed_precision",
    "find_speedups",
    "plan_batch_size",
    "report",
]


# Hidden from type checkers: they would take a module __getattr__ to mean that any
# attribute exists, and miss a misspelt name; they see the imports above instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """Imports the module that defines the public name `name` (or the subpackage `name`) and returns it."""
        if name in _SUBPACKAGES:
            return importlib.import_module(f"{__name__}.{name}")  # the import binds it in globals()
        try:
            module = _LAZY[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups find it without calling __getattr__
        return value


def _register_layers_if_keras_is_loaded() -> None:
    # Loading a saved model finds `MixedPrecisionOutput` through Keras's registry, which the
    # layer's module fills when imported. Where Keras is already loaded this costs nothing
    # more, and `import keras, keras_gpu_tools; keras.saving.load_model(...)` keeps working.
    import sys

    if "keras" in sys.modules:
        importlib.import_module("keras_gpu_tools.layers.mixed_precision_output")


_register_layers_if_keras_is_loaded()


def __dir__() -> list[str]:
    """The module's names, the not yet imported public ones and subpackages included."""
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))
