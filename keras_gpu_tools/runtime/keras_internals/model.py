"""The model as the package reads it: its layers, its call, its variables and the JAX train state."""

from __future__ import annotations

import logging
from typing import Any

from keras_gpu_tools.errors import KerasInternalsError
from keras_gpu_tools.runtime.keras_internals.version import internals_error

logger = logging.getLogger("keras_gpu_tools")


def all_layers(model) -> list[Any]:
    """Every layer of the model, nested ones included (``Layer._flatten_layers``)."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model, *getattr(model, "layers", [])]


def sublayers(layer) -> list[Any]:
    """The layers ``layer`` tracks directly (``Layer._flatten_layers(recursive=False)``), nested ones not included."""
    flatten = getattr(layer, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []))


def symbolic_calls(layer) -> int:
    """How many times ``layer`` was called on symbolic inputs (``Layer._inbound_nodes``): a shared layer's call count."""
    return len(getattr(layer, "_inbound_nodes", None) or ())


def training_kwargs(model, training: bool) -> dict[str, Any]:
    """``{"training": training}`` where the model's ``call`` takes it: ``stateless_call`` passes keywords on as they are."""
    return {"training": training} if getattr(model, "_call_has_training_arg", True) else {}


def jax_state_parts(state):
    if not isinstance(state, (tuple, list)) or len(state) != 4:
        raise KerasInternalsError("keras_gpu_tools: the JAX train function's state is not the 4-tuple of Keras 3.15")
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


def jax_write_variables(model, kind: str, state) -> None:
    """Writes a JAX evaluation (``test``: tv, ntv, mv) or prediction (``predict``: tv, ntv) state into the model.

    After an error inside ``evaluate()``/``predict()``, Keras never syncs the
    state it took from the model (and purged from its variables); this puts
    the state from before the failed attempt back.
    """
    try:
        groups = [model.trainable_variables, model.non_trainable_variables]
        if kind == "test":
            groups.append(model.metrics_variables)
        for variables, values in zip(groups, state):
            for v, value in zip(variables, values):
                v.assign(value)
    except Exception:
        logger.debug("keras_gpu_tools: could not write the JAX state back into the model", exc_info=True)


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


def build_for_training(model, batch) -> None:
    """Builds the model, its compiled losses and metrics and the optimizer for ``batch`` (``Trainer._symbolic_build``).

    What ``fit()`` does before its first step, from the batch's shapes only:
    afterwards every variable a training step touches exists, so a copy of
    them taken now is the whole state.
    """
    x, y = batch
    build = getattr(model, "_symbolic_build", None)
    if not callable(build):
        raise internals_error("`Trainer._symbolic_build(data_batch=...)`")
    build(data_batch=(x, y) if y is not None else (x,))


def jax_state_of(model) -> tuple:
    """The 4-tuple state a JAX train step takes, from the model's variables (``JAXTrainer._get_jax_state``)."""
    get = getattr(model, "_get_jax_state", None)
    if not callable(get):
        raise internals_error("`JAXTrainer._get_jax_state`")
    return jax_state_parts(
        get(
            trainable_variables=True,
            non_trainable_variables=True,
            optimizer_variables=True,
            metrics_variables=True,
            purge_model_variables=False,
        )
    )


def jax_data_parallel() -> tuple[int, Any]:
    """``(replicas, distribution)`` of the Keras distribution in effect (1, None without one)."""
    import keras

    dist = keras.distribution.distribution()
    if dist is None:
        return 1, None
    mesh = getattr(dist, "device_mesh", None)
    if mesh is None:
        return 1, dist
    names = list(getattr(mesh, "axis_names", []) or [])
    batch_dim = getattr(dist, "batch_dim_name", None) or (names[0] if names else None)
    shape = list(getattr(mesh, "shape", []) or [])
    if batch_dim in names and len(shape) == len(names):
        return int(shape[names.index(batch_dim)]), dist
    return 1, dist


def jax_batch_sharding(dist, shape: tuple[int, ...]):
    """The sharding fit() gives an input of ``shape`` under ``dist`` (its data layout), or None."""
    if dist is None:
        return None
    try:
        return dist.get_data_layout(shape).backend_layout
    except Exception:
        return None


def global_seed_generator():
    """Keras's global `SeedGenerator` (what `keras.random` draws from without a seed), or None if none was made.

    Read from Keras's global state without creating one.
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError as e:
        raise internals_error("`keras.src.backend.common.global_state`") from e
    found = global_state.get_global_attribute("global_seed_generator")
    return found if hasattr(found, "state") else None


def named_objects() -> int | None:
    """Keras objects (layers, models, optimizers, ...) named since the last ``keras.backend.clear_session()``.

    The sum of Keras's global name counters (``object_name_uids``), which
    ``clear_session()`` resets: it grows with every model built without one.
    None where this Keras keeps them elsewhere.
    """
    try:
        from keras.src.backend.common import global_state

        uids = global_state.get_global_attribute("object_name_uids")
    except Exception:
        return None
    if uids is None:
        return 0
    try:
        return int(sum(uids.values()))
    except Exception:
        return None


def compile_arguments(model) -> dict[str, Any]:
    """The arguments ``model.compile`` was called with, as given (``Trainer._compile_config.config``).

    A clone or a re-compile takes them; the optimizer among them is the
    instance the model trains with where one was passed (a name otherwise).
    """
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(config, dict):
        raise internals_error("Trainer._compile_config.config (the arguments of model.compile)")
    return dict(config)
