"""keras_gpu_tools: Keras 3 callbacks that make GPU training fast and its problems visible."""

__version__ = "0.1.0"

from keras_gpu_tools._core.mixed_precision import (  # noqa: E402
    MixedPrecisionFinding,
    MixedPrecisionWarning,
    check_mixed_precision,
)
from keras_gpu_tools.callbacks import GPUUtilizationLogger, MixedPrecisionCheck  # noqa: E402
from keras_gpu_tools.layers import MixedPrecisionOutput  # noqa: E402

__all__ = [
    "GPUUtilizationLogger",
    "MixedPrecisionCheck",
    "MixedPrecisionFinding",
    "MixedPrecisionOutput",
    "MixedPrecisionWarning",
    "__version__",
    "check_mixed_precision",
]
