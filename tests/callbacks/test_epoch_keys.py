"""Every key of ours is in every epoch's logs from the first, NaN until measured: History, CSVLogger and the
user's callbacks see one value per epoch, as for Keras's own metrics.

Real fits of a tiny model on the CPU, a real ``keras.callbacks.CSVLogger`` file read back.
"""

import csv
import math
import warnings

import keras
import pytest

from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, MemoryLeakDetector, OOMBatchSizeReducer
from keras_gpu_tools.logdir import schema
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model

OURS = schema.OWN_PREFIXES


def ours(keys) -> set:
    return {k for k in keys if k.startswith(OURS)}


class SeenKeys(keras.callbacks.Callback):
    """A user's callback after ours: the keys and values each epoch end gives it."""

    def __init__(self):
        super().__init__()
        self.epochs: list[dict] = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs or {}))


class StopAfterFirstEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


def callbacks():
    return [
        GPUUtilizationLogger(log_dir=None, interval=0.02),
        InputBoundDetector(log_dir=None, window=4, sample_every=2, verbose=0),
        OOMBatchSizeReducer(log_dir=None, verbose=0),
        MemoryLeakDetector(log_dir=None, verbose=0),
    ]


def fit(extra, epochs):
    x, y = regression_data(64, features=4)
    model = tiny_dense_model(features=4, hidden=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: the callbacks say so once
        return model.fit(
            x, y, batch_size=8, epochs=epochs, validation_split=0.25, verbose=0, callbacks=[*callbacks(), *extra]
        )


@pytest.mark.multibackend
def test_history_csvlogger_and_a_later_callback_get_every_key_of_ours_at_every_epoch(tmp_path):
    path, seen, epochs = tmp_path / "log.csv", SeenKeys(), 5
    history = fit([keras.callbacks.CSVLogger(str(path)), seen], epochs)
    keys = ours(history.history)
    # The memory detector's growth rate is claimed from the 4th epoch (3 after the warm-up): NaN before.
    assert {schema.MEMORY_HOST_GROWTH, schema.INPUT_WAIT_FRACTION, schema.OOM_MICRO_BATCHES} <= keys
    assert {k: len(v) for k, v in history.history.items() if len(v) != epochs} == {}
    try:
        import pandas  # not a dependency: where it is installed, History builds a table
    except ImportError:
        pass
    else:
        assert pandas.DataFrame(history.history).shape[0] == epochs
    growth = history.history[schema.MEMORY_HOST_GROWTH]
    assert all(math.isnan(v) for v in growth[:3]) and not math.isnan(growth[-1])
    # A user's callback placed after ours sees every key from the first epoch (NaN, not a missing key).
    assert [ours(logs) for logs in seen.epochs] == [keys] * epochs
    assert math.isnan(seen.epochs[0][schema.MEMORY_HOST_GROWTH])
    # CSVLogger fixes its columns at the first epoch: every key of ours is one, and one row per epoch.
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == epochs and keys <= set(rows[0])
    assert rows[0][schema.MEMORY_HOST_GROWTH] == "nan" and float(rows[-1][schema.MEMORY_HOST_GROWTH]) == growth[-1]


def test_keys_this_fit_can_never_log_are_left_out():
    history = fit([], epochs=3)  # 2 epochs after the warm-up: no growth rate can be claimed
    assert schema.MEMORY_HOST_GROWTH not in history.history and schema.MEMORY_DEVICE_GROWTH not in history.history
    if not MemoryLeakDetector().backend.gpu_devices():  # no device memory, no GPU keys on a CPU
        assert schema.MEMORY_DEVICE_IN_USE_MIB not in history.history
        assert not [k for k in history.history if k.startswith(schema.GPU_PREFIX)]


@pytest.mark.parametrize("stop", ["first epoch", "early stopping"])
def test_a_fit_stopped_early_keeps_the_lists_equal(stop):
    if stop == "first epoch":
        extra, ran = [StopAfterFirstEpoch()], 1
    else:  # no epoch improves by min_delta: EarlyStopping stops at the second epoch (its earliest)
        extra, ran = [keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=0)], 2
    history = fit(extra, epochs=8)
    assert schema.MEMORY_HOST_GROWTH in history.history  # planned for 8 epochs: NaN in both
    assert {k: len(v) for k, v in history.history.items() if len(v) != ran} == {}


def test_a_fit_of_no_epochs_logs_nothing():
    history = fit([], epochs=0)
    assert {k: len(v) for k, v in history.history.items() if v} == {}


def test_an_epoch_end_fills_the_keys_once_and_tells_the_bar_only_what_changed(monkeypatch):
    from keras_gpu_tools.callbacks._base import FitCallback
    from keras_gpu_tools.runtime.fit_output import FitOutput

    fills: list[int] = []
    told: list[frozenset] = []
    real_fill, real_figures = FitCallback._fill_epoch_logs, FitOutput.figures

    def fill(self, logs):
        fills.append(id(self))
        real_fill(self, logs)

    def figures(self, keys, *args, **kwargs):
        told.append(frozenset(keys))
        real_figures(self, keys, *args, **kwargs)

    monkeypatch.setattr(FitCallback, "_fill_epoch_logs", fill)
    monkeypatch.setattr(FitOutput, "figures", figures)
    cbs, seen = callbacks(), SeenKeys()
    x, y = regression_data(64, features=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here
        tiny_dense_model(features=8).fit(x, y, batch_size=16, epochs=6, verbose=0, callbacks=[*cbs, seen])

    planned = [cb for cb in cbs if cb._epoch_keys]  # the callbacks that log keys here
    assert len(fills) == 6 * len(cbs)  # once per callback and epoch end
    assert len(told) <= 2 * len(planned), told  # the key set at the first epoch end, again only if it grew
    assert all(ours(e) == ours(seen.epochs[0]) for e in seen.epochs)  # every key at every epoch, as before
