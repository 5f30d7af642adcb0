"""The small Keras models the tests build, and layers that produce a real out-of-memory error on CPU.

`tiny_dense_model` is the model most callback tests fit: two Dense layers, SGD
and mean squared error, a few hundred weights.

`MemoryCliff` materialises, above `limit` samples per step, a tensor of at
least 1 TiB per sample, which the backend's own CPU allocator refuses
(TensorFlow `ResourceExhaustedError`, XLA's CPU runtime "Out of memory
allocating", torch's DefaultCPUAllocator error). Nothing is faked: the errors
come from the allocators, inside the real step.

TensorFlow's oneDNN and BFC CPU allocators retry a failed allocation for
10 s before they raise, and the choice is fixed when TensorFlow is imported.
The test sessions run with `TF_ENABLE_ONEDNN_OPTS=0` (`tests/conftest.py`),
whose allocator refuses at once; a session started with oneDNN or the BFC
allocator on skips the real-OOM tests (`real_oom`).
"""

import os
import warnings

import keras
import pytest
from keras import ops

BACKEND = keras.backend.backend()
FAST_OOM = BACKEND != "tensorflow" or (
    os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" and os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true"
)
real_oom = pytest.mark.skipif(
    not FAST_OOM, reason="TensorFlow's allocator in this session retries a failed allocation for 10 s (oneDNN or BFC)"
)

HUGE_COLS = 2**38  # float32 columns per sample above the limit: 1 TiB per sample


def tiny_dense_model(
    features: int = 8, hidden: int = 16, activation: str | None = "relu", seed: int | None = 0
) -> keras.Model:
    """``features`` inputs, a Dense layer of ``hidden`` units, one output; SGD (learning rate 0.01) on mse.

    ``seed`` seeds Keras's random generators before the weights are made (None leaves them as they are).
    """
    if seed is not None:
        keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((features,)), keras.layers.Dense(hidden, activation=activation), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


class MemoryCliff(keras.layers.Layer):
    """Above `limit` samples, materialises a (batch, 2**38) float32 tensor: the allocator refuses it.

    Passes its input (of any rank) and its mask on unchanged.
    """

    def __init__(self, limit, **kw):
        super().__init__(**kw)
        self.limit = limit
        self.supports_masking = True

    def call(self, x):
        if BACKEND == "tensorflow":
            import tensorflow as tf

            n = tf.shape(x, out_type=tf.int64)[0]
            cols = tf.where(n > self.limit, tf.constant(HUGE_COLS, tf.int64), tf.constant(1, tf.int64))
            first = tf.cast(tf.reshape(x, [-1])[0], tf.float32)
            big = tf.fill(tf.stack([n, cols]), first * 0.0 + 1.0)  # a runtime value: not folded
            return x + ops.cast(tf.reduce_max(big) - 1.0, x.dtype)
        n = x.shape[0]
        if not isinstance(n, int) or n <= self.limit:
            return x
        if BACKEND == "jax":
            import jax.numpy as jnp

            with warnings.catch_warnings():  # an index into 2**38 columns asks for int64
                warnings.simplefilter("ignore", UserWarning)
                big = jnp.zeros((n, HUGE_COLS), "float32").at[0, 0].set(jnp.ravel(x)[0].astype("float32"))
            return x + (0.0 * big.max()).astype(x.dtype)
        import torch

        big = torch.ones((n, HUGE_COLS), dtype=torch.float32, device=x.device)
        return x + (big.max() - 1.0).to(x.dtype)

    def compute_mask(self, inputs, mask=None):
        return mask


class SeenCounter(keras.layers.Layer):
    """Counts how often each sample (id in column 0) is trained on, across processes too; passes the features on."""

    def __init__(self, num_samples, **kw):
        super().__init__(**kw)
        self.num_samples = num_samples

    def build(self, shape):
        self.seen = self.add_weight(shape=(self.num_samples,), initializer="zeros", trainable=False, name="seen")

    def call(self, x, training=False):
        if training:
            ids = ops.cast(x[:, 0], "int32")
            self.seen.assign(self.seen + ops.sum(ops.one_hot(ids, self.num_samples, dtype=self.seen.dtype), axis=0))
        return x[:, 1:]


class HeldActivations:
    """A Dense activation that runs out of memory above `limit` samples, after its input was allocated.

    Its input, the Dense layer's output, is held by Keras's own frames (which
    Keras leaves out of the traceback it re-raises) when the allocator refuses
    the next tensor: a real CPU out-of-memory error inside a real step. Each
    failed attempt's input is watched (`failed`); each call at `limit` samples
    or fewer (a retry) records how many of them are still alive (`alive`).
    torch only: on JAX and TensorFlow the step is traced, so no array of it is
    a Python object.
    """

    def __init__(self, limit):
        self.limit = limit
        self.failed: list = []
        self.alive: list[int] = []

    def __call__(self, x):
        import weakref

        import torch

        n = x.shape[0]
        if not isinstance(n, int) or x.device.type == "meta" or not torch.is_grad_enabled():
            return x  # building the model, or an inference step
        if n > self.limit:
            self.failed.append(weakref.ref(x))
            torch.ones((n, HUGE_COLS))
        self.alive.append(sum(ref() is not None for ref in self.failed))
        return x


def held_activations_model(limit):
    """A model whose hidden layer's activation is a :class:`HeldActivations` of ``limit``; returns (model, it)."""
    act = HeldActivations(limit)
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Dense(4, activation=act)(inp)))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model, act


def mlp_model(inputs: int = 16, widths: tuple[int, ...] = (256, 256), jit_compile="auto", seed: int = 0) -> keras.Model:
    """A ReLU MLP of ``widths`` with one output; SGD on mse (its step's FLOPs: :func:`mlp_step_flops`)."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((inputs,))] + [keras.layers.Dense(w, activation="relu") for w in widths]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=jit_compile)
    return model


def mlp_step_flops(batch: int, inputs: int = 16, widths: tuple[int, ...] = (256, 256)) -> float:
    """The hand count of one training step of :func:`mlp_model`: 6 x MACs x batch (forward 2x, backward 4x)."""
    sizes = (inputs, *widths, 1)
    macs = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    return 6.0 * macs * batch


def one_heavy_layer_model(features: int = 256, heavy: int = 4096, seed: int | None = 0) -> keras.Model:
    """A functional model ``net`` whose FLOPs sit in one layer, with a shared layer and a nested model.

    ``heavy`` (Dense ``features`` -> ``heavy`` units) holds about 99% of the
    multiply-adds; ``proj`` brings it down to 8; ``shared`` (Dense 8) is
    called twice; ``inner`` is a nested Sequential with ``small`` (Dense 8);
    ``head`` gives one output. Adam on mse.
    """
    if seed is not None:
        keras.utils.set_random_seed(seed)
    inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="small")], name="inner")
    shared = keras.layers.Dense(8, name="shared")
    inputs = keras.Input((features,))
    h = keras.layers.Dense(heavy, activation="relu", name="heavy")(inputs)
    h = keras.layers.Dense(8, name="proj")(h)
    h = shared(shared(h))
    h = inner(h)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(h), name="net")
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model
