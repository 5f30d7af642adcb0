"""OOMBatchSizeReducer under TensorFlow's MirroredStrategy: 2 replicas on 2 logical CPU devices.

Each replica's share of the batch is split: micro-batch i is every replica's
i-th slice, run over the replicas (`strategy.run`), the gradients accumulated
per replica and applied once (the optimizer sums them over the replicas, as
in Keras's own step). The out-of-memory errors are real: `MemoryCliff` asks
the CPU allocator of each replica's device for terabytes above a per-replica
micro-batch size (TensorFlow's `ResourceExhaustedError`, naming the replica's
device).

Logical devices are fixed before TensorFlow initialises its devices, and the
allocator must refuse at once: the test session sets both (`tests/conftest.py`), and frees each
test's dead tf.data iterators when it ends.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_gpu_tools import OOMBatchSizeReducer
from tests.helpers.data import numbered_samples
from tests.helpers.models import BACKEND, FAST_OOM, MemoryCliff
from tests.helpers.session import TF_CPU_DEVICES

REPLICAS = 2


inside = pytest.mark.skipif(
    BACKEND != "tensorflow" or not FAST_OOM or TF_CPU_DEVICES < REPLICAS,
    reason="MirroredStrategy over two logical CPU devices whose allocator refuses at once: a TensorFlow test session",
)


class SampleCounter(keras.layers.Layer):
    """Counts how often each sample (id in column 0) is trained on, over every replica; passes the features on.

    Each replica adds the samples of its own share to its own copy of the counter, which reads as their
    sum: a TensorFlow variable with `synchronization=ON_READ`, as Keras keeps its metrics (Keras's own
    variables have no such option, and a mirrored `aggregation="sum"` one sums the replicas' new values,
    not their increments). It is not one of the model's variables, so nothing puts it back after a failed
    attempt: it sits after the memory cliff, whose output it needs, and counts only what ran through.
    """

    def __init__(self, num_samples, **kw):
        super().__init__(**kw)
        self.num_samples = num_samples

    def build(self, shape):
        import tensorflow as tf

        self.counts = tf.Variable(
            tf.zeros((self.num_samples,)),
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )

    def call(self, x, training=False):
        if training:
            ids = ops.cast(x[:, 0], "int32")
            self.counts.assign_add(ops.sum(ops.one_hot(ids, self.num_samples, dtype="float32"), axis=0))
        return x[:, 1:]


def strategy():
    import tensorflow as tf

    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


def make_model(num_samples, limit, optimizer="sgd", loss="mse", seed=1):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((4,))
    h = MemoryCliff(limit)(inp)  # per replica: its share of the (micro-)batch
    h = SampleCounter(num_samples)(h)
    h = keras.layers.Dense(8, activation="tanh")(h)
    out = keras.layers.Dense(1)(h)
    model = keras.Model(inp, out)
    opt = keras.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd" else keras.optimizers.Adam(0.01)
    model.compile(opt, loss, metrics=["mae"])
    return model


def seen(model):
    return model.layers[2].counts.numpy()


def weights(model):
    return model.get_weights()


def iterations(model):
    return int(ops.convert_to_numpy(model.optimizer.iterations))


def both(n, limit, batch=16, epochs=2, mode="accumulate", validation=False, sample_weight=None, **model_kw):
    """(model trained with the reducer, reference trained unsplit, their histories, the reducer)."""
    x, y = numbered_samples(n)
    fit_kw = {"validation_data": (x[:16], y[:16])} if validation else {}
    if sample_weight is not None:
        fit_kw["sample_weight"] = sample_weight
    with strategy().scope():
        model = make_model(n, limit, **model_kw)
        reference = make_model(n, 10**9, **model_kw)  # same seed: same initial weights
    assert model.distribute_strategy.num_replicas_in_sync == REPLICAS
    reducer = OOMBatchSizeReducer(mode=mode)
    history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[reducer], **fit_kw)
    ref_history = reference.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, **fit_kw)
    return model, reference, history.history, ref_history.history, reducer


@pytest.mark.slow
@inside
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_each_replica_share_is_split_and_the_update_is_the_unsplit_one(optimizer):
    n, epochs = 48, 2
    # Batches of 16: 8 per replica. The cliff is above 2 samples per replica: 16 (8 each) and
    # 2 x 8 (4 each) run out of memory on the replicas' devices, 4 x 4 (2 each) fits.
    model, reference, history, ref_history, reducer = both(
        n, limit=2, epochs=epochs, optimizer=optimizer, validation=True
    )
    # Training, then the validation batch of 16, each: 16 and 2 x 8 out of memory, 4 x 4 fits.
    assert [(e.phase, e.batch_size, e.failed_split, e.next_split) for e in reducer.events] == [
        ("train", 16, 1, 2),
        ("train", 16, 2, 4),
        ("test", 16, 1, 2),
        ("test", 16, 2, 4),
    ]
    assert all(e.granule == REPLICAS for e in reducer.events)
    why = " ".join(" ".join(e.why()) for e in reducer.events)
    assert "CPU:" in why  # the allocator's error names the replica's device
    assert reducer.micro_batches == 4 and reducer.micro_batch_size == 4
    np.testing.assert_array_equal(seen(reference), np.full(n, epochs))
    np.testing.assert_array_equal(seen(model), np.full(n, epochs))  # every sample once per epoch
    assert iterations(model) == iterations(reference) == epochs * n // 16  # one update per original batch
    for w, r in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
    for key in ("loss", "mae", "val_loss", "val_mae"):  # validation split over the replicas too
        np.testing.assert_allclose(history[key], ref_history[key], rtol=1e-5, err_msg=key)
    assert history["oom/micro_batches"] == [4.0, 4.0]


@inside
def test_uneven_split_of_the_shares_and_a_last_smaller_batch():
    # 40 samples in batches of 24 and 16: shares of 12 and 8. The cliff is above 3 per replica:
    # 24 runs as 4 micro-batches (3 per replica each); the last batch of 16 keeps micro-batches of
    # at most 6 (3 per replica): 3 of them, 3 + 3 + 2 per replica.
    model, reference, history, ref_history, reducer = both(40, limit=3, batch=24, epochs=1)
    assert reducer.events[-1].next_split == 4 and reducer.micro_batches == 3
    np.testing.assert_array_equal(seen(model), np.ones(40))
    assert iterations(model) == 2
    for w, r in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], ref_history["loss"], rtol=1e-5)


@inside
def test_sample_weights_averaged_over_each_replica_share():
    # mean_with_sample_weight: each replica's loss divides by its share's total weight, which its
    # micro-batches measure first; the update and the loss are still the unsplit step's.
    n = 32
    sw = np.random.RandomState(3).uniform(0.2, 3.0, size=(n,)).astype("float32")
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    model, reference, history, ref_history, reducer = both(n, limit=2, epochs=1, loss=loss, sample_weight=sw)
    assert reducer.micro_batches == 4
    for w, r in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], ref_history["loss"], rtol=1e-5)


@inside
def test_split_mode_runs_each_micro_batch_over_the_replicas_as_its_own_step():
    model, _, _, _, reducer = both(32, limit=2, epochs=1, mode="split")
    assert reducer.micro_batches == 4
    np.testing.assert_array_equal(seen(model), np.ones(32))
    assert iterations(model) == 2 * 4  # an update per micro-batch


@inside
def test_one_sample_per_replica_is_the_smallest_split():
    n = 8
    x, y = numbered_samples(n)
    with strategy().scope():
        model = make_model(n, limit=0)  # nothing fits
    with pytest.raises(Exception) as info:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    message = str(info.value)
    assert "Batch sizes tried: 8, 8 as 2 x 4, 8 as 4 x 2." in message, message
    assert "one sample per device" in message and "over 2 devices" in message
    assert iterations(model) == 0
    np.testing.assert_array_equal(seen(model), np.zeros(n))  # the failed attempts were undone


@inside
def test_predict_splits_each_replica_share_and_keeps_the_order():
    # Batches of 16 (8 per replica), the last one of 8 (4 per replica); the cliff is above 2 per
    # replica: 16 runs as 4 x 4, the 8 as 2 x 4. Keras's predict step joins the replicas' outputs
    # replica after replica; the split one gives the same rows in the same order.
    n = 40
    x, _ = numbered_samples(n)
    with strategy().scope():
        model = make_model(n, limit=2)
        reference = make_model(n, 10**9)  # same seed: same weights
    reducer = OOMBatchSizeReducer()
    predicted = model.predict(x, batch_size=16, verbose=0, callbacks=[reducer])
    expected = reference.predict(x, batch_size=16, verbose=0)
    assert [(e.phase, e.batch_size, e.failed_split, e.next_split) for e in reducer.events] == [
        ("predict", 16, 1, 2),
        ("predict", 16, 2, 4),
    ]
    assert predicted.shape == expected.shape == (n, 1)
    np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-6)  # every sample once, in order
    assert len(np.unique(np.round(expected, 5))) == n  # distinct rows: a row out of place would show
