"""The contract every callback of the package keeps (STYLE.md).

Constructible with defaults (log directories aside); two fit() calls in a row
with the same instance; no thread, wrapper or profiler left behind after a fit
that raised; works on a machine without a GPU (with a warning where relevant).
"""

import importlib
import threading
import time
import warnings

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.multibackend

CALLBACKS = [
    ("keras_gpu_tools.callbacks.gpu_utilization_logger", "GPUUtilizationLogger", {"interval": 0.02}),
    ("keras_gpu_tools.callbacks.mixed_precision_check", "MixedPrecisionCheck", {}),
    ("keras_gpu_tools.callbacks.profiler_window", "ProfilerWindow", {"start_step": 2, "num_steps": 2, "verbose": 0}),
    ("keras_gpu_tools.callbacks.input_bound_detector", "InputBoundDetector", {}),
    ("keras_gpu_tools.callbacks.oom_batch_size_reducer", "OOMBatchSizeReducer", {}),
]


def make(module, name, kwargs, tmp_path):
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        pytest.skip(f"{name} is not in this tree")
    kwargs = dict(kwargs)
    if "log_dir" in cls.__init__.__code__.co_varnames:
        kwargs["log_dir"] = str(tmp_path / "logs")
    return cls(**kwargs)


def model_and_data():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    return model, rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


def leftovers(model):
    threads = [t.name for t in threading.enumerate() if t.name.startswith("keras_gpu_tools") and t.is_alive()]
    wrapped = hasattr(model.train_function, "_keras_gpu_tools_step_hook") if model.train_function else False
    return threads, wrapped


class Boom(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("boom")


@pytest.mark.parametrize("module, name, kwargs", CALLBACKS, ids=[c[1] for c in CALLBACKS])
def test_contract(module, name, kwargs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cb = make(module, name, kwargs, tmp_path)
    model, x, y = model_and_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: warnings are expected and tested elsewhere
        h1 = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        h2 = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        assert len(h1.history["loss"]) == 2 and len(h2.history["loss"]) == 1
        assert leftovers(model) == ([], False)
        with pytest.raises(RuntimeError, match="boom"):
            model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb, Boom()])
        deadline = time.monotonic() + 3
        while leftovers(model) != ([], False) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert leftovers(model) == ([], False)
        if hasattr(cb, "close"):
            cb.close()
        h3 = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert len(h3.history["loss"]) == 1
    assert leftovers(model) == ([], False)
