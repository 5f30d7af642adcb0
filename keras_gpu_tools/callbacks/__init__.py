"""The package's Keras callbacks, one module each."""

from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

__all__ = [
    "GPUUtilizationLogger",
    "InputBoundDetector",
    "LiveView",
    "MixedPrecisionCheck",
    "OOMBatchSizeReducer",
    "ProfilerWindow",
]
