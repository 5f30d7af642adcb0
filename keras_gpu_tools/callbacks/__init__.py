"""The package's Keras callbacks, one module each."""

from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck

__all__ = ["GPUUtilizationLogger", "MixedPrecisionCheck"]
