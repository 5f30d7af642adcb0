"""keras_gpu_tools: Keras 3 callbacks that make GPU training fast and its problems visible."""

__version__ = "0.1.0"

from keras_gpu_tools._core.mixed_precision import (  # noqa: E402
    MixedPrecisionFinding,
    MixedPrecisionWarning,
    check_mixed_precision,
)
from keras_gpu_tools._core.report import TrainingReport, report  # noqa: E402
from keras_gpu_tools.callbacks import (  # noqa: E402
    GPUUtilizationLogger,
    InputBoundDetector,
    LiveView,
    MixedPrecisionCheck,
    OOMBatchSizeReducer,
    ProfilerWindow,
)
from keras_gpu_tools.layers import MixedPrecisionOutput  # noqa: E402

__all__ = [
    "GPUUtilizationLogger",
    "InputBoundDetector",
    "LiveView",
    "MixedPrecisionCheck",
    "MixedPrecisionFinding",
    "MixedPrecisionOutput",
    "MixedPrecisionWarning",
    "OOMBatchSizeReducer",
    "ProfilerWindow",
    "TrainingReport",
    "__version__",
    "check_mixed_precision",
    "report",
]
