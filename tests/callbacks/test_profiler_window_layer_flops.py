"""ProfilerWindow's FLOPs per Keras layer: real fits, the backend's own count grouped by layer, checked by hand."""

import json
import os
import sys

import keras
import numpy as np
import pytest

from keras_gpu_tools.backends import get as get_backend
from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import read_run
from keras_gpu_tools.profiling.layers import OUTSIDE, LayerRow, assign_flops, layer_tree
from tests.helpers.models import one_heavy_layer_model

pytestmark = [pytest.mark.multibackend, pytest.mark.usefixtures("one_torch_thread")]

BACKEND = keras.backend.backend()
BATCH, FEATURES, HEAVY = 64, 256, 4096
needs_profiler = pytest.mark.skipif(
    BACKEND == "jax" and sys.version_info < (3, 12), reason="Keras disables JAX profiling on Python < 3.12"
)


def data(steps=12):
    rng = np.random.default_rng(0)
    return rng.random((steps * BATCH, FEATURES), dtype=np.float32), rng.random((steps * BATCH, 1), dtype=np.float32)


def check_hand_counts(flops: dict[str, float], total: float) -> None:
    """The heavy layer's FLOPs by hand; a shared layer's both calls; the rows add up to the step's count."""
    # `heavy` reads the input: forward 2x and its weight gradient 2x; no backend computes an input gradient
    # nobody needs. `proj` (HEAVY -> 8) has all three: 6 x in x out x batch.
    assert flops["heavy"] == pytest.approx(4 * FEATURES * HEAVY * BATCH, rel=0.05)
    assert flops["proj"] == pytest.approx(6 * HEAVY * 8 * BATCH, rel=0.05)
    assert flops["shared"] == pytest.approx(2 * 6 * 8 * 8 * BATCH, rel=0.05)  # called twice: both calls
    assert flops["inner/small"] == pytest.approx(6 * 8 * 8 * BATCH, rel=0.05)  # the nested model's layer
    assert sum(flops.values()) == pytest.approx(total, rel=1e-9)


@needs_profiler
def test_flops_per_layer_match_the_hand_count_and_add_up_to_the_step(tmp_path):
    model = one_heavy_layer_model(FEATURES, HEAVY)
    cb = ProfilerWindow(log_dir=tmp_path, start_step=3, num_steps=6, verbose=0, analyze=False)
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    table = cb.layer_table()
    assert not table.error, table.error
    flops = {r.path: r.flops_per_step for r in table.rows}
    assert all(v is not None for v in flops.values()), table.text()
    check_hand_counts(flops, table.flops_per_step)
    assert flops.get(OUTSIDE, 0.0) < 0.05 * table.flops_per_step  # the loss and update: no matmul
    assert table.seconds is not None and table.seconds > 0  # timed; its goal is the benchmark layer_table_cost.py
    # The step's count (the MFU path's) is the rows' sum, within 5%.
    step, _ = get_backend(BACKEND).step_flops(model.train_function, _specs(model, x, y))
    assert table.flops_per_step == pytest.approx(step, rel=0.05)
    assert "FLOPs/step:" in table.text() and "| heavy | 1 |" in table.text()
    # TensorBoard's JSON carries them (what the report reads).
    run_dir = os.path.join(str(tmp_path), "profile")
    values = read_run("profile", run_dir, sorted(os.listdir(run_dir)), [])
    rec = json.loads(values.texts[schema.profile_layers(3, 9) + schema.DATA_SUFFIX][-1].text)
    assert {r["path"]: r["flops_per_step"] for r in rec["rows"]}["heavy"] == flops["heavy"]


def _specs(model, x, y):
    """What the step hook's records hand ``step_flops``, built from one batch (TensorFlow, JAX)."""
    backend = get_backend(BACKEND)
    if BACKEND == "tensorflow":
        return backend.shape_specs((x[:BATCH], y[:BATCH]))
    if BACKEND == "jax":
        import jax

        state = tuple(
            [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in group]
            for group in (
                model.trainable_variables,
                model.non_trainable_variables,
                model.optimizer.variables,
                model.metrics_variables,
            )
        )
        return state, (jax.ShapeDtypeStruct((BATCH, FEATURES), "float32"), jax.ShapeDtypeStruct((BATCH, 1), "float32"))
    from keras_gpu_tools.backends.torch.flops import CountedFlops, counted

    _, total = counted(lambda: model.train_on_batch(x[:BATCH], y[:BATCH]))
    return CountedFlops(total)


@pytest.mark.skipif(BACKEND != "jax", reason="the jaxpr's name stacks (JAX's profiler is off on Python < 3.12)")
def test_jax_counts_each_layer_from_the_jaxpr_name_stacks():
    model = one_heavy_layer_model(FEATURES, HEAVY)
    x, y = data(2)
    model.fit(x, y, batch_size=BATCH, verbose=0)
    backend, specs = get_backend("jax"), _specs(model, x, y)
    named, source = backend.layer_flops(model.train_function, specs)
    assert named and "jaxpr" in source
    assert any(name.startswith("transpose(jvp(") for name, _ in named)  # backward ops carry their layer
    rows: list[LayerRow] = []
    total = assign_flops(rows, named, layer_tree(model))
    flops = {r.path: r.flops_per_step for r in rows}
    check_hand_counts(flops, total)
    step, _ = backend.step_flops(model.train_function, specs)  # XLA's cost analysis: elementwise work too
    assert total == pytest.approx(step, rel=0.05)


@needs_profiler
@pytest.mark.skipif(BACKEND != "tensorflow", reason="a step run eagerly: TensorFlow")
def test_an_eager_step_has_no_flops_and_says_why(tmp_path):
    model = one_heavy_layer_model(FEATURES, 256)
    model.compile(keras.optimizers.Adam(1e-3), "mse", run_eagerly=True)
    cb = ProfilerWindow(log_dir=tmp_path, start_step=3, num_steps=4, verbose=0, analyze=False)
    x, y = data(8)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    table = cb.layer_table()
    assert all(r.flops_per_step is None for r in table.rows)
    assert table.text().count("FLOPs per layer: none (") == 1 and "eagerly" in table.text()
