"""The compiled losses and what each averages over: the OOM reducer's exact micro-batch weighting.

A micro-batch's loss is routed through :func:`loss_parts` (its numerator and
denominator), so the reducer can divide by the whole batch's denominator and
the micro-batches add up to the batch's loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime.keras_internals.model import all_layers
from keras_gpu_tools.runtime.keras_internals.patching import patched

#: The reductions of a Keras `Loss` whose numerator and denominator :func:`loss_parts` knows.
KNOWN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum")


def flat_losses(model) -> list[Any] | None:
    """The compiled losses, one per output (``CompileLoss._flat_losses``), or None before they are built."""
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None:
        return []
    flat = getattr(compile_loss, "_flat_losses", None)
    return list(flat) if flat is not None else None


def loss_reduction_problem(model) -> str | None:
    """Why the compiled losses' averaging cannot be reproduced over micro-batches, or None.

    Keras builds the compiled losses before ``on_train_begin`` (``_symbolic_build``);
    each is a :class:`keras.losses.Loss` whose ``__call__`` reduces the values
    ``call`` returns. A subclass that overrides ``__call__`` reduces in its own
    way, and ``reduction=None`` returns a loss per sample that Keras's step
    itself then differentiates as a sum on some backends and refuses on others.
    """
    import keras

    if type(model).compute_loss is not keras.Model.compute_loss:
        return (
            f"{type(model).__name__} overrides `compute_loss`, so the loss of a batch is defined by that code, "
            "and what it averages over (and so how to weight each micro-batch) is unknown"
        )
    flat = flat_losses(model)
    if flat is not None:
        losses = [entry.loss for entry in flat]
    else:  # not built yet (TensorFlow builds at the first trace): the losses compile() was given
        from keras.src import tree

        given = getattr(getattr(model, "_compile_loss", None), "_user_loss", None)
        losses = [x for x in tree.flatten(given) if isinstance(x, keras.losses.Loss)] if given is not None else []
    for loss in losses:
        name = getattr(loss, "name", None) or type(loss).__name__
        if type(loss).__call__ is not keras.losses.Loss.__call__:
            return (
                f"the loss {name!r} ({type(loss).__name__}) overrides `Loss.__call__`: a custom reduction, whose "
                "average over a batch cannot be rebuilt from micro-batches"
            )
        if getattr(loss, "reduction", None) not in KNOWN_REDUCTIONS:
            return (
                f"the loss {name!r} has reduction={getattr(loss, 'reduction', None)!r}: it returns a loss per "
                "sample, not one value per batch"
            )
    return None


def expected_additional_losses(model) -> int:
    """The losses Keras adds to the compiled ones by itself: weight and activity regularizers.

    Weight regularization is one scalar per regularized trainable weight; an
    activity regularizer adds one per layer output, divided by the batch size
    (``Layer.__call__``). Both are exact when each micro-batch's is weighted
    by its share of the samples. Anything beyond that count came from a
    layer's own ``add_loss``, whose averaging is the layer's.
    """
    weights = sum(1 for v in model.trainable_weights if getattr(v, "regularizer", None) is not None)
    activity = sum(1 for layer in all_layers(model) if getattr(layer, "activity_regularizer", None) is not None)
    return weights + activity


def loss_parts(loss, y_true, y_pred, sample_weight) -> tuple[Any, Any, dict[str, Any]]:
    """``(numerator, denominator, facts)`` of one compiled loss on one (micro-)batch.

    Mirrors ``Loss.__call__`` and ``reduce_weighted_values`` of Keras 3.15: the
    value Keras returns is ``divide_no_nan(numerator, denominator)``, where the
    numerator is the sum of the values weighted by the sample weights and the
    mask, and the denominator is

    - ``"sum"``: 1;
    - ``"sum_over_batch_size"``/``"mean"``: the number of values, times the
      mask's valid fraction when there is a mask (``apply_mask`` weights valid
      entries by ``total / valid``);
    - ``"mean_with_sample_weight"``: the sum of the (masked) sample weights, or
      the number of values without either.

    ``facts``: ``mask`` (a mask was applied), ``weights`` (sample weights were
    given), ``scalar`` (the loss function returned one value: it averaged by
    itself), ``reduction``.
    """
    import keras
    from keras import ops
    from keras.src import tree
    from keras.src.backend.common.masking import get_keras_mask
    from keras.src.losses.loss import apply_mask, squeeze_or_expand_to_same_rank

    reduction = loss.reduction
    in_mask = get_keras_mask(y_pred)
    with keras.name_scope(loss.name):
        y_pred = tree.map_structure(lambda x: ops.convert_to_tensor(x, dtype=loss.dtype), y_pred)
        y_true = tree.map_structure(lambda x: ops.convert_to_tensor(x, dtype=loss.dtype), y_true)
        values = loss.call(y_true, y_pred)
        out_mask = get_keras_mask(values)
        if in_mask is not None and out_mask is not None:
            mask = in_mask & out_mask
        else:
            mask = in_mask if in_mask is not None else out_mask
        values = ops.convert_to_tensor(values, dtype=loss.dtype)
        facts = {
            "mask": mask is not None,
            "weights": sample_weight is not None,
            "scalar": tuple(values.shape) in ((), (0,)),
            "reduction": reduction,
        }
        if sample_weight is not None:
            # A copy: `apply_mask` multiplies in place (`*=`), which on torch would scale the
            # batch's own weights that the metrics read next.
            sample_weight = ops.copy(ops.convert_to_tensor(sample_weight, dtype=loss.dtype))
        if mask is not None:
            mask = ops.convert_to_tensor(mask, dtype=loss.dtype)
        # The plain mask (0/1): the numerator is the same for every reduction.
        weights = apply_mask(sample_weight, mask, dtype=values.dtype, reduction="sum")
        if weights is not None:
            weights = ops.cast(weights, values.dtype)
            values, weights = squeeze_or_expand_to_same_rank(values, weights)
            numerator = ops.sum(values * weights)
        else:
            numerator = ops.sum(values)
        count = ops.cast(ops.prod(ops.convert_to_tensor(ops.shape(values), dtype="int32")), values.dtype)
        if facts["scalar"] or reduction == "sum":
            denominator = ops.ones((), dtype=values.dtype)
        elif reduction == "mean_with_sample_weight":
            denominator = ops.sum(weights) if weights is not None else count
        elif mask is not None:
            total = ops.cast(ops.prod(ops.convert_to_tensor(ops.shape(mask), dtype="int32")), values.dtype)
            denominator = count * ops.divide_no_nan(ops.sum(mask), total)
        else:
            denominator = count
    return numerator, denominator, facts


class _RoutedLoss:
    """Stands in for one compiled loss: ``CompileLoss.call`` calls it as ``loss(y_true, y_pred, sample_weight)``."""

    def __init__(self, index: int, loss, on_loss: Callable):
        self.index = index
        self.loss = loss
        self.on_loss = on_loss

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Loss.__call__ ends with scale_loss_for_distribution (divided by the replicas of a
        # tf.distribute strategy, which the optimizer sums over): so does the routed loss.
        from keras.src.losses.loss import scale_loss_for_distribution

        return scale_loss_for_distribution(self.on_loss(self.index, self.loss, y_true, y_pred, sample_weight))

    def __getattr__(self, name):  # name, reduction, dtype, ... of the loss itself
        return getattr(self.loss, name)


def _routed_entry(j: int, entry: Any, on_loss: Callable) -> Any:
    """The ``(path, loss, loss_weights, name)`` entry ``j`` with its loss routed (other entries as they are)."""
    if not (isinstance(entry, tuple) and hasattr(entry, "_fields")):
        return entry
    named: Any = entry
    return type(named)(named.path, _RoutedLoss(j, named.loss, on_loss), named.loss_weights, named.name)


@contextlib.contextmanager
def routed_losses(model, on_loss: Callable):
    """While the block runs, each compiled loss ``j`` is computed by ``on_loss(j, loss, y_true, y_pred, sample_weight)``.

    ``CompileLoss.call`` reads ``self._flat_losses`` (``(path, loss,
    loss_weights, name)`` entries) at every call; the entries are replaced by
    ones whose loss is routed, and put back after. Everything else of
    ``CompileLoss.call`` (the structure of outputs, the per-output loss
    metrics, ``loss_weights``) stays Keras's.
    """
    compile_loss = getattr(model, "_compile_loss", None)
    flat = getattr(compile_loss, "_flat_losses", None) if compile_loss is not None else None
    if compile_loss is None or flat is None:
        yield
        return
    routed = [_routed_entry(j, entry, on_loss) for j, entry in enumerate(flat)]
    compile_loss._flat_losses = routed
    try:
        yield
    finally:
        compile_loss._flat_losses = flat


@contextlib.contextmanager
def muted_loss_metrics(model):
    """The per-output loss metrics of ``CompileLoss`` do not update while the block runs (a measuring pass)."""
    compile_loss = getattr(model, "_compile_loss", None)
    metrics = list(getattr(compile_loss, "metrics", None) or []) if compile_loss is not None else []
    with contextlib.ExitStack() as stack:
        for m in metrics:
            stack.enter_context(patched(m, "update_state", lambda *a, **k: None))
        yield


@contextlib.contextmanager
def counted_additional_losses(model, count: Callable[[], None]):
    """Calls ``count()`` for each additional loss (``model.losses``) ``Trainer.compute_loss`` adds."""
    original = model._aggregate_additional_loss

    def aggregate(loss):
        count()
        return original(loss)

    with patched(model, "_aggregate_additional_loss", aggregate):
        yield


def compute_loss_of(model, y, y_pred, sample_weight):
    """The compiled loss of ``(y, y_pred)`` alone (no ``model.losses``): ``CompileLoss.__call__``."""
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None:
        return None
    return compile_loss(y, y_pred, sample_weight)
