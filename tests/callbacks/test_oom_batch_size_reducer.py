"""OOMBatchSizeReducer end to end, with real out-of-memory errors on CPU.

The model has a memory cliff (`tests.helpers.models.MemoryCliff`): above `limit` samples
per step one of its layers materialises a tensor of at least 1 TiB per sample,
which the backend's own CPU allocator refuses (on TensorFlow at once: the
test session's allocator, `tests/conftest.py`).

Every test counts the samples each step trained on with a non-trainable
counter in the model (`SeenCounter`), which also checks that a failed attempt's
state updates are undone.
"""

import glob
import os
import re
import traceback
import warnings

import keras
import numpy as np
import pytest
from keras import ops

from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
from keras_gpu_tools.errors import OOMWarning
from keras_gpu_tools.memory.idle import IdlePath
from tests.helpers.data import numbered_samples
from tests.helpers.models import (
    BACKEND,
    HUGE_COLS,
    MemoryCliff,
    SeenCounter,
    held_activations_model,
    real_oom,
)

pytestmark = pytest.mark.multibackend


class Boom(keras.layers.Layer):
    armed = False  # armed once the model is built

    def call(self, x):
        if Boom.armed:
            raise ValueError("boom from inside the step")
        return x


def make_model(num_samples, limit, opt="adam", batchnorm=False, seed=1, boom=False, loss_scale=None, **compile_kw):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((4,))
    h = SeenCounter(num_samples, dtype="float32")(inp)  # counts stay exact under mixed precision
    h = MemoryCliff(limit)(h)
    if boom:
        h = Boom()(h)
    h = keras.layers.Dense(8, activation="tanh")(h)
    if batchnorm:
        h = keras.layers.BatchNormalization()(h)
    out = keras.layers.Dense(1, dtype="float32")(h)
    model = keras.Model(inp, out)
    if opt == "adam":
        optimizer = keras.optimizers.Adam(0.01)
    else:
        optimizer = keras.optimizers.SGD(
            0.05, momentum=0.9, **({"gradient_accumulation_steps": opt} if isinstance(opt, int) else {})
        )
    if loss_scale is not None:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=loss_scale)
    model.compile(optimizer, "mse", metrics=["mae"], **compile_kw)
    return model


def seen(model):
    return ops.convert_to_numpy(model.layers[1].seen)


def iterations(model):
    return int(ops.convert_to_numpy(model.optimizer.iterations))


def weights(model):
    return [w for w, v in zip(model.get_weights(), model.weights) if "seen" not in v.path]


def assert_close(a, b, atol=2e-5):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=atol, rtol=1e-4)


def restored(model):
    return not hasattr(model.train_function, "_keras_gpu_tools_step_hook") if model.train_function else True


# -- real out-of-memory errors ------------------------------------------------------
@real_oom
def test_recovers_keeps_every_sample_once_and_the_unsplit_optimisation():
    n, batch, epochs = 48, 16, 2
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    reference = make_model(n, limit=10**9)  # same seed: same initial weights
    reducer = OOMBatchSizeReducer()
    history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[reducer])

    # batch 16 ran out of memory, then 2 x 8 did; 4 x 4 fits.
    assert [(e.batch_size, e.failed_split, e.next_split) for e in reducer.events] == [(16, 1, 2), (16, 2, 4)]
    assert reducer.micro_batches == 4 and reducer.micro_batch_size == 4
    assert history.history["oom/events"] == [2.0, 0.0]
    assert history.history["oom/micro_batches"] == [4.0, 4.0]
    np.testing.assert_array_equal(seen(model), np.full(n, epochs))  # every sample once per epoch
    assert iterations(model) == epochs * n // batch  # one optimizer update per original batch

    ref_history = reference.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    assert_close(weights(model), weights(reference))
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["mae"], ref_history.history["mae"], rtol=1e-5)
    assert restored(model)


@real_oom
def test_weights_match_keras_gradient_accumulation_at_the_working_split():
    n, batch = 48, 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=4, opt="sgd")
    reference = make_model(n, limit=10**9, opt=4)  # SGD with gradient_accumulation_steps=4
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[OOMBatchSizeReducer()])
    reference.fit(x, y, batch_size=batch // 4, epochs=1, shuffle=False, verbose=0)
    assert_close(weights(model), weights(reference))
    np.testing.assert_array_equal(seen(model), np.ones(n))


@real_oom
def test_last_smaller_batch_and_split_mode():
    n, batch = 40, 16  # batches of 16, 16, 8
    x, y = numbered_samples(n)
    model = make_model(n, limit=8)
    reducer = OOMBatchSizeReducer(mode="split")
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == 5  # split mode: 2 + 2 + 1 separate steps of 8
    assert len(reducer.events) == 1


@real_oom
def test_always_oom_ends_with_a_clear_error_of_the_backend_type():
    n = 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=0)
    reducer = OOMBatchSizeReducer(min_batch_size=4)
    with pytest.raises(Exception) as info:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[reducer])
    err = info.value
    message = str(err)
    assert "Batch sizes tried: 16, 16 as 2 x 8, 16 as 4 x 4" in message
    assert "min_batch_size=4" in message and "mixed precision" in message and "rematerialisation" in message
    from keras_gpu_tools.backends import is_oom

    original = err.oom_original  # the allocator's own error of the last attempt
    assert is_oom(original) and type(err) is type(original)
    assert is_oom(err)
    np.testing.assert_array_equal(seen(model), np.zeros(n))  # nothing half-trained
    assert iterations(model) == 0
    assert restored(model)


@real_oom
def test_min_batch_size_above_the_batch_says_only_the_whole_batch_was_tried():
    n = 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=0)
    with pytest.raises(Exception) as info:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer(min_batch_size=32)])
    message = str(info.value)
    first = message.splitlines()[0]
    assert "micro-batches of 32" not in message, first  # never tried
    assert "out of memory at the whole batch of 16" in first and "min_batch_size=32" in first
    assert "Batch sizes tried: 16." in message
    assert "lower `min_batch_size` below 16" in message
    assert iterations(model) == 0


@real_oom
def test_regrow_tries_a_smaller_split_again():
    n, batch = 64, 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=8)
    reducer = OOMBatchSizeReducer(regrow_after=2)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    # step 0: 16 fails -> 2 x 8; after 2 good steps a trial at 16 fails -> back to 2 x 8.
    assert [e.regrow for e in reducer.events] == [False, True]
    assert reducer.micro_batches == 2
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == n // batch


@real_oom
@pytest.mark.parametrize("kind", ["generator", "pydataset", "tf.data"])
def test_input_kinds(kind):
    if kind == "tf.data" and BACKEND != "tensorflow":
        pytest.skip("tf.data is tested on TensorFlow")
    n, batch = 40, 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=8)
    if kind == "generator":

        def gen():
            for i in range(0, n, batch):
                yield x[i : i + batch], y[i : i + batch]

        source, kw = gen(), {"steps_per_epoch": 3}
    elif kind == "pydataset":

        class Seq(keras.utils.PyDataset):
            def __len__(self):
                return 3

            def __getitem__(self, i):
                return x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]

        source, kw = Seq(), {}
    else:
        import tensorflow as tf

        source, kw = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), {}
    model.fit(source, epochs=1, verbose=0, shuffle=False, callbacks=[OOMBatchSizeReducer()], **kw)
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == 3


@real_oom
def test_tf_data_two_epochs_every_sample_once():
    if BACKEND != "tensorflow":
        pytest.skip("tf.data iterator handling is TensorFlow's")
    import tensorflow as tf

    n = 48
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(16).prefetch(2)
    model.fit(ds, epochs=2, verbose=0, callbacks=[OOMBatchSizeReducer()])
    np.testing.assert_array_equal(seen(model), np.full(n, 2))
    assert iterations(model) == 6


@real_oom
def test_batchnorm_and_steps_per_execution():
    n, batch = 48, 16
    x, y = numbered_samples(n)
    spe = 1 if BACKEND == "torch" else 2
    model = make_model(n, limit=8, batchnorm=True, steps_per_execution=spe)
    reducer = OOMBatchSizeReducer()
    history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[reducer])
    np.testing.assert_array_equal(seen(model), np.full(n, 2))
    assert iterations(model) == 6
    assert np.isfinite(history.history["loss"]).all()


@real_oom
def test_mixed_float16_loss_scaling():
    n, batch = 48, 16
    x, y = numbered_samples(n)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        # A loss scale that overflows in neither run: an overflow is a threshold effect of float16
        # rounding, which micro-batches change, and it skips an update.
        model = make_model(n, limit=4, loss_scale=256.0)
        reference = make_model(n, limit=10**9, loss_scale=256.0)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[OOMBatchSizeReducer()])
        reference.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == iterations(reference) == 3
    assert_close(weights(model), weights(reference), atol=5e-3)


@real_oom
def test_two_fits_in_a_row_and_tensorboard(tmp_path):
    n = 32
    x, y = numbered_samples(n)
    model = make_model(n, limit=8)
    reducer = OOMBatchSizeReducer(log_dir=str(tmp_path))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    assert restored(model)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    assert len(reducer.events) == 1  # the second fit starts at the split that worked
    np.testing.assert_array_equal(seen(model), np.full(n, 2))
    assert restored(model)
    files = glob.glob(os.path.join(str(tmp_path), "oom", "events.out.tfevents.*"))
    assert files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.dirname(files[0]))
    acc.Reload()
    assert {"oom/events", "oom/micro_batches", "oom/events_total"} <= set(acc.Tags()["scalars"])


def assert_boom_unchanged(error):
    """The error is Boom's own: its type, and its traceback down to the layer's `call`."""
    assert type(error) is ValueError
    assert any(
        frame.name == "call" and "test_oom_batch_size_reducer" in frame.filename
        for frame in traceback.extract_tb(error.__traceback__)
    )


def test_a_non_oom_error_passes_through_unchanged():
    n = 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=10**9, boom=True)
    Boom.armed = True
    try:
        with pytest.raises(ValueError, match="boom from inside the step") as info:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    finally:
        Boom.armed = False
    assert_boom_unchanged(info.value)
    assert restored(model)


class ArmAt(keras.callbacks.Callback):
    """Arms ``Boom`` or lowers every ``MemoryCliff``'s limit before the batch ``at`` of the first epoch."""

    def __init__(self, at, cliff_limit=None):
        super().__init__()
        self.at, self.cliff_limit = at, cliff_limit

    def on_train_batch_begin(self, batch, logs=None):
        if batch != self.at:
            return
        if self.cliff_limit is None:
            Boom.armed = True
            return
        for layer in self.model.layers:
            if isinstance(layer, MemoryCliff):
                layer.limit = self.cliff_limit


def test_the_idle_path_counts_every_step_and_passes_a_non_oom_error_through_unchanged():
    # Eager steps, so that arming the layer mid-fit takes effect: the error comes from the
    # step on the idle path (a shape that already ran whole), not from its first trace.
    n = 48
    x, y = numbered_samples(n)
    model = make_model(n, limit=10**9, boom=True, run_eagerly=True)
    reducer = OOMBatchSizeReducer()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[reducer])
    assert reducer._global_step == 12  # 6 steps an epoch, the first guarded, the rest idle
    assert restored(model)
    try:
        with pytest.raises(ValueError, match="boom from inside the step") as info:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[reducer, ArmAt(3)])
    finally:
        Boom.armed = False
    assert_boom_unchanged(info.value)
    assert reducer._global_step == 15  # the three steps before the error
    assert restored(model)


@pytest.mark.parametrize("data_kind", ["arrays", "arrays_xla", "tf.data"])
def test_an_idle_reducer_trains_exactly_as_a_bare_fit(data_kind):
    # Every step after the first runs on the idle path (on TensorFlow, the concrete
    # function of Keras's compiled step): the same weights, losses and metrics,
    # bit for bit, as Keras alone, including the smaller last batch.
    if data_kind != "arrays" and BACKEND != "tensorflow":
        pytest.skip("TensorFlow's input (tf.data) and compile option (XLA for the TensorFlow step)")
    n, batch, epochs = 44, 8, 2  # five batches of 8, then one of 4
    x, y = numbered_samples(n)
    sample_weight = np.linspace(0.5, 1.5, n).astype("float32")  # batches of three arrays

    def inputs():
        if data_kind.startswith("arrays"):
            return {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": batch, "shuffle": False}
        import tensorflow as tf

        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).prefetch(2)}

    runs = []
    for callbacks in ([], [OOMBatchSizeReducer()]):
        model = make_model(n, limit=10**9, **({"jit_compile": True} if data_kind == "arrays_xla" else {}))
        history = model.fit(**inputs(), epochs=epochs, verbose=0, callbacks=callbacks)
        runs.append((model, history.history))
    (bare, bare_history), (model, history) = runs
    for a, b in zip(weights(model), weights(bare)):
        np.testing.assert_array_equal(a, b)
    for key in ("loss", "mae"):
        assert history[key] == bare_history[key]
    np.testing.assert_array_equal(seen(model), np.full(n, epochs))
    assert iterations(model) == iterations(bare) == epochs * 6
    assert restored(model)


class CountingReducer(OOMBatchSizeReducer):
    guarded = 0  # batches on the guarded path

    def _one(self, batch, state=None):
        self.guarded += 1
        return super()._one(batch, state)


class CountingIdle(IdlePath):
    checked = 0  # batches on the idle path after a look at their shapes

    def run(self, step, *args):
        self.checked += 1
        return super().run(step, *args)


@pytest.mark.parametrize("structure", ["pair", "weighted", "dict"])
def test_a_shape_that_ran_whole_takes_the_idle_path_whatever_the_batch_structure(structure):
    # The JAX and torch steps build a flat tuple's signature inline and fall back to
    # batch_signature for anything else (a dict of inputs here): either way, only the
    # first batch of a shape takes the guarded path, and the fit is Keras's own.
    n, batch = 48, 8  # six whole batches an epoch: one shape
    x, y = numbered_samples(n)
    x = x[:, 1:]  # the features, without the sample ids
    if structure == "dict":

        def make():
            a, b = keras.Input((2,), name="a"), keras.Input((1,), name="b")
            return keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))

        inputs = {"x": {"a": x[:, :2], "b": x[:, 2:]}, "y": y}
    else:

        def make():
            return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

        inputs = {"x": x, "y": y}
        if structure == "weighted":
            inputs["sample_weight"] = np.linspace(0.5, 1.5, n).astype("float32")

    def fit(callbacks):
        keras.utils.set_random_seed(0)
        model = make()
        model.compile("sgd", "mse")
        history = model.fit(**inputs, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        return model, history.history

    reducer = CountingReducer()
    (bare, bare_history), (model, history) = fit([]), fit([reducer])
    assert reducer.guarded == 1  # the first batch; the other eleven took the idle path
    assert history["loss"] == bare_history["loss"]
    for a, b in zip(model.get_weights(), bare.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("inputs", ["arrays", "shuffled_arrays", "arrays_steps_per_epoch", "py_dataset"])
def test_an_epochs_full_batches_of_arrays_run_unchecked_once_their_shape_ran_whole(inputs):
    # 50 samples in batches of 8: six full batches and one of 2 an epoch. From arrays (Keras's
    # ArrayDataAdapter, a new pass each epoch) the JAX and torch steps run an epoch's full
    # batches with no look at their tensors once that shape ran whole, and check the last
    # one; any other input (a set steps_per_epoch, a PyDataset), and TensorFlow, checks each.
    from keras_gpu_tools import backends

    n, batch, epochs = 50, 8, 3
    x, y = numbered_samples(n)
    x = x[:, 1:]

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 7

        def __getitem__(self, i):
            return x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]

    kw = {"x": x, "y": y, "batch_size": batch, "shuffle": inputs == "shuffled_arrays"}
    if inputs == "arrays_steps_per_epoch":
        kw["steps_per_epoch"] = 6
    elif inputs == "py_dataset":
        kw = {"x": Batches()}

    def fit(callbacks):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        history = model.fit(**kw, epochs=epochs, verbose=0, callbacks=callbacks)
        return model, history.history

    reducer = CountingReducer()
    reducer._idle = idle = CountingIdle(reducer._idle_failed)
    (bare, bare_history), (model, history) = fit([]), fit([reducer])
    batches = iterations(model)
    unchecked = batches - reducer.guarded - idle.checked
    if inputs in ("arrays", "shuffled_arrays") and backends.get(BACKEND).counts_idle_batches:
        # Epoch 1: the first batch guarded (its shape runs whole), five unchecked, the batch of 2
        # guarded. Epochs 2 and 3: six unchecked, the batch of 2 checked (it ran whole too).
        assert (reducer.guarded, idle.checked, unchecked) == (2, 2, 17)
    else:
        assert unchecked == 0
        if inputs in ("arrays", "shuffled_arrays"):  # TensorFlow: each epoch's first and last batch, a new shape
            assert (reducer.guarded, idle.checked) == (6, 15)
    assert batches == iterations(bare)
    assert history["loss"] == bare_history["loss"]
    for a, b in zip(model.get_weights(), bare.get_weights()):
        np.testing.assert_array_equal(a, b)
    if inputs == "arrays":
        # The same reducer in a new fit() at another batch size: nothing of the last fit's
        # shape carries over, its first batch is guarded again (three full batches of 16, then 2).
        before = reducer.guarded
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
        assert reducer.guarded - before == 2


def test_a_ragged_input_is_checked_every_step():
    # A ragged tensor among fit()'s arrays is padded per batch to the batch's longest row: its
    # full batches have other shapes, so none may run unchecked (each new length is guarded).
    if BACKEND == "tensorflow":
        pytest.skip("TensorFlow checks every batch; its model takes the ragged tensor itself")
    tf = pytest.importorskip("tensorflow")
    n, batch = 40, 8
    lengths = [1 + i // batch for i in range(n)]  # batch k: rows of k + 1 values
    x = tf.ragged.constant([[1.0] * k for k in lengths])
    y = np.asarray(lengths, "float32")[:, None]

    def fit(callbacks):
        keras.utils.set_random_seed(0)
        inp = keras.Input((None,))
        model = keras.Model(
            inp, keras.layers.Dense(1)(keras.layers.Lambda(lambda t: ops.sum(t, 1, keepdims=True))(inp))
        )
        model.compile("sgd", "mse")
        return model, model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=callbacks).history

    reducer = CountingReducer()
    reducer._idle = idle = CountingIdle(reducer._idle_failed)
    (bare, bare_history), (model, history) = fit([]), fit([reducer])
    assert reducer.guarded + idle.checked == iterations(model) == 10  # none unchecked
    assert reducer.guarded == 10  # five lengths an epoch, each new after the last
    assert history["loss"] == bare_history["loss"]
    for a, b in zip(model.get_weights(), bare.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_only_dense_arrays_have_batches_of_one_shape():
    from keras_gpu_tools.runtime.keras_internals.input_data import _dense

    assert _dense(np.zeros((4, 2))) and _dense(None)
    assert not _dense([[1.0, 2.0]])  # not an array Keras slices as one
    if BACKEND == "jax":
        import jax.numpy as jnp
        from jax.experimental import sparse

        assert _dense(jnp.zeros((4, 2)))
        assert not _dense(sparse.BCOO.fromdense(jnp.eye(4)))
    if BACKEND == "torch":
        import torch

        assert _dense(torch.zeros(4, 2))
        assert not _dense(torch.eye(4).to_sparse())
    tf = pytest.importorskip("tensorflow")
    assert _dense(tf.zeros((4, 2)))
    assert not _dense(tf.ragged.constant([[1.0], [1.0, 2.0]]))
    assert not _dense(tf.sparse.from_dense(tf.eye(4)))
    scipy_sparse = pytest.importorskip("scipy.sparse")
    assert not _dense(scipy_sparse.csr_matrix(np.eye(4)))
    try:
        import pandas as pd
    except ImportError:  # not a dependency of the package's test set
        return
    assert _dense(pd.DataFrame({"a": [1.0, 2.0]})) and _dense(pd.Series([1.0, 2.0]))


def test_the_tensorflow_idle_step_is_the_concrete_function_of_keras_compiled_step():
    if BACKEND != "tensorflow":
        pytest.skip("TensorFlow's train function")
    import tensorflow as tf

    from keras_gpu_tools.runtime import keras_internals as ki

    x, y = numbered_samples(16)
    batch = (tf.constant(x[:8]), tf.constant(y[:8]))
    model = make_model(16, limit=10**9)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    step = ki.tf_batch_step(model.train_function, batch)
    assert isinstance(step, tf.types.experimental.ConcreteFunction)
    before = iterations(model)
    logs = step(batch)
    assert set(logs) >= {"loss", "mae"} and iterations(model) == before + 1
    # Where there is no compiled function, or the batch holds an Optional, there is none.
    assert ki.tf_batch_step(model.train_function, (batch[0], tf.experimental.Optional.empty(None))) is None
    eager = make_model(16, limit=10**9, run_eagerly=True)
    eager.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert ki.tf_batch_step(eager.train_function, batch) is None
    assert ki.tf_batch_step(lambda it: None, batch) is None
    tf.config.run_functions_eagerly(True)
    try:
        assert ki.tf_batch_step(model.train_function, batch) is None
    finally:
        tf.config.run_functions_eagerly(False)


@real_oom
def test_an_oom_on_the_idle_path_is_refused_with_the_reason():
    # Batches of 8 ran whole, so no copy of the state is kept for them; then the memory
    # cliff drops to 4 samples (eager steps, so the new limit applies at once).
    from keras_gpu_tools.errors import UnrecoverableOOM

    n = 48
    x, y = numbered_samples(n)
    model = make_model(n, limit=10**9, run_eagerly=True)
    reducer = OOMBatchSizeReducer()
    with pytest.raises(UnrecoverableOOM) as info:
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[reducer, ArmAt(3, 4)])
    if BACKEND == "jax" and "surfaced only when its results were read" in str(info.value):
        # JAX on a GPU: the eager step's failed allocation surfaces asynchronously, when
        # its results are read, after the state was donated: refused with that reason.
        assert "Use `probe=True`" in str(info.value)
        assert restored(model)
        return
    assert "already run whole" in str(info.value)
    # The shape it failed at (on JAX and torch, an unchecked batch's): (8, 4), or torch.Size([8, 4]).
    assert re.search(r"[(\[]8, 4[)\]]", str(info.value))
    assert "late_recovery=True" in str(info.value)
    # Recorded as the allocator's error, at the step it happened: not retried.
    [event] = reducer.events
    assert (event.step, event.batch_size, event.failed_split, event.next_split) == (3, 8, 1, None)
    assert event.kind != "unknown"
    np.testing.assert_array_equal(seen(model)[:24], np.ones(24))  # the three steps before it, once each
    assert restored(model)


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="min_batch_size"):
        OOMBatchSizeReducer(min_batch_size=0)
    with pytest.raises(ValueError, match="regrow_after"):
        OOMBatchSizeReducer(regrow_after=0)
    with pytest.raises(ValueError, match="mode"):
        OOMBatchSizeReducer(mode="halve")
    with pytest.raises(ValueError, match=r"probe=.yes.*one of True, False, 'auto'"):
        OOMBatchSizeReducer(probe="yes")
    with pytest.raises(ValueError, match="probe"):
        OOMBatchSizeReducer(probe=1)
    assert OOMBatchSizeReducer().probe == "auto"
    assert OOMBatchSizeReducer(probe=np.bool_(True)).probe is True
    with pytest.raises(TypeError, match="Invalid value for argument `record_memory_history`"):
        OOMBatchSizeReducer(record_memory_history=1)
    with pytest.raises(ValueError, match="Invalid value for argument `plan`"):
        OOMBatchSizeReducer(plan=2.5)


@pytest.mark.skipif(BACKEND != "jax", reason="probe predicts from XLA's memory analysis (JAX)")
def test_probe_predicts_the_split_without_running_out_of_memory(monkeypatch):
    from keras_gpu_tools import backends

    # The CPU reports no memory limit; give it the 8 GiB of a small GPU.
    monkeypatch.setattr(
        type(backends.get("jax")),
        "device_memory",
        lambda self: {"device": "test", "bytes_limit": 8 * 2**30, "bytes_in_use": 0},
    )
    n = 32
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    reducer = OOMBatchSizeReducer(probe=True)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    assert [e.kind for e in reducer.events] == ["predicted", "predicted"]  # 16 and 2 x 8 never ran
    assert reducer.micro_batches == 4
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == 2


@pytest.mark.skipif(BACKEND != "jax", reason="probe predicts from XLA's memory analysis (JAX)")
def test_by_default_a_device_with_a_memory_limit_predicts_and_the_fit_is_exact(monkeypatch):
    from keras_gpu_tools import backends

    # A GPU's memory limit (the CPU reports none): the default predicts, as probe=True does.
    monkeypatch.setattr(
        type(backends.get("jax")),
        "device_memory",
        lambda self: {"device": "test", "bytes_limit": 8 * 2**30, "bytes_in_use": 0},
    )
    n = 40  # batches of 16, 16 and a last one of 8
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    reducer = OOMBatchSizeReducer()
    with warnings.catch_warnings():
        warnings.simplefilter("error", OOMWarning)  # nothing to warn about
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    # 16 and 2 x 8 never ran; the last batch (8 as 2 x 4) is bounded by 4 x 4's analysis: not analysed again.
    assert [e.kind for e in reducer.events] == ["predicted", "predicted"]
    assert all(set(e.phases) == {"predict", "explain"} for e in reducer.events)
    assert reducer.micro_batches == 2  # the last batch of 8 as 2 x 4
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == 3


def test_by_default_a_device_without_a_memory_limit_retries_and_warns_nothing():
    # A CPU: nothing can be predicted; the first attempt runs and its error is retried, silently.
    n = 32
    x, y = numbered_samples(n)
    model = make_model(n, limit=10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OOMWarning)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])


@pytest.mark.skipif(BACKEND == "jax", reason="JAX can predict")
def test_probe_warns_where_the_backend_cannot_tell():
    from keras_gpu_tools.errors import OOMWarning

    n = 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=10**9)
    with pytest.warns(OOMWarning, match="probe=True needs the JAX backend"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer(probe=True)])


@real_oom
@pytest.mark.parametrize("reducer_first", [True, False])
def test_shares_the_step_hook_with_the_input_bound_detector(reducer_first):
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector

    n = 48
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    reducer = OOMBatchSizeReducer()
    detector = InputBoundDetector(sample_every=2, log_dir=None, verbose=0)  # sampled steps take the hook's own path
    callbacks = [reducer, detector] if reducer_first else [detector, reducer]
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    np.testing.assert_array_equal(seen(model), np.full(n, 2))
    assert iterations(model) == 6 and reducer.micro_batches == 4
    assert restored(model)


@real_oom
def test_each_recovery_is_explained_in_the_log_dir_the_summary_and_the_report(tmp_path):
    from keras_gpu_tools import report

    n = 32
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    reducer = OOMBatchSizeReducer(log_dir=str(tmp_path))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    first = reducer.events[0]
    # The allocator's own figure: the cliff asked for 16 samples x 2**38 float32 columns.
    asked = first.explanation["requested_bytes"]
    assert 16 * HUGE_COLS * 4 <= asked < 16 * HUGE_COLS * 4 + 2**20  # XLA adds its other temporaries
    assert first.why()[0].startswith("asked 16.0 TiB")
    if BACKEND == "tensorflow":
        assert "memory_cliff" in first.explanation["allocation"] and tuple(first.explanation["shape"]) == (
            16,
            HUGE_COLS,
        )
    if BACKEND == "jax":  # the failing program's memory analysis, compiled but not run
        assert first.explanation["program"]["temporaries"] >= 16 * HUGE_COLS * 4
    files = first.explanation["files"]
    assert files and all(os.path.exists(f) for f in files)
    with open(files[0]) as f:
        assert f.read().splitlines()[1] == first.why()[0]
    assert "asked 16.0 TiB" in reducer.summary()
    for r in (report([reducer], model), report(str(tmp_path))):  # from the callback, and from the logs alone
        text = str(r)
        assert "step 0: out of memory at batch 16, retrying as 2 x 8" in text
        assert "    asked 16.0 TiB" in text


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's memory analysis (JAX)")
def test_after_a_real_oom_the_next_split_is_chosen_from_memory_analysis_without_running_failing_ones(monkeypatch):
    from keras_gpu_tools import backends

    # The CPU reports no memory limit; give it the 8 GiB of a small GPU, as probe's test does.
    monkeypatch.setattr(
        type(backends.get("jax")),
        "device_memory",
        lambda self: {"device": "test", "bytes_limit": 8 * 2**30, "bytes_in_use": 0},
    )
    n = 32
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)
    reducer = OOMBatchSizeReducer(probe=False)  # the first attempt runs and fails for real
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    # 16 ran out of memory for real; 2 x 8 was only compiled, its analysis said no; 4 x 4 ran.
    assert [e.kind for e in reducer.events] == ["jax", "predicted"]
    predicted = reducer.events[1]
    assert predicted.line() == "step 0: predicted out of memory at batch 16 (as 2 x 8), retrying as 4 x 4"
    assert predicted.explanation["requested_bytes"] >= 8 * HUGE_COLS * 4  # what the 2 x 8 step would need
    assert reducer.micro_batches == 4
    np.testing.assert_array_equal(seen(model), np.ones(n))
    assert iterations(model) == 2


def test_headroom_peak_against_capacity_and_the_batch_that_would_fit(tmp_path, monkeypatch):
    from keras_gpu_tools import backends, report

    backend = type(backends.get(BACKEND))
    # A CPU has no allocator peak or capacity: stand in for one GPU's (what device_peaks reads on a GPU).
    monkeypatch.setattr(backend, "device_peaks", lambda self: {0: (6 * 2**30, 8 * 2**30)})
    n = 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=10**9)
    reducer = OOMBatchSizeReducer(log_dir=str(tmp_path))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[reducer])
    (row,) = reducer.headroom()
    assert row["peak_bytes"] == 6 * 2**30 and row["capacity_bytes"] == 8 * 2**30
    assert row["fits_from"].startswith("estimate") and row["fits_batch"] > 16  # 6 of 8 GiB used at 16
    assert "headroom: GPU 0: peak 6.0 GiB of 8.0 GiB (75%); a batch of" in reducer.summary()
    assert "GPU 0: peak 6.0 GiB of 8.0 GiB (75%)" in str(report(str(tmp_path)))  # from the logs alone
    planned = OOMBatchSizeReducer(plan=64)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[planned])
    assert planned.headroom()[0]["fits_batch"] == 64 and planned.headroom()[0]["fits_from"] == "plan"


@pytest.mark.skipif(
    BACKEND != "torch", reason="the failed step's tensors are Python objects on torch only (see HeldActivations)"
)
def test_a_failed_attempts_tensors_are_freed_before_the_retry():
    # Before: Keras's frames held each failed attempt's activations in reference cycles until a
    # garbage collection; on an H100 a batch that fits as 4 micro-batches ran as 64.
    model, act = held_activations_model(limit=8)
    x, y = np.ones((64, 3), "float32"), np.ones((64, 1), "float32")
    reducer = OOMBatchSizeReducer()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[reducer])
    assert reducer.micro_batches == 4 and len(act.failed) == 2  # 32 failed, 2 x 16 failed, 4 x 8 ran
    assert act.alive and act.alive[0] == 0 and max(act.alive) == 0


@real_oom
def test_a_quiet_reducer_says_one_short_line_after_the_epoch_and_nothing_mid_epoch(capfd):
    n, batch = 48, 16
    x, y = numbered_samples(n)
    model = make_model(n, limit=4)

    class EpochMarks(keras.callbacks.Callback):  # before the reducer in the list: its line comes after the mark
        def on_epoch_end(self, epoch, logs=None):
            print(f"<end of epoch {epoch}>")

    reducer = OOMBatchSizeReducer()  # verbose=0
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[EpochMarks(), reducer])
    out, err = capfd.readouterr()
    assert len(reducer.events) == 2
    assert "OOMBatchSizeReducer" not in err  # no warning through the logging module's last resort
    lines = [line for line in out.splitlines() if line.startswith(("<end", "OOMBatchSizeReducer"))]
    assert lines[:2] == ["<end of epoch 0>", lines[1]] and lines[1].startswith("OOMBatchSizeReducer: recovered")
    assert sum(line.startswith("OOMBatchSizeReducer") for line in lines) == 1  # once a fit
