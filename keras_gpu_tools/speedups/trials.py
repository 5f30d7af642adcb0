"""Trial models: clones of the user's model, compiled as it was with one change, and what they measure.

:func:`trial_model` clones the model (its weights copied, a fresh optimizer
of the same configuration; its layers' seed states copied too, so that
dropout draws alike in every trial) and compiles it with the user's own arguments and
the change's (``steps_per_execution``, ``jit_compile``); under a mixed
precision policy its layers compute in 16 bits and each output passes
through :class:`~keras_gpu_tools.layers.MixedPrecisionOutput`, its
activation moved there, in float32. Nothing is done to the user's model.
:func:`loss_after` is the numerical check's figure: the loss (evaluated) after K steps
on one batch repeated, from the model's own weights and seed states.

Keras is imported inside the functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.memory.throughput import Candidate
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import map_leaves

ACTIVATION_LAYERS = ("Dense", "Conv1D", "Conv2D", "Conv3D", "Activation", "EinsumDense")


def first_line(e: BaseException) -> str:
    """An error as a report shows it: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def gpu_capabilities(on_gpu: bool) -> list[tuple[int, ...]]:
    """The compute capabilities of the GPUs the step runs on (none on a CPU)."""
    from keras_gpu_tools.mixed_precision.check import gpu_compute_capabilities

    return [tuple(c) for c in gpu_compute_capabilities()] if on_gpu else []


def larger_unmeasured(candidates: Sequence[Candidate], b0: int) -> str | None:
    """Why a plan says nothing about batches over ``b0``: none over it was measured (the reason of the first that
    was not, as the plan gives it); None where one was. A plan at or under the batch given is then no verdict."""
    larger = [c for c in candidates if c.batch_size > b0]
    if any(c.measured for c in larger):
        return None
    return next((c.reason for c in larger if c.reason), "none was planned" if not larger else "none was timed")


def trial_model(model, compile_args: dict[str, Any] | None = None, policy: str | None = None):
    """A clone of ``model`` with its weights, compiled as ``model`` was with ``compile_args`` over its arguments."""
    import keras

    if policy is None:
        clone = keras.models.clone_model(model)
    else:
        clone = _mixed_clone(model, policy)
    _copy_variables(model, clone)
    args = ki.compile_arguments(model)
    optimizer: Any = model.optimizer
    inner: Any = getattr(optimizer, "inner_optimizer", None) or optimizer  # a LossScaleOptimizer's own
    args["optimizer"] = inner.__class__.from_config(inner.get_config())
    args["metrics"] = _fresh(args.get("metrics"))
    args["weighted_metrics"] = _fresh(args.get("weighted_metrics"))
    args.update(compile_args or {})
    clone.compile(**args)
    return clone


def _copy_variables(model, clone) -> None:
    """The model's variables into the clone's: its weights and its layers' seed states (dropout draws alike)."""
    source, target = list(model.variables), list(clone.variables)
    if len(source) != len(target) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(source, target)):
        clone.set_weights(model.get_weights())  # the weights alone, where the seed states do not pair up
        return
    import keras

    for a, b in zip(source, target):
        # A host copy: the clone's training donates its buffers (JAX), which must never be the model's own.
        b.assign(keras.ops.convert_to_numpy(a.value))


def _fresh(metrics: Any) -> Any:
    """The compile metrics with every Metric object replaced by a new one of its config (a clone keeps no state)."""
    import keras

    def fresh(m: Any) -> Any:
        return m.__class__.from_config(m.get_config()) if isinstance(m, keras.metrics.Metric) else m

    return map_leaves(fresh, metrics)


def _mixed_clone(model, policy: str):
    """``model`` rebuilt under ``policy``, its outputs' activations applied in float32 by MixedPrecisionOutput."""
    import keras

    from keras_gpu_tools.layers import MixedPrecisionOutput

    output_layers = {_producer(t) for t in model.outputs}
    moved: dict[str, Any] = {}

    def clone_layer(layer):
        config = layer.get_config()
        config["dtype"] = policy
        if layer.name in output_layers and type(layer).__name__ in ACTIVATION_LAYERS:
            moved[layer.name] = config.get("activation", "linear")
            config["activation"] = "linear"
            config["name"] = f"{layer.name}_logits"
        return layer.__class__.from_config(config)

    clone = keras.models.clone_model(model, clone_function=clone_layer)
    outputs = []
    for t, name in zip(clone.outputs, [_producer(t) for t in model.outputs]):
        activation = moved.get(name)
        outputs.append(MixedPrecisionOutput(activation, name=name)(t) if name in moved else MixedPrecisionOutput()(t))
    return keras.Model(clone.inputs, outputs if len(outputs) > 1 else outputs[0], name=model.name)


def _producer(tensor) -> str:
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) if history is not None else None
    return getattr(layer, "name", "")


def check_steps(steps: int, *models) -> int:
    """The fewest steps, at least ``steps``, that every model runs whole: a multiple of each one's calls.

    A model compiled with ``steps_per_execution=N`` trains N steps per call,
    so the check's models all train one count of steps from the same state.
    """
    return whole_calls(steps, *(int(getattr(m, "steps_per_execution", 1) or 1) for m in models))


def whole_calls(steps: int, *calls: int) -> int:
    """The fewest steps, at least ``steps``, that are whole calls of each of ``calls`` steps."""
    unit = math.lcm(*calls)
    return unit * max(1, -(-steps // unit))


def loss_after(
    model,
    batch: tuple[Any, Any],
    steps: int,
    initial: bool = False,
    before_steps: Callable[[], None] | None = None,
) -> tuple[float, float | None]:
    """The loss on ``batch`` after ``steps`` training steps on it repeated, and before them where ``initial``.

    ``steps`` is a multiple of the model's ``steps_per_execution``
    (:func:`check_steps`). Each loss is evaluated (inference mode: no
    dropout), so that it does not hang on one step's dropout draws, which a
    compiled step draws its own way. ``before_steps`` is called right before
    the steps, once the model is built for training and evaluated (either
    may draw from a framework's global generator).
    """
    x, y = batch
    per_call = int(getattr(model, "steps_per_execution", 1) or 1)
    if steps < 1 or steps % per_call:
        raise ValueError(f"steps={steps}: expected a positive multiple of the model's steps_per_execution ({per_call})")

    def repeat():
        while True:
            yield (x, y) if y is not None else (x,)

    def evaluated() -> float:
        return float(model.evaluate(x, y, batch_size=len(_first(x)), verbose=0, return_dict=True)["loss"])

    ki.build_for_training(model, batch)  # what fit() does first, with or without an evaluation before it
    before = evaluated() if initial else None
    if before_steps is not None:
        before_steps()
    model.fit(repeat(), epochs=steps // per_call, steps_per_epoch=per_call, shuffle=False, verbose=0)
    return evaluated(), before


def _first(tree: Any) -> Any:
    """The first array of a batch's structure."""
    while isinstance(tree, (dict, list, tuple)):
        tree = next(iter(tree.values())) if isinstance(tree, dict) else tree[0]
    return tree


__all__ = ["check_steps", "first_line", "loss_after", "trial_model", "whole_calls"]
