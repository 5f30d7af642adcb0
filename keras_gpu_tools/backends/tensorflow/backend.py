"""The TensorFlow backend: its concerns composed into one object, ``BACKEND``.

TensorFlow's train function is ``f(iterator)`` (``tf.data`` in the graph,
``tf.function`` steps); see each concern's module for what it does on TensorFlow.
"""

from __future__ import annotations

from keras_gpu_tools.backends.tensorflow.leaks import TFLeaks
from keras_gpu_tools.backends.tensorflow.memory import TFMemory
from keras_gpu_tools.backends.tensorflow.planner import TFPlanner
from keras_gpu_tools.backends.tensorflow.profiler import TFProfiler
from keras_gpu_tools.backends.tensorflow.recovery import TFRecovery
from keras_gpu_tools.backends.tensorflow.step import TFStep
from keras_gpu_tools.backends.tensorflow.topology import TFTopology


class TensorFlowBackend(TFStep, TFProfiler, TFRecovery, TFMemory, TFLeaks, TFPlanner, TFTopology):
    """TensorFlow (``tf.data`` in the graph, ``tf.function`` steps, ``tf.profiler``)."""

    install_hint = (
        "install a GPU build: `pip install 'tensorflow[and-cuda]'` (tensorflow-cpu never uses a GPU; "
        "TensorFlow's GPU builds are for Linux/WSL2)"
    )

    # XLA's cache of compiled clusters (`jit_compile=True`), set before TensorFlow is imported; a tf.function's
    # tracing itself is redone in each process.
    compile_cache_line = 'os.environ["TF_XLA_FLAGS"] = "--tf_xla_persistent_cache_directory=/tmp/xla_cache"'

    def __init__(self):
        super().__init__("tensorflow")
        self._gpu_count = None


BACKEND = TensorFlowBackend()
