"""The Keras internals the OOMBatchSizeReducer relies on, in one place.

Read from keras 3.15.1 (see ``KERAS-INTERNALS.md``):

- The shared :class:`~keras_gpu_tools._core.step_hook.StepHook` runs, per
  call, the function its observers' ``inner(fn)`` return in place of Keras's
  train function, so the retrying runs *inside* the shared hook: the other
  observers see one (possibly retried) call, and on TensorFlow we get the
  ``tf.data`` iterator itself and can fetch the batch in Python before the
  step (a batch pulled inside the compiled loop is gone after an OOM).
- Every backend's ``train_step`` hands its gradients to the optimizer through
  one call: ``optimizer.apply(grads, vars)`` (TensorFlow via
  ``apply_gradients``, torch) or ``optimizer.stateless_apply(opt_vars, grads,
  vars)`` (JAX). :func:`capture_apply` replaces that call, on the instance,
  while a micro-batch step runs (and is traced), so the model's own
  ``train_step`` (custom ones included) computes the gradients, the metrics
  and the non-trainable updates, and we apply the accumulated gradients once.
- JAX: the state is the 4-tuple (trainable, non-trainable, optimizer,
  metrics variables), lists of arrays in the order of
  ``model.trainable_variables``, ``model.non_trainable_variables``,
  ``optimizer.variables``, ``model.metrics_variables``.
- TensorFlow: the train function runs a Python loop over
  ``one_step_on_data`` for any iterable that is not a ``tf.data`` iterator;
  ``compat.tf_run_batches`` runs fetched batches that way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from keras_gpu_tools._core import compat, deps

logger = logging.getLogger("keras_gpu_tools")


# -- the optimizer's apply ---------------------------------------------------------
@contextlib.contextmanager
def capture_apply(optimizer, backend: str, sink: Callable, weight=None, on_scaled: Callable | None = None):
    """Routes the optimizer call of ``train_step`` to ``sink`` while the block runs.

    TensorFlow/torch: ``sink(grads, variables)`` replaces ``optimizer.apply``.
    JAX: ``sink(grads)`` is called by a replacement of ``stateless_apply`` that
    returns the variables unchanged.

    With ``weight``, ``optimizer.scale_loss`` (which every backend's
    ``train_step`` calls on the loss before differentiating it; it applies the
    loss scale of ``mixed_float16``) also multiplies the loss by ``weight``, so
    a micro-batch's gradients are computed at the magnitude they have in the
    whole batch (a float16 backward pass would otherwise overflow sooner);
    ``on_scaled()`` tells that it was called.
    """
    name = "stateless_apply" if backend == "jax" else "apply"
    if not callable(getattr(optimizer, name, None)):
        raise compat.KerasInternalsError(
            f"keras_gpu_tools: the optimizer has no `{name}` to accumulate gradients through."
        )
    with _patched(
        optimizer, "scale_loss", _weighted_scale_loss(optimizer, weight, on_scaled) if weight is not None else None
    ):
        with _capture(optimizer, name, backend, sink):
            yield


def _weighted_scale_loss(optimizer, weight, on_scaled):
    original = optimizer.scale_loss

    def scale_loss(loss):
        if on_scaled is not None:
            on_scaled()
        return original(loss) * weight

    return scale_loss


@contextlib.contextmanager
def _patched(obj, name: str, value):
    if value is None:
        yield
        return
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        if had:
            object.__setattr__(obj, name, old)
        else:
            try:
                object.__delattr__(obj, name)
            except AttributeError:
                pass


def _capture(optimizer, name: str, backend: str, sink: Callable):
    """Replaces ``optimizer.<name>`` (apply / stateless_apply) by a sink while the block runs."""
    if backend == "jax":

        def replacement(optimizer_variables, grads, trainable_variables):
            sink(list(grads))
            return list(trainable_variables), list(optimizer_variables)
    else:

        def replacement(grads, trainable_variables=None):
            sink(list(grads), list(trainable_variables) if trainable_variables is not None else None)

    return _patched(optimizer, name, replacement)


def real_apply(optimizer, backend: str) -> Callable:
    return optimizer.stateless_apply if backend == "jax" else optimizer.apply


# -- state -----------------------------------------------------------------------------
def jax_state_parts(state):
    if not isinstance(state, (tuple, list)) or len(state) != 4:
        raise compat.KerasInternalsError(
            "keras_gpu_tools: the JAX train function's state is not the 4-tuple of Keras 3.15"
        )
    return state


def jax_hand_back_state(model, state) -> None:
    """Lets fit()'s final ``jax_state_sync`` write ``state`` into the model's variables.

    After an error in the first step Keras has no state to write back and the
    model's variables stay purged; this gives it the state from before the
    failed attempt.
    """
    try:
        tv, ntv, ov, mv = jax_state_parts(state)
        model._jax_state = {
            "trainable_variables": tv,
            "non_trainable_variables": ntv,
            "optimizer_variables": ov,
            "metrics_variables": mv,
        }
        model._jax_state_synced = False
    except Exception:
        logger.debug("keras_gpu_tools: could not hand the JAX state back to the model", exc_info=True)


def variables_of(model, which: str) -> list[Any]:
    """Keras variables of ``model``: ``all``, or ``small`` (non-trainable, metrics, the optimizer's counters)."""
    out, seen = [], set()

    def add(vs):
        for v in vs or []:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)

    opt = getattr(model, "optimizer", None)
    if which == "all":
        add(model.trainable_variables)
        add(model.non_trainable_variables)
        add(getattr(opt, "variables", None))
        add(model.metrics_variables)
    else:
        add(model.non_trainable_variables)
        add(model.metrics_variables)
        if opt is not None:
            # The optimizer's scalar variables: its step counter, and a
            # LossScaleOptimizer's scale and counter.
            add([v for v in getattr(opt, "variables", []) or [] if len(getattr(v, "shape", (1,))) == 0])
    return out


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


def tf_fetch(iterator, n: int) -> list[Any]:
    """Up to ``n`` batches pulled from the train function's iterator in Python."""
    end = compat.tf_end_of_data_errors()
    batches = []
    for _ in range(n):
        try:
            batches.append(next(iterator))
        except end:
            break
    return batches


def tf_check_strategy(model) -> str | None:
    strategy = getattr(model, "distribute_strategy", None)
    n = getattr(strategy, "num_replicas_in_sync", 1)
    if n and n > 1:
        return (
            f"OOMBatchSizeReducer does not support a tf.distribute strategy with {n} replicas "
            f"({type(strategy).__name__}); train on one device or remove the callback."
        )
    return None


def jax_device_memory() -> dict:
    """The first JAX device's memory figures (empty where it reports none, e.g. CPU)."""
    jax = deps.loaded("jax")
    if jax is None:
        return {}
    try:
        dev = jax.local_devices()[0]
        stats = dev.memory_stats() or {}
        out = {"device": getattr(dev, "device_kind", str(dev))}
        for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use"):
            if k in stats:
                out[k] = int(stats[k])
        return out
    except Exception:
        return {}


def torch_device_memory() -> dict:
    torch = deps.loaded("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_available():
            return {}
        i = torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(i)
        return {
            "device": torch.cuda.get_device_name(i),
            "bytes_limit": int(total),
            "bytes_in_use": int(torch.cuda.memory_allocated(i)),
            "peak_bytes_in_use": int(torch.cuda.max_memory_allocated(i)),
        }
    except Exception:
        return {}


def tf_device_memory() -> dict:
    tf = deps.loaded("tensorflow")
    if tf is None:
        return {}
    try:
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            return {}
        info = tf.config.experimental.get_memory_info("GPU:0")
        return {
            "device": "GPU:0",
            "bytes_in_use": int(info.get("current", 0)),
            "peak_bytes_in_use": int(info.get("peak", 0)),
        }
    except Exception:
        return {}


def device_memory(backend: str) -> dict:
    return {"jax": jax_device_memory, "torch": torch_device_memory, "tensorflow": tf_device_memory}.get(backend, dict)()


def iter_one(batch) -> Iterator:
    return iter([batch])
