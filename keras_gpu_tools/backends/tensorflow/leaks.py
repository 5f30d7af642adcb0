"""TensorFlow memory over time: live eager tensors (a heap walk) and the traces of the model's tf.functions."""

from __future__ import annotations

from collections.abc import Callable

from keras_gpu_tools.backends.base import FUNCTIONS, Backend
from keras_gpu_tools.leaks.census import heap_census
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki


def _nbytes(t) -> float:
    return float(t.shape.num_elements() or 0) * t.dtype.size


class TFLeaks(Backend):
    """What MemoryLeakDetector reads on TensorFlow (its allocator reports no cache of its own)."""

    def live_tensors(self, heap: bool) -> tuple[int, float] | None:
        ops = deps.loaded("tensorflow.python.framework.ops")
        cls = getattr(ops, "EagerTensor", None) if ops is not None else None
        if not heap or cls is None:
            return None  # TensorFlow keeps no registry of its tensors
        return heap_census((cls,), _nbytes)

    def compiled_functions(self, model, names: tuple[str, ...] = FUNCTIONS) -> dict[int, int] | None:
        return self.trace_counter(model, names)()

    def trace_counter(self, model, names: tuple[str, ...] = FUNCTIONS) -> Callable[[], dict[int, int] | None]:
        """Reads the traces of the compiled functions found now (the closures walked once)."""
        fns = [
            fn for name in names for fn in ki.compiled_in(getattr(model, name, None), "experimental_get_tracing_count")
        ]

        def read() -> dict[int, int] | None:
            out: dict[int, int] = {}
            for fn in fns:
                try:
                    out[id(fn)] = int(fn.experimental_get_tracing_count())
                except Exception:
                    continue
            return out or None

        return read
