"""Test set-up shared by the whole suite.

The Keras backend is fixed at import, so one pytest process tests one backend:
``KERAS_BACKEND`` (default ``tensorflow`` here) picks it. ``tests/test_backends.py``
re-runs the tests marked ``multibackend`` under JAX and torch in subprocesses.
Tests marked ``gpu`` run only where NVML sees a GPU; tests marked ``slow`` (over
about 5 s on a 2-core CPU) can be left out with ``-m "not slow"``. The report
header names the Python, Keras and framework versions under test.
"""

import os
import platform
import re
from importlib import metadata

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

# What the pytest subprocesses of tests/test_backends.py reported, for the terminal summary.
SUBRUNS = pytest.StashKey[list]()


def _version(*distributions: str) -> str:
    for dist in distributions:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return "not installed"


def pytest_report_header(config):
    try:
        import keras
    except Exception as e:  # the tests will say more; the header must not hide it
        return [f"keras_gpu_tools: Python {platform.python_version()}, keras cannot be imported: {e!r}"]
    frameworks = ", ".join(
        f"{name} {_version(*dists)}"
        for name, dists in (
            ("tensorflow", ("tensorflow", "tensorflow-cpu")),
            ("jax", ("jax",)),
            ("jaxlib", ("jaxlib",)),
            ("torch", ("torch",)),
            ("numpy", ("numpy",)),
        )
    )
    return [
        f"keras_gpu_tools: Python {platform.python_version()}, keras {keras.__version__} "
        f"(backend {keras.backend.backend()}), GPU {'present' if HAS_GPU else 'absent'}",
        f"keras_gpu_tools: {frameworks}",
    ]


@pytest.fixture
def record_subrun(request):
    """Records a pytest subprocess's outcome (a name and its output) for the terminal summary."""

    def record(name: str, output: str) -> None:
        lines = output.splitlines()
        summary = [
            line.strip("= ") for line in lines if re.search(r"\b\d+ (passed|failed|skipped|error).* in [0-9.]+s", line)
        ]
        kept = [line for line in lines if line.startswith(("SKIPPED", "FAILED", "ERROR"))]
        request.config.stash.setdefault(SUBRUNS, []).append((name, summary[-1:] + kept))

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for name, lines in config.stash.get(SUBRUNS, []):
        terminalreporter.write_sep("-", f"subprocess: {name}")
        for line in lines or ["(no summary line: see the test's output)"]:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML sees none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def backend():
    import keras

    return keras.backend.backend()
