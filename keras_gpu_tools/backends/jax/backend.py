"""The JAX backend: its concerns composed into one object, ``BACKEND``.

JAX's train function is ``logs, state = f(state, iterator)``, a jitted step
that donates its state; see each concern's module for what it does on JAX.
"""

from __future__ import annotations

from keras_gpu_tools.backends.jax.leaks import JaxLeaks
from keras_gpu_tools.backends.jax.memory import JaxMemory
from keras_gpu_tools.backends.jax.planner import JaxPlanner
from keras_gpu_tools.backends.jax.profiler import JaxProfiler
from keras_gpu_tools.backends.jax.recovery import JaxRecovery
from keras_gpu_tools.backends.jax.step import JaxStep
from keras_gpu_tools.backends.jax.topology import JaxTopology


class JaxBackend(JaxStep, JaxProfiler, JaxRecovery, JaxMemory, JaxLeaks, JaxPlanner, JaxTopology):
    """JAX (jitted steps with donated state, ``jax.profiler``, XLA memory analysis)."""

    install_hint = "install the CUDA plugin: `pip install -U 'jax[cuda13]'` (or jax[cuda12] for CUDA 12 drivers)"

    traced_flops = True
    predicts_memory = True
    even_shares = True
    counts_idle_batches = True
    compile_cache_line = 'jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/jax"))'
    forks_safely = False  # JAX's runtime threads: os.fork() of the process may deadlock (JAX warns so)

    def __init__(self):
        super().__init__("jax")
        self._async = None


BACKEND = JaxBackend()
