"""The JAX profiler session (``jax.profiler``): what a profiler window starts and stops."""

from __future__ import annotations

import sys

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.profiling.trace import ProfilerBusy, TracerOptions


class _JAX:
    name = "jax"
    owner_thread_only = False  # stop() only from the thread that called start()
    pattern = "*.xplane.pb"

    def available(self) -> tuple[bool, str]:
        if sys.version_info < (3, 12):
            # Keras itself disables JAX profiling below 3.12 (a segfault was reported).
            return False, (
                "JAX profiling is unavailable on Python < 3.12: Keras disables it there "
                "because jax.profiler was reported to crash"
            )
        return True, ""

    def start(self, run_dir: str, options: TracerOptions) -> None:
        import jax

        kwargs = {}
        if hasattr(jax.profiler, "ProfileOptions"):
            po = jax.profiler.ProfileOptions()
            for attr, value in (
                ("host_tracer_level", options.host_tracer_level),
                ("python_tracer_level", 1 if options.python_tracer else 0),
            ):
                if hasattr(po, attr):
                    setattr(po, attr, value)
            kwargs["profiler_options"] = po
        try:
            jax.profiler.start_trace(run_dir, **kwargs)
        except RuntimeError as e:
            if "already" in str(e).lower():
                raise ProfilerBusy(str(e)) from None
            raise

    def step(self, step_num: int):
        import jax

        return jax.profiler.StepTraceAnnotation("train", step_num=step_num)

    def stop(self, outputs=None) -> None:
        import jax

        if outputs is not None:
            jax.block_until_ready(outputs)  # let the window's kernels finish inside the trace
        jax.profiler.stop_trace()

    def scope_layers(self, model, layers):
        """Nothing to do: the ops' name scopes already carry the layers' names."""
        return _nothing, ""


class JaxProfiler(Backend):
    """The profiler side of the JAX backend."""

    def profiler(self):
        return _JAX()


def _nothing() -> None:
    pass
