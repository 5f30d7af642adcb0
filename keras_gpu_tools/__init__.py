"""keras_gpu_tools: Keras 3 callbacks that make GPU training fast and its problems visible."""

__version__ = "0.1.0"

from keras_gpu_tools.callbacks import GPUUtilizationLogger  # noqa: E402

__all__ = ["GPUUtilizationLogger", "__version__"]
