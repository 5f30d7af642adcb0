"""The TensorFlow profiler session (``tf.profiler.experimental``): what a profiler window starts and stops."""

from __future__ import annotations

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.profiling.trace import ProfilerBusy, TracerOptions


class _TF:
    name = "tensorflow"
    owner_thread_only = False  # stop() only from the thread that called start()
    pattern = "*.xplane.pb"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def start(self, run_dir: str, options: TracerOptions) -> None:
        import tensorflow as tf

        opts = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=options.host_tracer_level,
            python_tracer_level=1 if options.python_tracer else 0,
            device_tracer_level=options.device_tracer_level,
        )
        try:
            tf.profiler.experimental.start(run_dir, options=opts)
        except tf.errors.AlreadyExistsError as e:
            raise ProfilerBusy(str(e) or "another TensorFlow profiler session is running") from None

    def step(self, step_num: int):
        import tensorflow as tf

        # `_r=1` makes this a root event: what xprof's step analysis looks for.
        return tf.profiler.experimental.Trace("train", step_num=step_num, _r=1)

    def stop(self, outputs=None) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()

    def scope_layers(self, model, layers):
        """Nothing to do: the ops' name scopes already carry the layers' names."""
        return _nothing, ""


class TFProfiler(Backend):
    """The profiler side of the TensorFlow backend."""

    def profiler(self):
        return _TF()


def _nothing() -> None:
    pass
