"""Per-backend facts: the GPUs a framework sees and its allocator's figures.

Each backend has the same two functions, ``gpu_devices()`` and
``allocator_memory(indices)``; :func:`for_backend` picks the set. They talk only
to a framework the process has already imported (the Keras backend in use), so
calling them never imports TensorFlow, JAX or torch behind the user's back.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

from keras_gpu_tools._core.deps import loaded

Stats = dict[int, tuple[float, float]]  # local GPU index -> (current bytes, peak bytes)


# -- TensorFlow ---------------------------------------------------------------
def _tf_gpu_devices() -> list[str]:
    tf = loaded("tensorflow")
    if tf is None:
        return []
    return [d.name for d in tf.config.list_logical_devices("GPU")]


_tf_gpu_count = None  # fixed once TensorFlow has initialised its devices


def _tf_allocator_memory(indices: Iterable[int]) -> Stats:
    global _tf_gpu_count
    tf = loaded("tensorflow")
    out: Stats = {}
    if tf is None:
        return out
    if _tf_gpu_count is None:  # listing devices costs ~1 ms: once per process
        _tf_gpu_count = len(tf.config.list_logical_devices("GPU"))
    n = _tf_gpu_count
    for i in indices:
        if i < n:
            info = tf.config.experimental.get_memory_info(f"GPU:{i}")
            out[i] = (float(info["current"]), float(info["peak"]))
    return out


# -- JAX ----------------------------------------------------------------------
_jax_gpu_list = None


def _jax_gpus():
    global _jax_gpu_list
    jax = loaded("jax")
    if jax is None:
        return []
    if _jax_gpu_list is None:  # the device list is fixed once JAX has started
        _jax_gpu_list = [d for d in jax.local_devices() if d.platform == "gpu"]
    return _jax_gpu_list


def _jax_gpu_devices() -> list[str]:
    return [str(d) for d in _jax_gpus()]


def _jax_allocator_memory(indices: Iterable[int]) -> Stats:
    gpus = _jax_gpus()
    out: Stats = {}
    for i in indices:
        if i < len(gpus):
            stats = gpus[i].memory_stats() or {}
            if "bytes_in_use" in stats:
                out[i] = (float(stats["bytes_in_use"]), float(stats.get("peak_bytes_in_use", stats["bytes_in_use"])))
    return out


# -- torch --------------------------------------------------------------------
def _torch_cuda():
    torch = loaded("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda


def _torch_gpu_devices() -> list[str]:
    cuda = _torch_cuda()
    if cuda is None:
        return []
    return [f"cuda:{i} ({cuda.get_device_name(i)})" for i in range(cuda.device_count())]


def _torch_allocator_memory(indices: Iterable[int]) -> Stats:
    cuda = _torch_cuda()
    out: Stats = {}
    if cuda is None:
        return out
    n = cuda.device_count()
    for i in indices:
        if i < n:
            out[i] = (float(cuda.memory_allocated(i)), float(cuda.max_memory_allocated(i)))
    return out


def _none_devices() -> list[str]:
    return []


def _none_allocator_memory(indices: Iterable[int]) -> Stats:
    return {}


_BACKENDS = {
    "tensorflow": SimpleNamespace(gpu_devices=_tf_gpu_devices, allocator_memory=_tf_allocator_memory),
    "jax": SimpleNamespace(gpu_devices=_jax_gpu_devices, allocator_memory=_jax_allocator_memory),
    "torch": SimpleNamespace(gpu_devices=_torch_gpu_devices, allocator_memory=_torch_allocator_memory),
}


def for_backend(name: str):
    """The functions for backend ``name``; backends without GPUs get empty ones."""
    return _BACKENDS.get(name, SimpleNamespace(gpu_devices=_none_devices, allocator_memory=_none_allocator_memory))
