"""JAX memory over time: the allocator's pool, live arrays (``jax.live_arrays()``) and the jitted steps' caches."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from keras_gpu_tools.backends.base import FUNCTIONS, Backend
from keras_gpu_tools.backends.jax.memory import local_gpus
from keras_gpu_tools.backends.protocols import Stats
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki


class JaxLeaks(Backend):
    """What MemoryLeakDetector reads on JAX."""

    allocator_cache_note = (
        "XLA's allocator takes a pool from the device (75% of it by default, XLA_PYTHON_CLIENT_PREALLOCATE) "
        "and keeps it; nvidia-smi shows the pool, not what arrays use."
    )

    def allocator_reserved(self, indices: Iterable[int]) -> dict[int, float]:
        return self.allocator_readings(indices)[1]

    def allocator_readings(self, indices: Iterable[int]) -> tuple[Stats, dict[int, float]]:
        """``allocator_memory`` and ``allocator_reserved`` from one ``memory_stats()`` of each device."""
        gpus = local_gpus()
        in_use: Stats = {}
        reserved: dict[int, float] = {}
        for i in indices:
            if i < len(gpus):
                stats = gpus[i].memory_stats() or {}
                if "bytes_in_use" in stats:
                    in_use[i] = (
                        float(stats["bytes_in_use"]),
                        float(stats.get("peak_bytes_in_use", stats["bytes_in_use"])),
                    )
                value = stats.get("pool_bytes", stats.get("bytes_reserved"))
                if value is not None:
                    reserved[i] = float(value)
        return in_use, reserved

    def live_tensors(self, heap: bool) -> tuple[int, float] | None:
        """Every live JAX array, from JAX's own registry: cheap, so read every epoch whatever ``heap`` says."""
        jax = deps.loaded("jax")
        if jax is None:
            return None
        arrays = jax.live_arrays()
        total = 0.0
        for a in arrays:
            try:
                total += a.nbytes
            except Exception:  # a deleted (donated) array
                continue
        return len(arrays), total

    def compiled_functions(self, model, names: tuple[str, ...] = FUNCTIONS) -> dict[int, int] | None:
        return self.trace_counter(model, names)()

    def trace_counter(self, model, names: tuple[str, ...] = FUNCTIONS) -> Callable[[], dict[int, int] | None]:
        """Reads the traces of the compiled functions found now (the closures walked once)."""
        fns = [fn for name in names for fn in ki.compiled_in(getattr(model, name, None), "_cache_size")]

        def read() -> dict[int, int] | None:
            out: dict[int, int] = {}
            for fn in fns:
                try:
                    out[id(fn)] = int(fn._cache_size())
                except Exception:
                    continue
            return out or None

        return read
