"""Accumulate mode equals the unsplit batch, or is refused: every reduction, masks, weights, custom steps.

Each test trains a model that runs out of memory above 4 samples per step (a
real allocator error, `tests.helpers.models.MemoryCliff`) on batches of 16, which the
reducer runs as 4 x 4, and the same model, from the same initial weights, on
the same batches without the cliff. Weights, the epoch loss and every metric
of the epoch logs must agree to a relative 1e-5 (the issue's table: the mask,
`mean_with_sample_weight` and `sum` differed by up to 17.7 before).

What cannot be reproduced is refused with `InexactAccumulationError` before
any update: structural problems in `on_train_begin`, the rest at the first
split, with the state put back.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_gpu_tools import InexactAccumulationError, OOMBatchSizeReducer
from tests.helpers.models import BACKEND, MemoryCliff, real_oom

pytestmark = pytest.mark.multibackend

N, BATCH, T, VOCAB = 32, 16, 6, 12


def tokens(seed=0):
    """Padded sequences (0 = padding, lengths 1..T) and per-step targets."""
    r = np.random.RandomState(seed)
    lengths = r.randint(1, T + 1, size=N)
    x = r.randint(1, VOCAB, size=(N, T)).astype("int32")
    x[np.arange(T)[None, :] >= lengths[:, None]] = 0
    y = r.randn(N, T, 1).astype("float32")
    return x, y


def dense_data(seed=0):
    r = np.random.RandomState(seed)
    x = r.randn(N, 3).astype("float32")
    y = (x.sum(1, keepdims=True) + 0.1 * r.randn(N, 1)).astype("float32")
    return x, y


def weights_of(seed=1, steps=None):
    """Sample weights: one per sample, or one per time step of a sequence."""
    shape = (N,) if steps is None else (N, steps)
    return np.random.RandomState(seed).uniform(0.2, 3.0, size=shape).astype("float32")


def sequence_model(limit, loss, metrics=(), weighted_metrics=(), seed=1):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 4, mask_zero=True)(inp)
    h = MemoryCliff(limit)(h)
    h = keras.layers.Dense(4, activation="tanh")(h)
    out = keras.layers.Dense(1)(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.Adam(0.01), loss, metrics=list(metrics), weighted_metrics=list(weighted_metrics))
    return model


def dense_model(limit, loss, metrics=(), weighted_metrics=(), seed=1, regularized=False, classes=None):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((3,))
    h = MemoryCliff(limit)(inp)
    reg = {"kernel_regularizer": "l2", "activity_regularizer": keras.regularizers.L1(0.01)} if regularized else {}
    h = keras.layers.Dense(8, activation="tanh", **reg)(h)
    out = keras.layers.Dense(classes or 1, activation="softmax" if classes else None)(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.Adam(0.01), loss, metrics=list(metrics), weighted_metrics=list(weighted_metrics))
    return model


def fit_both(build, x, y, epochs=2, **fit_kw):
    """(reducer run, reference run): the same model and batches, the first one recovering from real OOMs."""
    model, reference = build(4), build(10**9)
    reducer = OOMBatchSizeReducer()
    history = model.fit(
        x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=[reducer], **fit_kw
    ).history
    ref_history = reference.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, **fit_kw).history
    assert reducer.micro_batches == 4 and len(reducer.events) == 2, [e.line() for e in reducer.events]
    return model, reference, history, ref_history


def assert_same_run(model, reference, history, ref_history, skip=()):
    for w, r, v in zip(model.get_weights(), reference.get_weights(), model.weights):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6, err_msg=v.path)
    keys = {k for k in history if not k.startswith("oom/")}
    assert keys == set(ref_history), (keys, set(ref_history))
    for key in sorted(keys - set(skip)):
        np.testing.assert_allclose(history[key], ref_history[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == int(
        ops.convert_to_numpy(reference.optimizer.iterations)
    )


# -- every built-in reduction, masks, sample and class weights -----------------------------------------
@real_oom
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean_with_sample_weight", "sum"])
@pytest.mark.parametrize("masked", [True, False])
def test_accumulation_equals_the_unsplit_batch_for_every_reduction(reduction, masked):
    loss = keras.losses.MeanSquaredError(reduction=reduction)
    if masked:  # padding mask from Embedding(mask_zero=True), per-step sample weights too
        x, y = tokens()
        build = lambda limit: sequence_model(limit, loss, metrics=["mae"], weighted_metrics=["mse"])  # noqa: E731
        sw = weights_of(steps=T)
        # Keras 3.15's torch loss scales a masked output's sample weights in place by the
        # batch's total/valid (`apply_mask`: `sample_weight *= float_mask`) before the
        # weighted metrics read them, so Keras's own weighted metric then depends on the
        # batch size (docs/keras-internals.md); the loss, the weights and the unweighted
        # metrics are compared.
        skip = ("mse",) if BACKEND == "torch" else ()
    else:
        x, y = dense_data()
        build = lambda limit: dense_model(limit, loss, metrics=["mae"], weighted_metrics=["mse"])  # noqa: E731
        sw, skip = weights_of(), ()
    assert_same_run(*fit_both(build, x, y, sample_weight=sw), skip=skip)


@real_oom
def test_mask_without_sample_weights_and_mean_reduction():
    x, y = tokens(seed=3)
    loss = keras.losses.MeanAbsoluteError(reduction="mean")
    assert_same_run(*fit_both(lambda limit: sequence_model(limit, loss, metrics=["mse"]), x, y))


@real_oom
def test_class_weights_and_regularizers():
    r = np.random.RandomState(4)
    x = r.randn(N, 3).astype("float32")
    y = r.randint(0, 3, size=(N,)).astype("int32")
    build = lambda limit: dense_model(  # noqa: E731
        limit,
        keras.losses.SparseCategoricalCrossentropy(reduction="mean_with_sample_weight"),
        metrics=["accuracy"],
        weighted_metrics=["sparse_categorical_crossentropy"],
        regularized=True,
        classes=3,
    )
    assert_same_run(*fit_both(build, x, y, class_weight={0: 1.0, 1: 3.0, 2: 0.25}))


@real_oom
def test_two_outputs_with_their_own_reductions_weights_and_loss_metrics():
    x, y = dense_data(seed=5)

    def build(limit):
        keras.utils.set_random_seed(1)
        inp = keras.Input((3,))
        h = MemoryCliff(limit)(inp)
        h = keras.layers.Dense(8, activation="tanh")(h)
        a = keras.layers.Dense(1, name="a")(h)
        b = keras.layers.Dense(1, name="b")(h)
        model = keras.Model(inp, {"a": a, "b": b})
        model.compile(
            keras.optimizers.Adam(0.01),
            loss={"a": keras.losses.MeanSquaredError(reduction="sum"), "b": keras.losses.MeanAbsoluteError()},
            loss_weights={"a": 0.1, "b": 2.0},
        )
        return model

    sw = weights_of(seed=2)
    model, reference, history, ref_history = fit_both(build, x, {"a": y, "b": -y}, sample_weight=sw)
    assert {"a_loss", "b_loss"} <= set(history)  # the per-output loss metrics too
    assert_same_run(model, reference, history, ref_history)


# -- custom train steps -----------------------------------------------------------------------------------
class HeadOnly(keras.Model):
    """A custom train_step that updates the head only: the body is frozen by the step, not by `trainable`."""

    def __init__(self, limit, **kw):
        super().__init__(**kw)
        self.cliff = MemoryCliff(limit)
        self.body = keras.layers.Dense(8, activation="tanh")
        self.head = keras.layers.Dense(1)

    def call(self, x):
        return self.head(self.body(self.cliff(x)))

    def _finish(self, x, y, y_pred, loss, sample_weight):
        self._loss_tracker.update_state(loss, sample_weight=ops.shape(x)[0])
        return self.compute_metrics(x, y, y_pred, sample_weight)

    if BACKEND == "tensorflow":

        def train_step(self, data):
            import tensorflow as tf

            x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw)
            head = self.head.trainable_variables
            self.optimizer.apply(tape.gradient(loss, head), head)
            return self._finish(x, y, y_pred, loss, sw)

    elif BACKEND == "torch":

        def train_step(self, data):
            import torch

            x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
            self.zero_grad()
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw)
            loss.backward()
            head = self.head.trainable_variables
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in head], head)
            return self._finish(x, y, y_pred, loss, sw)


@real_oom
@pytest.mark.skipif(BACKEND == "jax", reason="a JAX train_step hands stateless_apply every variable's gradient")
def test_a_custom_step_that_updates_part_of_the_model_moves_nothing_else():
    # AdamW's weight decay would move a variable that got a zero-gradient update.
    x, y = dense_data(seed=6)

    def build(limit):
        keras.utils.set_random_seed(1)
        model = HeadOnly(limit)
        model.compile(keras.optimizers.AdamW(0.01, weight_decay=0.5), "mse", metrics=["mae"])
        model(x[:2])
        model.optimizer.build(model.head.trainable_variables)  # the optimizer knows the head only
        return model

    model, reference, history, ref_history = fit_both(build, x, y)
    body = keras.utils.set_random_seed(1) or HeadOnly(10**9)
    body(x[:2])
    for w, initial in zip(model.body.get_weights(), body.body.get_weights()):
        np.testing.assert_array_equal(w, initial)  # frozen by the step: not one bit moved
    assert_same_run(model, reference, history, ref_history)


class OwnLoss(keras.Model):
    """A custom train_step that computes and averages its loss itself (no compute_loss)."""

    def __init__(self, limit, **kw):
        super().__init__(**kw)
        self.cliff = MemoryCliff(limit)
        self.dense = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.dense(self.cliff(x))

    def _own_loss(self, y, y_pred):
        return ops.mean(ops.square(y - y_pred))

    if BACKEND == "tensorflow":

        def train_step(self, data):
            import tensorflow as tf

            x, y = data
            with tf.GradientTape() as tape:
                loss = self._own_loss(y, self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"loss": loss}

    elif BACKEND == "jax":

        def train_step(self, state, data):
            import jax

            tv, ntv, ov, mv = state
            x, y = data

            def loss_fn(tv):
                y_pred, ntv2 = self.stateless_call(tv, ntv, x, training=True)
                return self._own_loss(y, y_pred), ntv2

            (loss, ntv), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
            tv, ov = self.optimizer.stateless_apply(ov, grads, tv)
            return {"loss": loss}, (tv, ntv, ov, mv)

    else:

        def train_step(self, data):
            import torch

            x, y = data
            self.zero_grad()
            loss = self._own_loss(y, self(x, training=True))
            loss.backward()
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in self.trainable_variables], self.trainable_variables)
            return {"loss": loss}


@real_oom
def test_a_train_step_that_averages_its_own_loss_is_refused_at_the_first_split_and_put_back():
    x, y = dense_data(seed=7)
    keras.utils.set_random_seed(1)
    model = OwnLoss(4)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model(x[:2])
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(InexactAccumulationError) as info:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    message = str(info.value)
    assert "train_step did not compute the compiled loss" in message and "mode='split'" in message
    for w, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(w, b)  # nothing applied, the failed attempts undone
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 0
    # split mode trains it as truly smaller batches
    reducer = OOMBatchSizeReducer(mode="split")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == (N // BATCH) * 4


class Penalty(keras.layers.Layer):
    """A layer with its own add_loss (a sum over the batch: its averaging is the layer's)."""

    def call(self, x):
        self.add_loss(0.01 * ops.sum(ops.square(x)))
        return x


@real_oom
def test_a_loss_added_by_a_layer_is_refused_at_the_first_split():
    x, y = dense_data(seed=8)
    keras.utils.set_random_seed(1)
    inp = keras.Input((3,))
    out = keras.layers.Dense(1)(Penalty()(MemoryCliff(4)(inp)))
    model = keras.Model(inp, out)
    model.compile("sgd", "mse")
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(InexactAccumulationError, match="adds 1 loss\\(es\\) of its own with `add_loss`"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    for w, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(w, b)


# -- refused before the first step ------------------------------------------------------------------------
class SumOfSquares(keras.losses.Loss):
    """A custom reduction: __call__ overridden."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        return ops.sum(ops.square(y_true - y_pred))


class TwoOptimizers(keras.Model):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.dense = keras.layers.Dense(1)
        self.head_optimizer = keras.optimizers.SGD(0.1)  # a second optimizer the train step would use

    def call(self, x):
        return self.dense(x)


class OwnComputeLoss(keras.Model):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return ops.mean(ops.abs(y - y_pred))


def _plain(loss):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", loss)
    return model


def _own(cls):
    model = cls()
    model.compile("sgd", "mse")
    return model


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: _plain(SumOfSquares()), "overrides `Loss.__call__`: a custom reduction"),
        (lambda: _plain(keras.losses.MeanSquaredError(reduction=None)), "reduction=None"),
        (lambda: _own(TwoOptimizers), "holds 2 optimizers (model.optimizer and SGD)"),
        (lambda: _own(OwnComputeLoss), "overrides `compute_loss`"),
    ],
    ids=["custom-reduction", "reduction-none", "two-optimizers", "own-compute-loss"],
)
def test_what_cannot_be_exact_is_refused_before_the_first_step(make, expected):
    model = make()
    x, y = dense_data()
    with pytest.raises(InexactAccumulationError) as info:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    message = str(info.value)
    assert expected in message and "mode='split'" in message, message
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 0  # refused before any step
    if "reduction=None" not in expected:  # which Keras itself trains on no backend but TensorFlow
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer(mode="split")])
        assert int(ops.convert_to_numpy(model.optimizer.iterations)) == N // BATCH


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean", "mean_with_sample_weight", "sum"])
@pytest.mark.parametrize("with_mask", [True, False])
@pytest.mark.parametrize("with_weights", [True, False])
def test_numerator_over_denominator_is_keras_own_loss(reduction, with_mask, with_weights):
    """What `loss_parts` splits a loss into is what Keras divides, for every reduction, mask and weights."""
    from keras.src.backend.common.masking import set_keras_mask

    from keras_gpu_tools.runtime import keras_internals as ki

    r = np.random.RandomState(0)
    y_true = ops.convert_to_tensor(r.randn(5, 3, 1).astype("float32"))
    y_pred = ops.convert_to_tensor(r.randn(5, 3, 1).astype("float32"))
    if with_mask:
        set_keras_mask(y_pred, ops.convert_to_tensor(r.rand(5, 3) > 0.4))
    sw = ops.convert_to_tensor(r.uniform(0.5, 2.0, size=(5, 3)).astype("float32")) if with_weights else None
    loss = keras.losses.MeanSquaredError(reduction=reduction)
    sw_before = None if sw is None else ops.convert_to_numpy(sw).copy()
    numerator, denominator, facts = ki.loss_parts(loss, y_true, y_pred, sw)
    if sw is not None:
        np.testing.assert_array_equal(ops.convert_to_numpy(sw), sw_before)  # the batch's weights untouched
    got = float(ops.convert_to_numpy(ops.divide_no_nan(numerator, denominator)))
    expected = float(ops.convert_to_numpy(loss(y_true, y_pred, sample_weight=sw)))  # (torch: scales sw in place)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert facts["mask"] is with_mask and facts["weights"] is with_weights and not facts["scalar"]


# -- evaluation and prediction ---------------------------------------------------------------------------
@real_oom
def test_validation_that_runs_out_of_memory_is_split_and_equals_the_unsplit_run():
    x, y = tokens(seed=9)
    sw = weights_of(seed=4, steps=T)
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    model, reference = sequence_model(4, loss, metrics=["mae"]), sequence_model(10**9, loss, metrics=["mae"])
    reducer = OOMBatchSizeReducer()
    fit_kw = dict(
        batch_size=4,  # training fits; validation batches of 16 run out of memory
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(x, y, sw),
        validation_batch_size=BATCH,
    )
    history = model.fit(x, y, callbacks=[reducer], **fit_kw).history
    ref_history = reference.fit(x, y, **fit_kw).history
    assert [e.phase for e in reducer.events] == ["test", "test"]
    assert reducer.events[0].line().startswith("evaluation step 0: out of memory at batch 16")
    assert_same_run(model, reference, history, ref_history)


@real_oom
def test_evaluate_and_predict_that_run_out_of_memory_equal_the_unsplit_run():
    x, y = tokens(seed=10)
    loss = keras.losses.MeanSquaredError()
    model, reference = sequence_model(4, loss, metrics=["mae"]), sequence_model(10**9, loss, metrics=["mae"])
    reducer = OOMBatchSizeReducer()
    got = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True, callbacks=[reducer])
    expected = reference.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert set(got) == set(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)
    predicted = model.predict(x, batch_size=BATCH, verbose=0, callbacks=[reducer])
    np.testing.assert_allclose(predicted, reference.predict(x, batch_size=BATCH, verbose=0), rtol=1e-6, atol=1e-7)
    assert [e.phase for e in reducer.events] == ["test", "test", "predict", "predict"]
    assert model.test_function is not None and not hasattr(model.test_function, "_keras_gpu_tools_eval_original")
    assert not hasattr(model.predict_function, "_keras_gpu_tools_eval_original")  # Keras's own functions again
    # a second evaluate starts at the split that worked: no new out-of-memory error
    again = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True, callbacks=[reducer])
    np.testing.assert_allclose(again["loss"], expected["loss"], rtol=1e-5)
    assert len(reducer.events) == 4
