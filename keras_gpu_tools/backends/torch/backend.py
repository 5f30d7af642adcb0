"""The torch backend: its concerns composed into one object, ``BACKEND``.

torch's train function is ``f(batches)``, the batches fetched by fit() before
the call; see each concern's module for what it does on torch.
"""

from __future__ import annotations

from keras_gpu_tools.backends.torch.leaks import TorchLeaks
from keras_gpu_tools.backends.torch.memory import TorchMemory
from keras_gpu_tools.backends.torch.planner import TorchPlanner
from keras_gpu_tools.backends.torch.profiler import TorchProfiler
from keras_gpu_tools.backends.torch.recovery import TorchRecovery
from keras_gpu_tools.backends.torch.step import TorchStep
from keras_gpu_tools.backends.torch.topology import TorchTopology


class TorchBackend(TorchStep, TorchProfiler, TorchRecovery, TorchMemory, TorchLeaks, TorchPlanner, TorchTopology):
    """torch (batches fetched before the step, CUDA syncs, ``torch.profiler``)."""

    install_hint = "install a CUDA build of torch (see pytorch.org for the command matching your driver's CUDA version)"

    fetches_inside_step = False
    counts_idle_batches = True
    several_steps_per_call = False  # Keras's torch trainer takes steps_per_execution=1 only
    step_compiler = "torch.compile"
    # torch.compile's (`jit_compile=True`) FX graph cache, set before the first compilation.
    compile_cache_line = (
        'os.environ.update(TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_CACHE_DIR="/tmp/inductor_cache")'
    )

    def compiles_step(self, model) -> bool:
        """torch runs eagerly unless ``jit_compile=True`` (torch.compile)."""
        return bool(getattr(model, "jit_compile", False)) and not bool(getattr(model, "run_eagerly", False))

    def __init__(self):
        super().__init__("torch")


BACKEND = TorchBackend()
