"""ProfilerWindow's time per Keras layer: real fits, real traces, the table read back from TensorBoard and the report."""

import glob
import json
import os
import sys

import keras
import numpy as np
import pytest

from keras_gpu_tools import report
from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
from keras_gpu_tools.errors import ProfilerWarning
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import read_event_file, read_run
from keras_gpu_tools.profiling.layers import OUTSIDE
from tests.helpers.callbacks import InterruptAt
from tests.helpers.models import one_heavy_layer_model

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("one_torch_thread")]

BACKEND = keras.backend.backend()
JAX_UNAVAILABLE = BACKEND == "jax" and sys.version_info < (3, 12)
needs_profiler = pytest.mark.skipif(JAX_UNAVAILABLE, reason="Keras disables JAX profiling on Python < 3.12")
LAYERS = {"heavy", "proj", "shared", "inner/small", "head"}


def fit(model, cb, steps=12, batch=64, features=256, callbacks_extra=(), **kw):
    rng = np.random.default_rng(0)
    x = rng.random((steps * batch, features), dtype=np.float32)
    y = rng.random((steps * batch, 1), dtype=np.float32)
    callbacks = [cb, *callbacks_extra]
    return model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks, **kw)


def window(tmp_path, **kw):
    return ProfilerWindow(log_dir=tmp_path, start_step=3, num_steps=6, verbose=0, analyze=False, **kw)


def layer_rows(table):
    return {r.path: r for r in table.rows}


def check_heavy_first(table):
    """The layer holding ~99% of the FLOPs comes first by its exact FLOPs; the measured times are well formed.

    Which layer takes longest on this machine, under its load, is left to the benchmark: the FLOPs are exact.
    """
    assert not table.error, table.error
    rows = layer_rows(table)
    assert LAYERS <= set(rows), sorted(rows)
    check_heavy_has_the_flops(table)
    assert rows["heavy"].forward_ms > 0 and rows["heavy"].backward_ms > 0  # forward and backward together
    check_times_well_formed(table)


def check_heavy_has_the_flops(table):
    """``heavy`` first by FLOPs per step among the layers, with most of them."""
    in_layers = [r for r in table.rows if r.path != OUTSIDE and r.flops_per_step is not None]
    assert in_layers and "heavy" in {r.path for r in in_layers}, table.text()
    by_flops = sorted(in_layers, key=lambda r: r.flops_per_step, reverse=True)
    assert by_flops[0].path == "heavy", table.text()
    assert by_flops[0].flops_per_step > 0.5 * sum(r.flops_per_step for r in in_layers), table.text()


def check_times_well_formed(table):
    """Every row's time is >= 0, the shares add up to 1, the rows come by time, largest first."""
    assert all(r.ms_per_step >= 0 for r in table.rows), table.text()
    assert sum(r.share for r in table.rows) == pytest.approx(1.0)
    assert [r.ms_per_step for r in table.rows] == sorted((r.ms_per_step for r in table.rows), reverse=True)


@needs_profiler
def test_the_layer_with_the_flops_comes_first_and_a_shared_layer_is_one_row(tmp_path):
    model = one_heavy_layer_model()
    cb = window(tmp_path)
    fit(model, cb)
    table = cb.layer_table()
    check_heavy_first(table)
    rows = layer_rows(table)
    assert rows["shared"].calls == 2  # called twice: one row
    assert rows["heavy"].calls == 1 and rows["inner/small"].calls == 1  # the nested model's layer, by its path
    assert (table.start_step, table.num_steps) == (3, 6)
    assert table.seconds is not None and table.seconds > 0  # timed; its goal is the benchmark layer_table_cost.py
    assert all("call" not in vars(layer) for layer in model._flatten_layers())  # torch's ranges taken off


@needs_profiler
def test_peak_memory_per_layer_only_where_the_backend_measures_it(tmp_path):
    cb = window(tmp_path)
    fit(one_heavy_layer_model(), cb)
    table = cb.layer_table()
    rows = layer_rows(table)
    if BACKEND != "torch":  # TensorFlow's and JAX's traces book no memory to a layer: no figure, no column
        assert all(r.peak_activation_bytes is None for r in rows.values())
        assert "peak MiB" not in table.text()
        return
    assert rows["heavy"].peak_activation_bytes >= 64 * 4096 * 4  # at least its float32 output, batch 64
    assert rows[OUTSIDE].peak_activation_bytes is None  # no range: no figure
    assert all(rows[p].peak_activation_bytes is not None for p in LAYERS)
    assert "peak MiB" in table.text()


@needs_profiler
@pytest.mark.skipif(BACKEND != "tensorflow", reason="jit_compile=False on TensorFlow: ops run one by one")
def test_tensorflow_without_xla(tmp_path):
    model = one_heavy_layer_model()
    model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=False)
    cb = window(tmp_path)
    fit(model, cb)
    check_heavy_first(cb.layer_table())
    assert layer_rows(cb.layer_table())["shared"].calls == 2


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile")
def test_a_compiled_torch_step_gets_no_table_and_says_why(tmp_path, monkeypatch):
    if BACKEND == "torch":  # torch.compile's graph capture as in a user's fit, without inductor's 40 s C++ build
        import functools

        import torch

        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    # One layer: dynamo traces each layer's frames, a few seconds each; the refusal does not hang on the layers
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1, name="head")], name="net")
    model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=True)
    cb = window(tmp_path)
    fit(model, cb)
    table = cb.layer_table()
    assert not table.rows and "jit_compile=True" in table.error and "recompile" in table.error
    assert all("call" not in vars(layer) for layer in model._flatten_layers())  # the compiled step untouched


class CustomStep(keras.Model):
    """A subclassed model with its own train_step (a plain gradient step, the loss by hand)."""

    def __init__(self):
        super().__init__(name="custom")
        self.heavy = keras.layers.Dense(4096, activation="relu", name="heavy")
        self.head = keras.layers.Dense(1, name="head")

    def call(self, x):
        return self.head(self.heavy(x))

    def train_step(self, data):
        x, y = data
        if BACKEND == "jax":  # JAX's train_step is stateless: beyond this test's scope
            raise NotImplementedError
        if BACKEND == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = keras.ops.mean((self(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, self.trainable_variables)
        else:
            self.zero_grad()
            loss = keras.ops.mean((self(x, training=True) - y) ** 2)
            loss.backward()
            grads = [v.value.grad for v in self.trainable_variables]
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


@needs_profiler
@pytest.mark.skipif(BACKEND == "jax", reason="a stateful custom train_step: TensorFlow and torch")
def test_a_custom_train_step(tmp_path):
    keras.utils.set_random_seed(0)
    model = CustomStep()
    model.compile(keras.optimizers.SGD(1e-3))
    cb = window(tmp_path)
    fit(model, cb)
    table = cb.layer_table()
    rows = layer_rows(table)
    assert {"heavy", "head"} <= set(rows)
    check_heavy_has_the_flops(table)
    check_times_well_formed(table)


@needs_profiler
def test_the_table_reaches_tensorboard_and_the_report(tmp_path):
    cb = window(tmp_path)
    fit(one_heavy_layer_model(), cb)
    table = cb.layer_table()
    run_dir = os.path.join(str(tmp_path), "profile")
    values = read_run("profile", run_dir, sorted(os.listdir(run_dir)), [])
    tag = schema.profile_layers(3, 9)
    text = values.texts[tag][-1].text
    assert "| heavy | 1 |" in text and "| shared | 2 |" in text
    rec = json.loads(values.texts[tag + schema.DATA_SUFFIX][-1].text)
    assert [r["path"] for r in rec["rows"]] == [r.path for r in table.rows]
    images = [
        v.tag
        for f in glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
        for ev in read_event_file(f)[0]
        for v in ev.summary.value
        if v.HasField("image")
    ]
    if _has_matplotlib():
        assert tag + schema.LAYERS_CHART_SUFFIX in images
    for r in (report(log_dir=str(tmp_path)), report(cb)):  # from the log dir and from the callback
        out = str(r)
        assert "Time per layer (steps 4-9)" in out
        heavy = next(line for line in out.splitlines() if line.strip().startswith("heavy "))
        assert "%" in heavy
        assert "shared" in out and "x2" in out
        assert "Time per layer (steps 4-9)" in r.html()


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401

        return True
    except ImportError:
        return False


@needs_profiler
def test_a_fit_that_raises_in_a_window_leaves_the_layers_as_they_were_and_a_table_of_its_steps(tmp_path):
    model = one_heavy_layer_model()
    cb = ProfilerWindow(log_dir=tmp_path, start_step=2, num_steps=50, verbose=0, analyze=False)
    with pytest.raises(KeyboardInterrupt):
        fit(model, cb, steps=12, callbacks_extra=[InterruptAt(5)])
    fit(model, keras.callbacks.Callback(), steps=2)  # torch: the next step on the training thread stops it
    assert all("call" not in vars(layer) for layer in model._flatten_layers())
    table = cb.layer_table()
    assert cb.captures[0].reason == "cut short" and (table.start_step, table.num_steps) == (2, 4)
    assert table.rows and not table.error


@needs_profiler
def test_layers_off_builds_no_table(tmp_path):
    cb = window(tmp_path, layers=False)
    fit(one_heavy_layer_model(), cb)
    assert cb.layer_table() is None and len(cb.captures) == 1


@pytest.mark.skipif(not JAX_UNAVAILABLE, reason="JAX below Python 3.12: no profiler")
def test_no_profiler_is_said_once_and_gives_no_table(tmp_path):
    cb = window(tmp_path)
    model = one_heavy_layer_model()
    with pytest.warns(ProfilerWarning, match="unavailable on Python < 3.12") as caught:
        fit(model, cb)
        fit(model, cb)
    assert len([w for w in caught if issubclass(w.category, ProfilerWarning)]) == 1
    assert cb.layer_table() is None
