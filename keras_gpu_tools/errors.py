"""The package's public exceptions and warning categories.

Every warning this package issues has a category below, so a user can silence
or escalate one source without touching the others, for example::

    import warnings
    from keras_gpu_tools.errors import GPUMonitoringWarning

    warnings.simplefilter("ignore", GPUMonitoringWarning)

No framework is imported here.
"""

from __future__ import annotations


# -- warnings ------------------------------------------------------------------------
class KerasGPUToolsWarning(UserWarning):
    """Base class of every warning keras_gpu_tools issues."""


class GPUMonitoringWarning(KerasGPUToolsWarning):
    """A GPU or host metric could not be read; monitoring goes on without it."""


class InputPipelineWarning(KerasGPUToolsWarning):
    """`InputBoundDetector` could not measure or explain something; training goes on."""


class ProfilerWarning(KerasGPUToolsWarning):
    """`ProfilerWindow` skipped, cut short or could not analyse a window; training goes on."""


class OOMWarning(KerasGPUToolsWarning):
    """`OOMBatchSizeReducer` recovered from, or could not plan for, an out-of-memory error."""


class MixedPrecisionWarning(KerasGPUToolsWarning):
    """A mixed-precision setting that loses accuracy or speed (see `check_mixed_precision`)."""


class MemoryLeakWarning(KerasGPUToolsWarning):
    """`MemoryLeakDetector` could not read a memory figure; training goes on without it."""


class KerasVersionWarning(KerasGPUToolsWarning):
    """The installed Keras is outside the range whose internals this package was tested with."""


# -- errors ----------------------------------------------------------------------------
class KerasInternalsError(RuntimeError):
    """A Keras internal this package relies on is missing or has changed."""


class UnrecoverableOOM(MemoryError):
    """An out-of-memory error that could not be retried without losing or repeating an update."""


class InexactAccumulationError(ValueError):
    """`OOMBatchSizeReducer(mode="accumulate")` cannot reproduce the unsplit batch for this model or train step.

    Raised before any update is applied (in `on_train_begin` where it can be
    told from the model, else at the first split, with the state put back),
    with the reason; `mode="split"` trains on truly smaller batches instead.
    """


class OutOfMemoryError(MemoryError):
    """Even `min_batch_size` ran out of memory, where the backend's own error type cannot be built."""


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message names the pip extra that brings it."""


__all__ = [
    "GPUMonitoringWarning",
    "InexactAccumulationError",
    "InputPipelineWarning",
    "KerasGPUToolsWarning",
    "KerasInternalsError",
    "KerasVersionWarning",
    "MissingDependency",
    "MixedPrecisionWarning",
    "OOMWarning",
    "OutOfMemoryError",
    "ProfilerWarning",
    "UnrecoverableOOM",
]
