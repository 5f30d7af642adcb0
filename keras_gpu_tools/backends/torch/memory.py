"""torch device memory: the CUDA allocator's figures and history, and out-of-memory errors."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.protocols import Stats
from keras_gpu_tools.memory.explain import fragmentation_note, parse_message
from keras_gpu_tools.runtime import deps

logger = logging.getLogger("keras_gpu_tools")


# The message of a CPU allocation failure in torch ("DefaultCPUAllocator: can't
# allocate memory"): torch raises a plain RuntimeError there, not
# torch.OutOfMemoryError (which it raises for CUDA).
_CPU_OOM = "can't allocate memory"


def _describe_block(block: dict, segment: dict) -> str:
    """A snapshot block in words: where it was allocated (the innermost frame outside torch), where known."""
    frames = block.get("frames") or []
    for frame in frames:
        name = str(frame.get("filename", ""))
        if name and "/torch/" not in name and not name.startswith("??"):
            return f"block at {os.path.basename(name)}:{frame.get('line')} ({frame.get('name')})"
    return f"block in a {segment.get('segment_type', '')} segment".replace("a  segment", "a segment")


def available_cuda():
    """``torch.cuda`` where torch is imported and sees a CUDA device, else None."""
    torch = deps.loaded("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda


def allocator_stats(cuda, index: int) -> tuple[float, float, float]:
    """(bytes in use, their peak, bytes reserved) of device ``index``, from one read of the allocator's figures.

    ``torch.cuda.memory_allocated``, ``max_memory_allocated`` and
    ``memory_reserved`` each build and flatten every figure of the allocator
    (``memory_stats``: some 150 keys, sorted); the nested figures are read once
    here, unflattened. The same values, 0 before CUDA is initialised, as theirs.
    """
    nested = cuda.memory_stats_as_nested_dict(index) or {}

    def figure(name: str, which: str) -> float:
        return float(nested.get(name, {}).get("all", {}).get(which, 0))

    return figure("allocated_bytes", "current"), figure("allocated_bytes", "peak"), figure("reserved_bytes", "current")


class TorchMemory(Backend):
    """Device memory and out-of-memory errors of the torch backend."""

    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        cuda = available_cuda()
        out: Stats = {}
        if cuda is None:
            return out
        n = cuda.device_count()
        for i in indices:
            if i < n:
                out[i] = allocator_stats(cuda, i)[:2]
        return out

    def device_memory(self) -> dict:
        torch = deps.loaded("torch")
        if torch is None:
            return {}
        try:
            if not torch.cuda.is_available():
                return {}
            i = torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(i)
            return {
                "device": torch.cuda.get_device_name(i),
                "bytes_limit": int(total),
                "bytes_in_use": int(torch.cuda.memory_allocated(i)),
                "peak_bytes_in_use": int(torch.cuda.max_memory_allocated(i)),
            }
        except Exception:
            return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        cuda = available_cuda()
        if cuda is None or not cuda.is_initialized():
            return {}
        out: dict[int, tuple[float, float | None]] = {}
        for i in range(cuda.device_count()):
            out[i] = (float(cuda.max_memory_allocated(i)), float(cuda.mem_get_info(i)[1]))
        return out

    def is_oom(self, exc: BaseException) -> bool:
        torch = deps.loaded("torch")
        if torch is None:
            return False
        cls = getattr(torch, "OutOfMemoryError", None) or getattr(
            getattr(torch, "cuda", None), "OutOfMemoryError", None
        )
        if cls is not None and isinstance(exc, cls):
            return True
        return type(exc) is RuntimeError and "DefaultCPUAllocator" in str(exc) and _CPU_OOM in str(exc)

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        made = type(original)(message)
        return made if isinstance(made, BaseException) else None

    def explain_oom(self, error, context) -> tuple[dict, dict]:
        """The CUDA allocator's statistics and a summary of ``torch.cuda.memory_snapshot()``; with the
        allocation history recording (``start_memory_history``), the snapshot file PyTorch's memory
        visualizer (https://pytorch.org/memory_viz) opens."""
        cuda = available_cuda()
        figures: dict[str, Any] = {"sources": []}
        artifacts: dict[str, bytes] = {}
        if cuda is None or not cuda.is_initialized():
            return figures, artifacts
        try:
            i = cuda.current_device()
            free, total = cuda.mem_get_info(i)
            stats = cuda.memory_stats(i)
            figures.update(
                device=f"cuda:{i} ({cuda.get_device_name(i)})",
                free_bytes=int(free),
                capacity_bytes=int(total),
                in_use_bytes=int(stats.get("allocated_bytes.all.current", 0)),
                peak_bytes=int(stats.get("allocated_bytes.all.peak", 0)),
                reserved_bytes=int(stats.get("reserved_bytes.all.current", 0))
                - int(stats.get("allocated_bytes.all.current", 0)),
            )
            figures["sources"].append("torch.cuda.mem_get_info / memory_stats")
            # The message's figures where it gives them: the moment of the failed request, as the lines show.
            said = parse_message(str(error)) if error is not None else {}
            conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
            note = fragmentation_note(
                said.get("requested_bytes"),
                said.get("free_bytes", figures["free_bytes"]),
                said.get("reserved_bytes", figures["reserved_bytes"]),
                "expandable_segments:true" in conf.lower(),
            )
            if note:
                figures["notes"] = [note]
            blocks = []
            for segment in cuda.memory_snapshot():
                for block in segment.get("blocks", []):
                    if block.get("state") == "active_allocated":
                        blocks.append((_describe_block(block, segment), int(block.get("size", 0))))
            blocks.sort(key=lambda b: -b[1])
            figures["largest"] = blocks[:5]
            figures["sources"].append("torch.cuda.memory_snapshot()")
        except Exception:
            logger.debug("keras_gpu_tools: torch memory figures failed", exc_info=True)
        if context.get("files") and self._recording:
            try:
                import pickle

                artifacts["memory_snapshot.pickle"] = pickle.dumps(cuda.memory._snapshot())
            except Exception:
                logger.debug("keras_gpu_tools: no memory snapshot", exc_info=True)
        return figures, artifacts

    _recording = False

    def start_memory_history(self) -> str | None:
        cuda = available_cuda()
        if cuda is None:
            return "torch records allocation history on CUDA devices only; this process has none"
        try:
            cuda.memory._record_memory_history(max_entries=100000)
        except Exception as e:
            return f"torch.cuda.memory._record_memory_history failed: {e}"
        self._recording = True
        return None

    def stop_memory_history(self) -> None:
        cuda = available_cuda()
        if cuda is not None and self._recording:
            self._recording = False
            try:
                cuda.memory._record_memory_history(enabled=None)
            except Exception:
                logger.debug("keras_gpu_tools: could not stop the memory history", exc_info=True)
