"""The package's Keras callbacks, one module each."""

from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger

__all__ = ["GPUUtilizationLogger"]
