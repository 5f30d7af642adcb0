"""Which roles (``keras_gpu_tools.runtime.roles``) each callback of the package plays.

Each callback inherits its roles; :func:`declared` lists them, and mypy checks there that each
class defines every member of each of its roles (``type[Role]`` takes only a class that does):
a renamed attribute fails type checking rather than silently hiding the callback from its finders.
"""

from __future__ import annotations

from keras_gpu_tools.runtime import roles


def declared() -> dict[type, tuple[type, ...]]:
    """Each callback class of the package and the roles it plays (imports the callbacks, so Keras)."""
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.callbacks.live_view import LiveView
    from keras_gpu_tools.callbacks.memory_leak_detector import MemoryLeakDetector
    from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

    gpu: type[roles.GPUSampler] = GPUUtilizationLogger
    verdicts: type[roles.InputVerdicts] = InputBoundDetector
    thresholds: type[roles.InputThresholds] = InputBoundDetector
    captures: type[roles.ProfileCaptures] = ProfilerWindow
    micro_batching: type[roles.MicroBatching] = OOMBatchSizeReducer
    detector = (roles.InputVerdicts, roles.InputThresholds)
    return {
        gpu: (roles.GPUSampler, roles.GPUTimeline),
        verdicts: detector,
        thresholds: detector,  # the same class (its key once): mypy checks it in each role
        captures: (roles.ProfileCaptures,),
        micro_batching: (roles.MicroBatching,),
        MemoryLeakDetector: (),
        MixedPrecisionCheck: (),
        LiveView: (),
    }
