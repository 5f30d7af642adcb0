"""TensorFlow device memory: the allocator's figures and out-of-memory errors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.protocols import Stats
from keras_gpu_tools.runtime import deps


def gpu_total_bytes(index: int) -> int | None:
    """The total memory of the framework's GPU ``index`` from NVML (TensorFlow reports no capacity itself)."""
    try:
        from keras_gpu_tools.telemetry import devices, nvml

        found = devices.visible_gpus(nvml.default_nvml())
        if index < len(found) and found[index].memory_total_bytes:
            return int(found[index].memory_total_bytes)
    except Exception:
        pass
    return None


class TFMemory(Backend):
    """Device memory and out-of-memory errors of the TensorFlow backend."""

    _gpu_count: int | None = None  # fixed once TensorFlow has initialised its devices

    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        tf = deps.loaded("tensorflow")
        out: Stats = {}
        if tf is None:
            return out
        if self._gpu_count is None:  # listing devices costs ~1 ms: once per process
            self._gpu_count = len(tf.config.list_logical_devices("GPU"))
        for i in indices:
            if i < self._gpu_count:
                info = tf.config.experimental.get_memory_info(f"GPU:{i}")
                out[i] = (float(info["current"]), float(info["peak"]))
        return out

    def device_memory(self) -> dict:
        tf = deps.loaded("tensorflow")
        if tf is None:
            return {}
        try:
            gpus = tf.config.list_logical_devices("GPU")
            if not gpus:
                return {}
            info = tf.config.experimental.get_memory_info("GPU:0")
            return {
                "device": "GPU:0",
                "bytes_in_use": int(info.get("current", 0)),
                "peak_bytes_in_use": int(info.get("peak", 0)),
            }
        except Exception:
            return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        tf = deps.loaded("tensorflow")
        if tf is None:
            return {}
        out: dict[int, tuple[float, float | None]] = {}
        for i, _ in enumerate(tf.config.list_logical_devices("GPU")):
            info = tf.config.experimental.get_memory_info(f"GPU:{i}")
            out[i] = (float(info["peak"]), gpu_total_bytes(i))
        return out

    def is_oom(self, exc: BaseException) -> bool:
        tf = deps.loaded("tensorflow")
        cls = getattr(getattr(tf, "errors", None), "ResourceExhaustedError", None) if tf is not None else None
        return cls is not None and isinstance(exc, cls)

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        return type(original)(getattr(original, "node_def", None), getattr(original, "op", None), message)

    def explain_oom(self, error, context) -> tuple[dict, dict]:
        """``get_memory_info`` of the device the error names (GPU:0 by default; the CPU where its allocator keeps statistics)."""
        tf = deps.loaded("tensorflow")
        figures: dict[str, Any] = {}
        if tf is None:
            return figures, {}
        text = str(error or "")
        device = "GPU:0"
        for name in ("GPU", "CPU"):
            marker = f"device:{name}:"
            if marker in text:
                index = text.split(marker, 1)[1].split()[0].rstrip(".,")
                device = f"{name}:{''.join(c for c in index if c.isdigit()) or '0'}"
                break
        else:
            if not tf.config.list_logical_devices("GPU"):
                device = "CPU:0"
        try:
            info = tf.config.experimental.get_memory_info(device)
            if info.get("peak"):  # the default CPU allocator keeps none (zeros)
                figures["in_use_bytes"] = int(info["current"])
                figures["peak_bytes"] = int(info["peak"])
                figures["sources"] = [f"tf.config.experimental.get_memory_info({device!r})"]
        except Exception:
            pass
        if device.startswith("GPU"):
            total = gpu_total_bytes(int(device.split(":")[1]))
            if total:
                figures["capacity_bytes"] = total
                if "in_use_bytes" in figures:
                    figures["free_bytes"] = max(0, total - figures["in_use_bytes"])
                figures.setdefault("sources", []).append("NVML (the GPU's total memory)")
        return figures, {}
