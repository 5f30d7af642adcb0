"""The contract every public callback of the package keeps.

Every name in ``keras_gpu_tools.callbacks.__all__``:

- is constructible with its defaults (only ``log_dir`` pointed into ``tmp_path``);
- takes two ``fit()`` calls in a row with the same instance;
- cleans up after a ``fit()`` that raised: no thread named ``keras_gpu_tools*``
  left alive once the session noticed, and ``model.train_function`` is Keras's own
  again (not marked with ``_keras_gpu_tools_step_hook``);
- works on a machine without a GPU (with a warning where relevant).

A callback that cannot be imported fails here; it is never skipped. Each callback
runs the contract twice: with its defaults, and with the arguments in ``ACTIVE``
that make it do its work within this test's few short steps.
"""

import importlib
import inspect
import os
import re
import threading
import warnings

import keras
import numpy as np
import pytest

from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_live import wait_until

pytestmark = pytest.mark.multibackend

MODULES = {
    "GPUUtilizationLogger": "keras_gpu_tools.callbacks.gpu_utilization_logger",
    "InputBoundDetector": "keras_gpu_tools.callbacks.input_bound_detector",
    "LiveView": "keras_gpu_tools.callbacks.live_view",
    "MemoryLeakDetector": "keras_gpu_tools.callbacks.memory_leak_detector",
    "MixedPrecisionCheck": "keras_gpu_tools.callbacks.mixed_precision_check",
    "OOMBatchSizeReducer": "keras_gpu_tools.callbacks.oom_batch_size_reducer",
    "ProfilerWindow": "keras_gpu_tools.callbacks.profiler_window",
}

# Arguments that make the callback do its work within a fit() of 8 steps per epoch.
ACTIVE = {
    "GPUUtilizationLogger": {"interval": 0.02},
    "InputBoundDetector": {"window": 4, "sample_every": 2, "verbose": 0},
    # Outside a notebook LiveView is off by default; with a display it redraws.
    "LiveView": {"interval": 0.01, "enabled": True, "display": lambda html: None},
    "ProfilerWindow": {"start_step": 2, "num_steps": 2, "verbose": 0},
    # No warm-up and a tiny threshold: a growth rate (and maybe a heap count) from the third epoch on.
    "MemoryLeakDetector": {"warmup_epochs": 0, "min_growth_mib": 1e-6, "verbose": 2},
}

CASES = [pytest.param(name, "defaults", id=f"{name}-defaults") for name in MODULES] + [
    pytest.param(name, "active", id=f"{name}-active") for name in ACTIVE
]


def callback_class(name):
    """The class, imported from its module; any import problem fails the test."""
    try:
        module = importlib.import_module(MODULES[name])
    except Exception as e:
        pytest.fail(f"{MODULES[name]} cannot be imported: {type(e).__name__}: {e}")
    cls = getattr(module, name, None)
    if cls is None:
        pytest.fail(f"{MODULES[name]} has no {name}")
    return cls


def make(name, variant, tmp_path):
    cls = callback_class(name)
    kwargs = dict(ACTIVE[name]) if variant == "active" else {}
    if "log_dir" in inspect.signature(cls).parameters:
        kwargs["log_dir"] = str(tmp_path / "logs")
    return cls(**kwargs)


def model_and_data():
    return tiny_dense_model(features=4, hidden=8), *regression_data(64, features=4)


def leftovers(model):
    threads = [t.name for t in threading.enumerate() if t.name.startswith("keras_gpu_tools") and t.is_alive()]
    wrapped = hasattr(model.train_function, "_keras_gpu_tools_step_hook") if model.train_function else False
    return threads, wrapped


class Boom(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("boom")


def test_every_public_callback_is_covered():
    import keras_gpu_tools
    import keras_gpu_tools.callbacks as callbacks

    assert sorted(callbacks.__all__) == sorted(MODULES), "add the new callback to MODULES (and ACTIVE) here"
    for name in callbacks.__all__:
        cls = getattr(callbacks, name)
        assert cls is callback_class(name), f"keras_gpu_tools.callbacks.{name} is not {MODULES[name]}.{name}"
        assert issubclass(cls, keras.callbacks.Callback), name
        assert getattr(keras_gpu_tools, name, cls) is cls, f"keras_gpu_tools.{name} is another object"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_constructible_with_defaults(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cls = callback_class(name)
    required = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert required == [], f"{name} needs arguments: {required}"
    assert isinstance(cls(), keras.callbacks.Callback)


@pytest.mark.parametrize("name, variant", CASES)
def test_contract(name, variant, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if name == "LiveView":  # fit()'s end waits for its last picture, however late the session's thread draws it
        monkeypatch.setattr(importlib.import_module(MODULES[name]), "FINAL_WAIT_S", 30.0)
    cb = make(name, variant, tmp_path)
    model, x, y = model_and_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: warnings are expected and tested elsewhere
        h1 = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        h2 = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        assert len(h1.history["loss"]) == 2 and len(h2.history["loss"]) == 1
        assert leftovers(model) == ([], False)
        with pytest.raises(RuntimeError, match="boom"):
            model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb, Boom()])
        # The session's watchdog notices the end of the fit (at once when the test passes).
        assert wait_until(lambda: leftovers(model) == ([], False)), "left behind after a fit() that raised"
        if hasattr(cb, "close"):
            cb.close()
        h3 = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert len(h3.history["loss"]) == 1
    assert leftovers(model) == ([], False)
    if name == "LiveView" and variant == "active":
        # At least the final picture of each of the three fits that ended normally.
        assert cb.redraws >= 3, "LiveView with a display missed a fit's last picture"


# -- arguments are checked at construction, with Keras-style messages ------------------------------
def _classes():
    from keras_gpu_tools import (
        GPUUtilizationLogger,
        InputBoundDetector,
        LiveView,
        MemoryLeakDetector,
        MixedPrecisionCheck,
        OOMBatchSizeReducer,
        ProfilerWindow,
    )

    return {
        "GPUUtilizationLogger": GPUUtilizationLogger,
        "InputBoundDetector": InputBoundDetector,
        "LiveView": LiveView,
        "MemoryLeakDetector": MemoryLeakDetector,
        "MixedPrecisionCheck": MixedPrecisionCheck,
        "OOMBatchSizeReducer": OOMBatchSizeReducer,
        "ProfilerWindow": ProfilerWindow,
    }


BOOLEAN_ARGUMENTS = [
    ("GPUUtilizationLogger", "pcie"),
    ("GPUUtilizationLogger", "gpm"),
    ("GPUUtilizationLogger", "epoch_logs"),
    ("InputBoundDetector", "epoch_logs"),
    ("MemoryLeakDetector", "epoch_logs"),
    ("MemoryLeakDetector", "count_tensors"),
    ("ProfilerWindow", "python_tracer"),
    ("ProfilerWindow", "device_tracer"),
    ("ProfilerWindow", "analyze"),
    ("OOMBatchSizeReducer", "probe"),
    ("LiveView", "enabled"),  # True, False or "auto"
]
# callback -> its default run name: log_dir/<run_name> is its TensorBoard run.
RUN_NAMES = {
    "GPUUtilizationLogger": "gpu",
    "InputBoundDetector": "input",
    "ProfilerWindow": "profile",
    "OOMBatchSizeReducer": "oom",
    "MemoryLeakDetector": "memory",
}


def _construct(name, tmp_path, **kwargs):
    cls = _classes()[name]
    if "log_dir" in cls.__init__.__code__.co_varnames:
        kwargs.setdefault("log_dir", str(tmp_path))
    return cls(**kwargs)


@pytest.mark.parametrize("name, argument", BOOLEAN_ARGUMENTS, ids=[f"{c}-{a}" for c, a in BOOLEAN_ARGUMENTS])
@pytest.mark.parametrize("bad", ["abc", 1, None])
def test_boolean_arguments_take_only_bools(name, argument, bad, tmp_path):
    error = ValueError if argument in ("enabled", "probe") else TypeError  # each a choice of three
    with pytest.raises(error, match=re.escape(f"argument `{argument}`. Received: {argument}={bad!r}")):
        _construct(name, tmp_path, **{argument: bad})
    cb = _construct(name, tmp_path, **{argument: np.bool_(False)})
    assert getattr(cb, argument, False) is False or argument in ("python_tracer", "device_tracer")


@pytest.mark.parametrize("name", sorted(RUN_NAMES))
@pytest.mark.parametrize("bad", [".", "..", "a\0b", "a" + os.sep + "b", "", " gpu", 3])
def test_run_name_must_be_a_plain_directory_name(name, bad, tmp_path):
    error = TypeError if not isinstance(bad, str) else ValueError
    with pytest.raises(error, match=re.escape(f"argument `run_name`. Received: run_name={bad!r}")):
        _construct(name, tmp_path, run_name=bad)


@pytest.mark.parametrize("name", sorted(RUN_NAMES))
def test_a_file_where_the_run_directory_goes_is_rejected_at_construction(name, tmp_path):
    run = RUN_NAMES[name]
    (tmp_path / run).write_text("not a directory")
    expected = re.escape(f"log_dir={str(tmp_path)!r}, run_name={run!r}") + ".*" + re.escape(str(tmp_path / run))
    with pytest.raises(ValueError, match=r"arguments `log_dir` and `run_name`.*" + expected):
        _construct(name, tmp_path)
    # Named explicitly, too; and a directory there is fine.
    (tmp_path / "mine").write_text("x")
    with pytest.raises(ValueError, match="run_name='mine'"):
        _construct(name, tmp_path, run_name="mine")
    (tmp_path / "ok").mkdir()
    _construct(name, tmp_path, run_name="ok")


@pytest.mark.parametrize("name", sorted(RUN_NAMES))
def test_bytes_log_dir_is_a_clear_type_error(name, tmp_path):
    bad = os.fsencode(str(tmp_path))
    with pytest.raises(TypeError, match=re.escape(f"argument `log_dir`. Received: log_dir={bad!r}") + ".*bytes"):
        _construct(name, tmp_path, log_dir=bad)


@pytest.mark.parametrize("name", ["ProfilerWindow", "OOMBatchSizeReducer", "InputBoundDetector", "MemoryLeakDetector"])
@pytest.mark.parametrize("bad", ["loud", 3, -1, None, 1.5])
def test_verbose_is_checked(name, bad, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"argument `verbose`. Received: verbose={bad!r}")):
        _construct(name, tmp_path, verbose=bad)


@pytest.mark.parametrize("name", ["ProfilerWindow", "OOMBatchSizeReducer", "InputBoundDetector", "MemoryLeakDetector"])
def test_verbose_levels_like_keras(name, tmp_path):
    assert [_construct(name, tmp_path, verbose=x).verbose for x in (0, 1, 2, True, False)] == [0, 1, 2, 1, 0]


@pytest.mark.parametrize(
    "name", ["GPUUtilizationLogger", "InputBoundDetector", "OOMBatchSizeReducer", "MemoryLeakDetector"]
)
def test_progress_bar_is_checked_and_alike_in_every_callback_with_epoch_figures(name, tmp_path):
    assert [_construct(name, tmp_path, progress_bar=x).progress_bar for x in ("brief", "all", "none")] == [
        "brief",
        "all",
        "none",
    ]
    assert _construct(name, tmp_path).progress_bar == "none"  # the bar as wide as plain Keras's
    for bad in ("full", True, None, 1):
        expected = "Expected one of 'brief', 'all', 'none'"
        with pytest.raises(ValueError, match=re.escape(f"argument `progress_bar`. Received: progress_bar={bad!r}")):
            _construct(name, tmp_path, progress_bar=bad)
        with pytest.raises(ValueError, match=re.escape(expected)):
            _construct(name, tmp_path, progress_bar=bad)


@pytest.mark.parametrize("bad", [float("inf"), 1e30, float("nan"), 3601])
def test_gpu_logger_interval_must_be_finite_and_bounded(bad, tmp_path):
    pattern = re.escape(f"argument `interval`. Received: interval={bad!r}. Expected a finite number of seconds > 0")
    with pytest.raises(ValueError, match=pattern):
        _construct("GPUUtilizationLogger", tmp_path, interval=bad)
    assert _construct("GPUUtilizationLogger", tmp_path, interval=3600).interval == 3600.0


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_live_view_interval_must_be_finite(bad, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"argument `interval`. Received: interval={bad!r}")):
        _construct("LiveView", tmp_path, interval=bad)


@pytest.mark.parametrize("bad", [5, "ab", (1, 2)])
def test_profiler_windows_not_a_list_of_pairs(bad, tmp_path):
    error = TypeError if not isinstance(bad, tuple) else ValueError
    with pytest.raises(error, match=re.escape(f"argument `windows`. Received: windows={bad!r}")):
        _construct("ProfilerWindow", tmp_path, windows=bad)


@pytest.mark.parametrize("argument", ["flops_per_step", "peak_flops"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0, "1e12"])
def test_detector_flops_must_be_finite_and_positive(argument, bad, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"argument `{argument}`. Received: {argument}={bad!r}")):
        _construct("InputBoundDetector", tmp_path, **{argument: bad})
