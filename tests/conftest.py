"""Test set-up shared by the whole suite.

The Keras backend is fixed at import, so one pytest process tests one backend:
``KERAS_BACKEND`` (default ``tensorflow`` here) picks it. ``tests/test_backends.py``
re-runs the tests marked ``multibackend`` under JAX and torch in subprocesses.
Tests marked ``gpu`` run only where NVML sees a GPU (the lent GPU machine).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


HAS_GPU = _gpu_present()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the GPU machine: ../shared/GPU-MACHINE.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def backend():
    import keras

    return keras.backend.backend()
