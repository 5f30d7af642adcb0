"""torch memory over time: the caching allocator's reserved memory, live tensors (a heap walk), torch.compile graphs."""

from __future__ import annotations

from collections.abc import Iterable

from keras_gpu_tools.backends.base import FUNCTIONS, Backend
from keras_gpu_tools.backends.protocols import Stats
from keras_gpu_tools.backends.torch.memory import allocator_stats, available_cuda
from keras_gpu_tools.leaks.census import heap_census
from keras_gpu_tools.runtime import deps


def _nbytes(t) -> float:
    return float(t.nelement() * t.element_size())


class TorchLeaks(Backend):
    """What MemoryLeakDetector reads on torch."""

    allocator_cache_note = (
        "torch's caching allocator keeps freed blocks to reuse them (`torch.cuda.memory_reserved()` against "
        "`torch.cuda.memory_allocated()`); `torch.cuda.empty_cache()` hands them back, and "
        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lessens fragmentation."
    )

    def allocator_reserved(self, indices: Iterable[int]) -> dict[int, float]:
        cuda = available_cuda()
        if cuda is None:
            return {}
        n = cuda.device_count()
        return {i: allocator_stats(cuda, i)[2] for i in indices if i < n}

    def allocator_readings(self, indices: Iterable[int]) -> tuple[Stats, dict[int, float]]:
        """``allocator_memory`` and ``allocator_reserved`` from one read of each device's figures."""
        cuda = available_cuda()
        if cuda is None:
            return {}, {}
        n = cuda.device_count()
        stats = {i: allocator_stats(cuda, i) for i in indices if i < n}
        return {i: s[:2] for i, s in stats.items()}, {i: s[2] for i, s in stats.items()}

    def live_tensors(self, heap: bool) -> tuple[int, float] | None:
        torch = deps.loaded("torch")
        if not heap or torch is None:
            return None  # torch keeps no registry of its tensors
        return heap_census((torch.Tensor,), _nbytes)

    def compiled_functions(self, model, names: tuple[str, ...] = FUNCTIONS) -> dict[int, int] | None:
        """Graphs torch.compile (``jit_compile=True``) made in this process, whatever ``names``; None where it never ran."""
        dynamo_utils = deps.loaded("torch._dynamo.utils")
        counters = getattr(dynamo_utils, "counters", None) if dynamo_utils is not None else None
        if counters is None:
            return None
        try:
            return {0: int(counters["stats"]["unique_graphs"])}
        except Exception:
            return None
