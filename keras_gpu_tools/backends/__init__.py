"""One home per Keras backend: everything that differs between TensorFlow, JAX and torch.

Each framework has a folder (``tensorflow/``, ``jax/``, ``torch/``) with one
module per concern, named after the feature it serves:

- ``step.py``: the step hook's callers, the device sync, FLOPs and TF32;
- ``profiler.py``: the profiler session;
- ``accumulate.py``: the gradient-accumulation runners of the OOM reducer;
- ``recovery.py``: the train/test/predict functions the OOM reducer runs;
- ``memory.py``: device and allocator memory, OOM classification and explanation;
- ``planner.py``: a step's memory for ``plan_batch_size``;
- ``topology.py``: processes, devices, data parallelism, what ``doctor`` reports;
- ``data_parallel.py`` (JAX, TensorFlow): splitting a batch spread over devices;
- ``backend.py``: the class that composes them, and its ``BACKEND`` object.

:mod:`.protocols` states each concern's methods as a ``typing.Protocol``;
:class:`~keras_gpu_tools.backends.base.Backend` is the backend with no GPU
support that every framework's backend builds on. No other module of the
package compares backend names: it asks :func:`get` for the backend object
and calls its methods.

Importing these modules imports no framework; each method talks to a
framework the process has already imported (the Keras backend in use), or
imports that one framework when called.
"""

from __future__ import annotations

import importlib

from keras_gpu_tools.backends.base import Backend

_MODULES = {
    "tensorflow": "keras_gpu_tools.backends.tensorflow.backend",
    "jax": "keras_gpu_tools.backends.jax.backend",
    "torch": "keras_gpu_tools.backends.torch.backend",
}
_instances: dict[str, Backend] = {}


def get(name: str | None = None) -> Backend:
    """The backend object for ``name`` (None: the Keras backend in use).

    A backend this package has no support for (Keras's ``numpy`` or
    ``openvino``) gets the base :class:`Backend`, which sees no GPU and
    refuses what needs a step hook with a clear error.
    """
    if name is None:
        from keras_gpu_tools.runtime import deps

        name = deps.keras_backend() or "none"
    found = _instances.get(name)
    if found is None:
        module = _MODULES.get(name)
        found = importlib.import_module(module).BACKEND if module else Backend(name)
        _instances[name] = found
    return found


def supported() -> tuple[str, ...]:
    """Names of the backends with GPU support here."""
    return tuple(_MODULES)


def all_backends() -> list[Backend]:
    """Every supported backend object (to classify an error whatever raised it)."""
    return [get(name) for name in _MODULES]


def oom_kind(exc: BaseException) -> str | None:
    """Which backend's out-of-memory error ``exc`` is, or None for any other error.

    - TensorFlow: ``tf.errors.ResourceExhaustedError`` (by type).
    - JAX/XLA: ``jax.errors.JaxRuntimeError`` (older jaxlib: ``XlaRuntimeError``)
      whose message starts ``RESOURCE_EXHAUSTED`` (or, XLA's CPU runtime,
      carries "Out of memory allocating N bytes").
    - torch: ``torch.OutOfMemoryError`` (by type), and the CPU allocator's
      ``RuntimeError`` "DefaultCPUAllocator: can't allocate memory".

    Every backend is asked, whatever Keras backend is in use: a ``tf.data``
    pipeline can raise TensorFlow's error under JAX.
    """
    if not isinstance(exc, Exception):
        return None
    for backend in all_backends():
        if backend.is_oom(exc):
            return backend.name
    return None


def is_oom(exc: BaseException) -> bool:
    return oom_kind(exc) is not None


def oom_error(original: BaseException, message: str) -> BaseException:
    """An error of the original out-of-memory type carrying ``message``.

    Keeps ``except tf.errors.ResourceExhaustedError`` / ``except
    torch.OutOfMemoryError`` working in user code; falls back to
    :class:`~keras_gpu_tools.errors.OutOfMemoryError` where the type cannot be built.
    """
    from keras_gpu_tools.errors import OutOfMemoryError

    kind = oom_kind(original)
    err: BaseException | None = None
    try:
        err = get(kind).oom_error(original, message) if kind else None
    except Exception:
        err = None
    if err is None:
        err = OutOfMemoryError(message)
    try:
        # Keras's traceback filtering re-raises ``from None``: keep the original reachable.
        err.oom_original = original  # type: ignore[attr-defined]
    except Exception:
        pass
    return err


__all__ = ["Backend", "all_backends", "get", "is_oom", "oom_error", "oom_kind", "supported"]
