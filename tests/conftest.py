"""Test set-up shared by the whole suite.

The Keras backend is fixed at import, so one pytest process tests one backend:
``KERAS_BACKEND`` (default ``tensorflow`` here) picks it. The tests marked
``multibackend`` are the ones to run again under JAX and torch
(``KERAS_BACKEND=jax python -m pytest -m multibackend``; README.md's test command
chains the three runs). Where the backend's framework is not installed, the run
collects nothing and reports one skipped item that says so. Tests marked ``gpu``
run only where NVML sees a GPU; tests marked ``slow`` (over about 5 s on a
2-core CPU) can be left out with ``-m "not slow"``. The report header names the
Python, Keras and framework versions under test.
"""

import gc
import importlib.util
import os
import platform
from importlib import metadata

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One TensorFlow CPU allocator on every x86 CPU: oneDNN is on by default only where the CPU has
# AVX-512 (its allocator keeps statistics but retries a failed allocation for 10 s), off elsewhere.
# Off, a real out-of-memory error is raised at once, and Intel and AMD machines test the same thing.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import pytest  # noqa: E402

from tests.helpers.gpu import HAS_GPU  # noqa: E402
from tests.helpers.session import ALLOCATOR_STATS, TF_CPU_DEVICES, files_marked  # noqa: E402

BACKEND = os.environ["KERAS_BACKEND"]

# Keras imports the backend's framework on `import keras`, and every test module imports keras.
MISSING_FRAMEWORK = BACKEND in ("tensorflow", "jax", "torch") and importlib.util.find_spec(BACKEND) is None


def _version(*distributions: str) -> str:
    for dist in distributions:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return "not installed"


def pytest_report_header(config):
    if MISSING_FRAMEWORK:
        return [
            f"keras_gpu_tools: Python {platform.python_version()}, KERAS_BACKEND={BACKEND}: {BACKEND} is not installed"
        ]
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


def _allocator_stats_session(config) -> bool:
    """Whether ``-m`` selects only the allocator-stats tests (``tf_allocator_stats [and (...)]``)."""
    marks = (config.option.markexpr or "").strip()
    return BACKEND == "tensorflow" and (marks == ALLOCATOR_STATS or marks.startswith(ALLOCATOR_STATS + " and "))


def pytest_configure(config):
    """Fixes what TensorFlow reads once, before any test imports it: the allocator and the CPU devices."""
    if BACKEND != "tensorflow" or MISSING_FRAMEWORK:
        return
    if _allocator_stats_session(config):
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * TF_CPU_DEVICES)


def pytest_ignore_collect(collection_path, config):
    """Without the backend's framework no test module can be imported: collect none of them."""
    if MISSING_FRAMEWORK and collection_path.is_file():
        return True
    return None


class _BackendNotInstalled(pytest.Item):
    def runtest(self):
        pytest.skip(f"{BACKEND} is not installed: the {BACKEND} backend is not tested in this environment")

    def reportinfo(self):
        return self.path, None, self.name


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: this item always runs
def pytest_collection_modifyitems(session, config, items):
    if MISSING_FRAMEWORK:
        items[:] = [_BackendNotInstalled.from_parent(session, name=f"keras backend {BACKEND}")]
        return
    if BACKEND == "tensorflow" and not _allocator_stats_session(config):
        apart = pytest.mark.skip(
            reason=f"reads TensorFlow's CPU allocator statistics: run apart, python -m pytest -m {ALLOCATOR_STATS}"
        )
        marked = [item for item in items if ALLOCATOR_STATS in item.keywords]
        unseen = sorted({os.path.realpath(item.path) for item in marked} - set(files_marked(ALLOCATOR_STATS)))
        if unseen:  # `python -m tests` would run these in no session
            raise pytest.UsageError(f"mark the {ALLOCATOR_STATS} tests of {unseen} as pytest.mark.{ALLOCATOR_STATS}")
        for item in marked:
            item.add_marker(apart)
    if not HAS_GPU:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML sees none here)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _long_files_first(items)


SLOW_WEIGHT = 30  # a `slow` test (a fit of many steps, a subprocess) weighs about as much as this many others


def _long_files_first(items) -> None:
    """Orders the files by their weight, heaviest first, each file's tests in their own order.

    pytest-xdist (`--dist loadfile`) hands files to its workers in this order: the long files
    start at once instead of finishing alone on one worker while the others are idle.
    """
    weight: dict[str, int] = {}
    for item in items:
        path = str(item.path)
        weight[path] = weight.get(path, 0) + (SLOW_WEIGHT if "slow" in item.keywords else 1)
    first_seen = {path: i for i, path in enumerate(dict.fromkeys(str(item.path) for item in items))}
    items.sort(key=lambda item: (-weight[str(item.path)], first_seen[str(item.path)]))


@pytest.fixture
def backend():
    import keras

    return keras.backend.backend()


@pytest.fixture
def one_torch_thread():
    """torch's multi-threaded CPU kernels stall tiny ops for tens of ms at random on a busy 2-core host
    (threads spinning for a core another process holds): one thread keeps the step time steady and
    leaves the other core to the loader's workers. Nothing on the other backends."""
    if BACKEND != "torch":
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _first_sample_awaited(monkeypatch):
    """A fit's first epoch end waits for GPUUtilizationLogger's first sample however loaded the machine.

    The callback waits at most a second (plus its interval) so as not to stall a user's training; a
    starved sampler thread on a busy test machine would then leave the first epoch without its keys.
    """
    monkeypatch.setattr("keras_gpu_tools.callbacks.gpu_utilization_logger.FIRST_SAMPLE_WAIT_S", 120.0)


@pytest.fixture(autouse=True)
def _collect_each_tests_garbage():
    """A test's garbage is collected when it ends, and what outlives it is frozen (``gc.freeze``).

    On TensorFlow, an iterator that a fit which raised left in a reference cycle would otherwise
    be freed later, inside whatever test runs then: its destructor waits for tf.data's autotune
    thread, whose sleep between optimisations doubles up to a minute as the iterator ages, so
    one such wait cost a later test minutes. Freezing what outlives a test (mostly the
    frameworks' own objects) keeps each collection to that test's objects: milliseconds, where
    a full collection of a process with a framework imported costs a quarter of a second
    (decision record 0007).
    """
    yield
    gc.collect()
    gc.freeze()
