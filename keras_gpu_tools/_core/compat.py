"""Every use of Keras internals, in one place.

Keras gives a callback no supported way to time a training step. What this
package relies on (read from keras 3.15.1; see ``KERAS-INTERNALS.md``):

- ``fit()`` calls ``make_train_function()`` before ``on_train_begin`` and reads
  ``model.train_function`` anew at every step, so a callback may replace it.
- The train function's arguments per backend: TensorFlow ``f(iterator)``, which
  runs a compiled loop for a ``tf.data`` iterator and a Python loop over
  ``one_step_on_data`` for any other iterable; JAX ``f(state, iterator)``, which
  calls ``next(iterator)`` in Python; torch ``f(batches)`` with the batches
  already fetched by the epoch iterator (a local of ``fit()`` named
  ``epoch_iterator``, whose ``_get_iterator()`` makes each epoch's iterator).
- ``fit()`` keeps its ``CallbackList`` in a local named ``callbacks``.
- JAX: the train function closes over the jitted per-batch step as
  ``step_function``.

Each helper checks what it needs and raises :class:`KerasInternalsError`, which
names the installed Keras version, when a Keras release has changed it. No
module-level Keras import: this module is part of ``_core``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from keras_gpu_tools._core import deps
from keras_gpu_tools._core.lifecycle import find_fit_frame
from keras_gpu_tools.errors import KerasInternalsError

TESTED_KERAS = "3.15.1"


def keras_version() -> str:
    try:
        import keras

        return keras.__version__
    except Exception:  # pragma: no cover - keras is a requirement
        return "unknown"


def _fail(what: str) -> KerasInternalsError:
    return KerasInternalsError(
        f"keras_gpu_tools relies on a Keras internal that this Keras ({keras_version()}) "
        f"does not have: {what}. It was written against keras {TESTED_KERAS}; "
        "please report this with your Keras version."
    )


# -- the train function --------------------------------------------------------
def get_train_function(model) -> Callable:
    if not hasattr(model, "train_function") or not hasattr(model, "make_train_function"):
        raise _fail("`model.train_function` / `model.make_train_function`")
    fn = model.train_function
    if fn is None:  # on_train_begin runs after make_train_function; be safe anyway
        model.make_train_function()
        fn = model.train_function
    if not callable(fn):
        raise _fail("a callable `model.train_function` at on_train_begin")
    return fn


def set_train_function(model, fn: Callable) -> None:
    model.train_function = fn


def steps_per_execution(model) -> int:
    return int(getattr(model, "steps_per_execution", 1) or 1)


# -- TensorFlow ----------------------------------------------------------------
def tf_is_graph_iterator(iterator) -> bool:
    """True for the iterators that make Keras run its compiled multi-step loop."""
    tf = deps.loaded("tensorflow")
    if tf is None:
        return False
    return isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))


def tf_end_of_data_errors() -> tuple:
    tf = deps.loaded("tensorflow")
    return (StopIteration, tf.errors.OutOfRangeError) if tf is not None else (StopIteration,)


def tf_run_batches(train_function: Callable, batches: list[Any]):
    """Runs already fetched batches through Keras's Python branch.

    Any non-``tf.data`` iterable makes the TensorFlow train function call its
    compiled per-batch ``one_step_on_data`` once per element (at most
    ``steps_per_execution`` elements): the same step on the same batches.
    """
    return train_function(iter(batches))


# -- JAX -----------------------------------------------------------------------
def jax_step_function(train_function: Callable) -> Callable | None:
    """The jitted per-batch step the JAX train function closes over, or None."""
    code = getattr(train_function, "__code__", None)
    cells = getattr(train_function, "__closure__", None)
    if code is None or not cells:
        return None
    names = dict(zip(code.co_freevars, cells))
    cell = names.get("step_function")
    if cell is None:
        return None
    fn = cell.cell_contents
    return fn if hasattr(fn, "lower") else None


# -- the locals of fit() ---------------------------------------------------------
def fit_locals(model) -> dict[str, Any]:
    """The locals of the running ``model.fit`` (empty outside fit)."""
    import sys

    frame = find_fit_frame(model, sys._getframe(1))
    if frame is None:
        return {}
    try:
        return dict(frame.f_locals)
    finally:
        del frame


def find_callback_list(model) -> list[Any]:
    """The callbacks of the running fit(), or [] where they cannot be found."""
    cbs = fit_locals(model).get("callbacks")
    inner = getattr(cbs, "callbacks", None)
    return list(inner) if isinstance(inner, list) else []


def find_epoch_iterator(model):
    """The training ``EpochIterator`` of the running fit(), or None."""
    ei = fit_locals(model).get("epoch_iterator")
    if ei is None or not hasattr(ei, "_get_iterator") or not hasattr(ei, "data_adapter"):
        return None
    return ei


def training_data(model) -> dict[str, Any]:
    """What fit() is training on: the adapter and the user's ``x``."""
    loc = fit_locals(model)
    ei = loc.get("epoch_iterator")
    return {"adapter": getattr(ei, "data_adapter", None), "x": loc.get("x")}


class _TimedIterable:
    def __init__(self, inner, on_fetch: Callable[[float], None], clock: Callable[[], float]):
        self._inner = inner
        self._on_fetch = on_fetch
        self._clock = clock

    def __iter__(self):
        t = self._clock()
        it = iter(self._inner)  # DataLoader workers start here
        self._on_fetch(self._clock() - t)
        return _TimedIterator(it, self._on_fetch, self._clock)


class _TimedIterator:
    __slots__ = ("_it", "_on_fetch", "_clock")

    def __init__(self, it, on_fetch, clock):
        self._it = it
        self._on_fetch = on_fetch
        self._clock = clock

    def __iter__(self):
        return self

    def __next__(self):
        t = self._clock()
        try:
            return next(self._it)
        finally:
            self._on_fetch(self._clock() - t)


def time_epoch_iterator(
    epoch_iterator, on_fetch: Callable[[float], None], clock: Callable[[], float]
) -> Callable[[], None]:
    """Times every batch fetch of a fit()'s epoch iterator; returns the undo.

    Wraps the iterator that ``EpochIterator._get_iterator()`` returns (built
    at the start of each epoch), so each ``next()`` reports its duration. The
    batches and their order are unchanged.
    """
    original = epoch_iterator._get_iterator

    @functools.wraps(original)
    def timed():
        return _TimedIterable(original(), on_fetch, clock)

    epoch_iterator._get_iterator = timed

    def undo():
        if epoch_iterator.__dict__.get("_get_iterator") is timed:
            del epoch_iterator.__dict__["_get_iterator"]

    return undo


# -- describing the input pipeline ------------------------------------------------
def describe_pipeline(model) -> dict[str, Any]:
    """What kind of input fit() consumes, and what can be read about it.

    Returns a dict with ``kind`` (``"tf.data"``, ``"PyDataset"``, ``"generator"``,
    ``"arrays"``, ``"torch DataLoader"``, ``"grain"`` or ``"unknown"``) and
    details per kind. Never raises.
    """
    try:
        found = training_data(model)
    except Exception:
        return {"kind": "unknown"}
    adapter, x = found["adapter"], found["x"]
    name = type(adapter).__name__ if adapter is not None else ""
    info: dict[str, Any] = {"kind": "unknown", "adapter": name}
    try:
        if name == "TFDatasetAdapter":
            info["kind"] = "tf.data"
            info.update(inspect_tf_dataset(x if x is not None else getattr(adapter, "_dataset", None)))
        elif name == "PyDatasetAdapter":
            ds = getattr(adapter, "py_dataset", x)
            info["kind"] = "PyDataset"
            info["workers"] = getattr(ds, "workers", None)
            info["use_multiprocessing"] = getattr(ds, "use_multiprocessing", None)
            info["max_queue_size"] = getattr(ds, "max_queue_size", None)
        elif name == "GeneratorDataAdapter":
            info["kind"] = "generator"
        elif name == "ArrayDataAdapter":
            info["kind"] = "arrays"
            info["batch_size"] = getattr(adapter, "batch_size", None)
        elif name == "TorchDataLoaderAdapter":
            loader = getattr(adapter, "_dataloader", x)
            info["kind"] = "torch DataLoader"
            info["num_workers"] = getattr(loader, "num_workers", None)
            info["pin_memory"] = getattr(loader, "pin_memory", None)
            info["persistent_workers"] = getattr(loader, "persistent_workers", None)
        elif name == "GrainDatasetAdapter":
            info["kind"] = "grain"
    except Exception:
        pass
    return info


_TF_OP_NAMES = {
    "PrefetchDataset": "prefetch",
    "ParallelMapDataset": "parallel_map",
    "MapDataset": "map",
    "CacheDataset": "cache",
    "BatchDataset": "batch",
    "ParallelBatchDataset": "parallel_batch",
    "ShuffleDataset": "shuffle",
    "InterleaveDataset": "interleave",
    "ParallelInterleaveDataset": "parallel_interleave",
    "FlatMapDataset": "flat_map",
    "RepeatDataset": "repeat",
    "OptionsDataset": "options",
    "TakeDataset": "take",
}


def inspect_tf_dataset(dataset) -> dict[str, Any]:
    """The transformations of a ``tf.data.Dataset``, from the end backwards.

    Reads the Python dataset objects (``_inputs()``), which TensorFlow keeps
    for every transformation. ``ops`` lists them last first;
    ``ends_with_prefetch``, ``parallel_map``, ``sequential_map`` and ``cache``
    summarise what matters for input speed.
    """
    ops: list[str] = []
    seen = 0
    stack = [dataset]
    while stack and seen < 200:
        ds = stack.pop(0)
        if ds is None:
            continue
        seen += 1
        cls = type(ds).__name__.lstrip("_")
        ops.append(_TF_OP_NAMES.get(cls, cls))
        inputs = getattr(ds, "_inputs", None)
        try:
            stack = list(inputs()) + stack if callable(inputs) else stack
        except Exception:
            pass
    tail = [op for op in ops if op not in ("options",)]
    return {
        "ops": ops,
        "ends_with_prefetch": bool(tail) and tail[0] == "prefetch",
        "parallel_map": "parallel_map" in ops,
        "sequential_map": "map" in ops,
        "cache": "cache" in ops,
        "interleave": "interleave" in ops,
    }
