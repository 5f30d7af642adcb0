"""Keras's compiled per-batch step inside each backend's train function (TensorFlow, JAX).

The train function Keras builds closes over its compiled per-batch step; a
batch fetched in Python runs through that step directly (sampled steps, the
OOM reducer's idle path) and the JAX step is lowered for XLA's cost and
memory analysis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime import deps


def tf_is_graph_iterator(iterator) -> bool:
    """True for the iterators that make Keras run its compiled multi-step loop."""
    tf = deps.loaded("tensorflow")
    if tf is None:
        return False
    return isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))


def tf_run_batches(train_function: Callable, batches: list[Any]):
    """Runs already fetched batches through Keras's Python branch.

    Any non-``tf.data`` iterable makes the TensorFlow train function call its
    compiled per-batch ``one_step_on_data`` once per element (at most
    ``steps_per_execution`` elements): the same step on the same batches.
    """
    return train_function(iter(batches))


def tf_batch_step(train_function: Callable, batch) -> Callable | None:
    """Keras's compiled per-batch TF step for this batch's signature, as a concrete function, or None.

    Keras's Python branch (``tf_run_batches``) calls ``one_step_on_data``: a
    wrapper that maps ``tf.experimental.Optional`` leaves to None, around a
    ``tf.function``. Resolving that function for the batch's shapes and
    dtypes once, and calling the concrete function it dispatches to, runs
    the same traced graph without the per-call dispatch, a sizeable share of
    a small model's step.
    None where there is no such function (``run_eagerly``, another Keras),
    where functions are set to run eagerly
    (``tf.config.run_functions_eagerly``), or the batch holds an ``Optional``.
    """
    tf = deps.loaded("tensorflow")
    function = tf_step_function(train_function)
    if tf is None or function is None or tf.config.functions_run_eagerly():
        return None
    if any(isinstance(leaf, tf.experimental.Optional) for leaf in tf.nest.flatten(batch)):
        return None
    return function.get_concrete_function(batch)


def tf_step_function(train_function: Callable):
    """The ``tf.function`` of Keras's per-batch TF step (inside ``one_step_on_data``), or None."""
    function = _closure_var(_closure_var(train_function, "one_step_on_data"), "step_func")
    return function if hasattr(function, "get_concrete_function") else None


def jax_step_function(train_function: Callable) -> Callable | None:
    """The jitted per-batch step the JAX train function closes over, or None."""
    fn = _closure_var(train_function, "step_function")
    return fn if hasattr(fn, "lower") else None


def jax_batch_step(train_function: Callable) -> Callable | None:
    """``step(state, batch)`` where ``train_function`` is Keras's one-batch JAX function, else None.

    With ``steps_per_execution=1`` Keras's function is
    ``iterator_step(state, iterator) = step_function(state, next(iterator))``
    (closing over ``step_function`` alone): a batch in hand then runs through
    ``step_function`` with no iterator built for it.
    """
    code = getattr(train_function, "__code__", None)
    if code is None or code.co_name != "iterator_step" or code.co_freevars != ("step_function",):
        return None
    fn = _closure_var(train_function, "step_function")
    return fn if callable(fn) else None


def _closure_var(fn, name: str):
    """The value of the variable ``name`` that the function ``fn`` closes over, or None."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return None
    cell = dict(zip(code.co_freevars, cells)).get(name)
    return cell.cell_contents if cell is not None else None


def compiled_in(function: Callable | None, marker: str, depth: int = 4) -> list[Any]:
    """The compiled functions a Keras train/test/predict function closes over: objects with attribute ``marker``.

    ``marker`` names what tells a compiled function of the framework
    (``"experimental_get_tracing_count"`` for a ``tf.function``, ``"_cache_size"``
    for a ``jax.jit`` function). The step hook's wrapper is looked through
    (``__wrapped__``); closures are followed ``depth`` levels deep.
    """
    found: dict[int, Any] = {}
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> None:
        if obj is None or id(obj) in seen or level > depth:
            return
        seen.add(id(obj))
        if hasattr(obj, marker) and not isinstance(obj, type):
            found[id(obj)] = obj
            return
        inner = getattr(obj, "__wrapped__", None)
        if inner is not None and callable(inner):
            visit(inner, level)
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(value):
                visit(value, level + 1)

    visit(function, 0)
    return list(found.values())
