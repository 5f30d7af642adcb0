"""The package's Keras layers."""

from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput

__all__ = ["MixedPrecisionOutput"]
