"""The optimizer as the OOM reducer uses it: its apply routed to an accumulator, its step counter, its variables."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.errors import KerasInternalsError
from keras_gpu_tools.runtime.keras_internals.patching import patched


@contextlib.contextmanager
def capture_apply(optimizer, sink: Callable, weight=None, on_scaled: Callable | None = None, stateless: bool = False):
    """Routes the optimizer call of ``train_step`` to ``sink`` while the block runs.

    ``sink(grads, variables)`` replaces ``optimizer.apply`` (TensorFlow, torch).
    With ``stateless`` (JAX), ``sink(grads)`` is called by a replacement of ``stateless_apply`` that
    returns the variables unchanged.

    With ``weight``, ``optimizer.scale_loss`` (which every backend's
    ``train_step`` calls on the loss before differentiating it; it applies the
    loss scale of ``mixed_float16``) also multiplies the loss by ``weight``, so
    a micro-batch's gradients are computed at the magnitude they have in the
    whole batch (a float16 backward pass would otherwise overflow sooner);
    ``on_scaled()`` tells that it was called.
    """
    name = "stateless_apply" if stateless else "apply"
    if not callable(getattr(optimizer, name, None)):
        raise KerasInternalsError(f"keras_gpu_tools: the optimizer has no `{name}` to accumulate gradients through.")
    with patched(
        optimizer, "scale_loss", _weighted_scale_loss(optimizer, weight, on_scaled) if weight is not None else None
    ):
        with _capture(optimizer, name, stateless, sink):
            yield


def _weighted_scale_loss(optimizer, weight, on_scaled):
    original = optimizer.scale_loss

    def scale_loss(loss):
        if on_scaled is not None:
            on_scaled()
        return original(loss) * (weight() if callable(weight) else weight)  # a function: per replica

    return scale_loss


def _capture(optimizer, name: str, stateless: bool, sink: Callable):
    """Replaces ``optimizer.<name>`` (apply / stateless_apply) by a sink while the block runs."""

    def stateless_apply(optimizer_variables, grads, trainable_variables):
        sink(list(grads))
        return list(trainable_variables), list(optimizer_variables)

    def apply(grads, trainable_variables=None):
        sink(list(grads), list(trainable_variables) if trainable_variables is not None else None)

    return patched(optimizer, name, stateless_apply if stateless else apply)


def iterations_variable(optimizer):
    """The optimizer's own step counter variable (``optimizer.iterations`` may be a derived tensor)."""
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        v = getattr(opt, "_iterations", None) if opt is not None else None
        if v is not None and hasattr(v, "assign"):
            return v
    return None


def iterations_value(model) -> int | None:
    v = iterations_variable(getattr(model, "optimizer", None))
    if v is None:
        return None
    try:
        import keras

        return int(keras.ops.convert_to_numpy(v.value))
    except Exception:
        return None


def other_optimizers(model) -> list[Any]:
    """Optimizers the model holds besides ``model.optimizer`` (a GAN's second one, say)."""
    import keras

    own = getattr(model, "optimizer", None)
    mine = {id(own), id(getattr(own, "inner_optimizer", None))}
    found, seen = [], set()

    def visit(value, depth):
        if isinstance(value, keras.optimizers.Optimizer):
            if id(value) not in mine and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
        elif depth < 2 and isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)
        elif depth < 2 and isinstance(value, dict):
            for v in value.values():
                visit(v, depth + 1)

    for name, value in vars(model).items():
        if name != "optimizer":
            visit(value, 0)
    return found


def optimizer_variables_list(optimizer) -> list[Any]:
    """The variables an optimizer was built for (what ``apply(grads)`` without variables updates)."""
    return list(getattr(optimizer, "_trainable_variables", None) or [])
