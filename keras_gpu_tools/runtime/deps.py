"""Optional dependencies, imported lazily in one place.

No module of this package imports TensorFlow, JAX or torch at import time: on
the JAX and torch backends a user may not have TensorFlow at all. Each helper
here imports on first use and names the pip extra that brings what is missing.
"""

from __future__ import annotations

import importlib
import sys

from keras_gpu_tools.errors import MissingDependency


def _require(module: str, pip_name: str, purpose: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependency(
            f"{purpose} needs `{module}`, which could not be imported ({e}). Install it with `pip install {pip_name}`."
        ) from e


def tensorboard_event_writer():
    return _require(
        "tensorboard.summary.writer.event_file_writer",
        "keras-gpu-tools[tensorboard]` or `pip install tensorboard",
        "Writing TensorBoard logs",
    )


def tensorboard_protos():
    summary_pb2 = _require("tensorboard.compat.proto.summary_pb2", "tensorboard", "Writing TensorBoard logs")
    event_pb2 = _require("tensorboard.compat.proto.event_pb2", "tensorboard", "Writing TensorBoard logs")
    return summary_pb2, event_pb2


def loaded(module: str):
    """The module if the process has already imported it, else None.

    Used to talk to the framework the user's Keras backend already loaded,
    without importing a framework ourselves.
    """
    return sys.modules.get(module)


def keras_backend() -> str | None:
    """The Keras backend in use, importing Keras (never a framework) if needed."""
    try:
        import keras
    except ImportError:
        return None
    return keras.backend.backend()
