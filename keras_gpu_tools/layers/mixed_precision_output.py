"""MixedPrecisionOutput: a model's last layer, in float32 under any dtype policy."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, cast

import keras
from keras import ops

_AXIS_ACTIVATIONS = ("softmax", "log_softmax")


def _is_activation(fn: Callable, name: str) -> bool:
    return fn is getattr(keras.activations, name)


def _stable_softmax(x, axis, log: bool):
    # For several axes at once (the backends' fused kernels take one): shift
    # by the max so exp never overflows; float32 keeps the small values.
    x_max = ops.stop_gradient(ops.max(x, axis=axis, keepdims=True))
    shifted = x - x_max
    if log:
        return shifted - ops.log(ops.sum(ops.exp(shifted), axis=axis, keepdims=True))
    e = ops.exp(shifted)
    return e / ops.sum(e, axis=axis, keepdims=True)


@keras.saving.register_keras_serializable(package="keras_gpu_tools")
class MixedPrecisionOutput(keras.layers.Layer):
    """Applies the output activation in float32, whatever the dtype policy.

    Under `mixed_float16` or `mixed_bfloat16` every layer computes in 16
    bits, the model's output layer too. A softmax or sigmoid computed in
    float16 rounds probabilities below 6e-8 to 0 (their log is -inf) and
    turns logits beyond 65504 into inf and NaN; in bfloat16 probabilities
    keep only 2-3 significant digits. This layer casts its input to float32
    and applies the activation in float32, so the model's predictions, the
    loss and its gradient start from float32 values. Put it last, after a
    linear layer:

    - `"softmax"` / `"log_softmax"` (over `axis`): computed stably in float32
      (shifted by the maximum), so they neither underflow nor overflow.
    - `"sigmoid"`, or any activation `keras.layers.Activation` accepts: a
      name or a callable.
    - None or `"linear"`: a float32 cast only, for losses with
      `from_logits=True`.

    Its dtype policy is always `"float32"`: it is stored in the layer's
    config, so a model saved to `.keras` and loaded under another global
    policy still has a float32 output. The layer has no weights and passes
    masks through.

    Args:
        activation: the activation to apply: a name from `keras.activations`,
            a callable, or None for none. Defaults to `None`.
        axis: the axis, or a tuple of axes, of `"softmax"` and
            `"log_softmax"`; other activations take no axis. Defaults to `-1`.
        **kwargs: base layer arguments such as `name`. `dtype` may only be
            `"float32"`, the layer's dtype anyway.

    Example:

    ```python
    import keras
    from keras_gpu_tools.layers import MixedPrecisionOutput

    keras.mixed_precision.set_dtype_policy("mixed_float16")
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),                  # logits, float16
        MixedPrecisionOutput("softmax"),         # probabilities, float32
    ])
    model.compile("adam", "sparse_categorical_crossentropy")
    ```
    """

    def __init__(
        self,
        activation: str | Callable | None = None,
        axis: int | Sequence[int] = -1,
        **kwargs: Any,
    ):
        dtype = kwargs.pop("dtype", None)
        if dtype is not None:
            try:
                policy = keras.dtype_policies.get(dtype)
            except Exception:
                policy = None
            if getattr(policy, "name", None) != "float32":
                raise ValueError(
                    "Invalid value for argument `dtype`. "
                    f"Received: dtype={dtype!r}. Expected None or 'float32': "
                    "MixedPrecisionOutput always computes in float32."
                )
        if activation is not None and not (isinstance(activation, str) or callable(activation)):
            raise TypeError(
                "Invalid value for argument `activation`. "
                f"Received: activation={activation!r} of type {type(activation).__name__}. "
                "Expected the name of an activation (such as 'softmax'), a callable, or None."
            )
        try:
            fn = keras.activations.get(activation)
        except ValueError:
            fn = None
        if fn is None:
            raise ValueError(
                "Invalid value for argument `activation`. "
                f"Received: activation={activation!r}. Expected the name of an activation in "
                "`keras.activations` (such as 'softmax', 'sigmoid', 'log_softmax' or 'linear'), "
                "a callable, or None."
            )
        axis_ok = (isinstance(axis, numbers.Integral) and not isinstance(axis, bool)) or (
            isinstance(axis, (tuple, list))
            and len(axis) > 0
            and all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in axis)
            and len(set(axis)) == len(axis)
        )
        if not axis_ok:
            raise TypeError(
                "Invalid value for argument `axis`. "
                f"Received: axis={axis!r}. Expected an int or a non-empty tuple of distinct ints."
            )
        takes_axis = any(_is_activation(fn, n) for n in _AXIS_ACTIVATIONS)
        if axis != -1 and not takes_axis:
            raise ValueError(
                "Invalid value for argument `axis`. "
                f"Received: axis={axis!r} with activation={activation!r}. Expected the default "
                "axis=-1: only 'softmax' and 'log_softmax' take an axis."
            )
        super().__init__(dtype="float32", **kwargs)
        self.activation = fn
        # Checked above: an Integral or a tuple/list of them (typeshed's int is no numbers.Integral).
        self.axis = (
            int(axis) if isinstance(axis, numbers.Integral) else tuple(int(a) for a in cast(Sequence[int], axis))
        )
        self.supports_masking = True
        self._build_at_init()  # no weights to create

    def call(self, inputs):
        # The base layer already autocasts floating inputs to the float32
        # compute dtype; the cast here also covers integer inputs and
        # layers called with autocasting turned off.
        x = ops.cast(inputs, "float32")
        if _is_activation(self.activation, "softmax") or _is_activation(self.activation, "log_softmax"):
            log = _is_activation(self.activation, "log_softmax")
            if isinstance(self.axis, tuple):
                return _stable_softmax(x, self.axis, log)
            # keras.activations.softmax is max-shifted on every backend and
            # keeps the float32 logits for the crossentropy losses.
            return self.activation(x, axis=self.axis)
        return ops.cast(self.activation(x), "float32")

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "activation": keras.activations.serialize(self.activation),
                "axis": list(self.axis) if isinstance(self.axis, tuple) else self.axis,
            }
        )
        return config
