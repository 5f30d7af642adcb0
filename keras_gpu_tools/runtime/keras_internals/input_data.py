"""What fit() trains on: the data adapter, the epoch's batches, the fetch timer, the tf.data pipeline."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime.keras_internals.fit import find_epoch_iterator, training_data


def array_epoch_batches(model) -> int | None:
    """The batches of each epoch where every one but an epoch's last has one shape, else None.

    So it is where fit() cuts dense arrays into batches: Keras's own
    ``ArrayDataAdapter`` (not a subclass) slices ``batch_size`` rows for each
    batch of a pass but the last, whose rows are what is left, and every
    batch holds the same arrays with their dtypes; with no ``steps_per_epoch``
    each epoch is one new pass. Anything else (a dataset, a generator, a set
    ``steps_per_epoch``, a pass of one batch, a ragged or sparse array among
    the inputs): None.
    """
    adapter = _array_adapter(model)
    if adapter is None:
        return None
    from keras import tree

    try:
        if not all(_dense(a) for a in tree.flatten(adapter._inputs)):
            return None
    except Exception:  # the adapter's inputs not where they were
        return None
    n = getattr(adapter, "num_batches", None)
    return n if isinstance(n, int) and n > 1 else None


def array_epoch_samples(model) -> int | None:
    """The examples of each epoch where fit() trains on arrays, one pass an epoch; else None.

    Keras's own ``ArrayDataAdapter`` with no ``steps_per_epoch``: every batch
    of a pass holds ``batch_size`` rows but the last, which holds what is left.
    """
    adapter = _array_adapter(model)
    if adapter is None:
        return None
    try:
        batches, size, partial = int(adapter.num_batches), int(adapter.batch_size), adapter.partial_batch_size
    except Exception:  # the adapter's properties not what they were
        return None
    return (batches - 1) * size + (int(partial) if partial else size) if batches > 0 else None


def _array_adapter(model) -> Any:
    """fit()'s data adapter where it is Keras's own ``ArrayDataAdapter`` with no ``steps_per_epoch``, else None."""
    ei = find_epoch_iterator(model)
    adapter = getattr(ei, "data_adapter", None)
    kind = type(adapter)
    if (
        adapter is None
        or kind.__name__ != "ArrayDataAdapter"
        or not kind.__module__.startswith("keras.src.trainers.data_adapters")
        or getattr(ei, "steps_per_epoch", None) is not None
    ):
        return None
    return adapter


def _dense(a) -> bool:
    """Whether every batch sliced from the array ``a`` keeps its trailing shape and dtype.

    A ragged tensor is padded per batch (to the batch's longest row) and a
    sparse one may change its stored entries: neither qualifies. Dense
    arrays of NumPy, JAX, TensorFlow and torch, and pandas frames, do.
    """
    import numpy as np

    if a is None or isinstance(a, np.ndarray):
        return True
    name, module = type(a).__name__, type(a).__module__
    if module.startswith("pandas"):
        return name in ("DataFrame", "Series")
    if module.startswith("tensorflow"):
        return name not in ("RaggedTensor", "SparseTensor") and hasattr(a, "shape")
    if module.startswith(("jax", "jaxlib")):
        return not module.startswith("jax.experimental.sparse") and hasattr(a, "shape")
    if module.startswith("torch"):
        return getattr(a, "layout", None) is not None and str(a.layout) == "torch.strided"
    return False


class _TimedIterable:
    def __init__(self, inner, on_fetch: Callable[[float], None], clock: Callable[[], float], when):
        self._inner = inner
        self._on_fetch = on_fetch
        self._clock = clock
        self._when = when

    def __iter__(self):
        t = self._clock()
        it = iter(self._inner)  # DataLoader workers start here
        if self._when():  # part of the first call's fetch, when that call is timed
            self._on_fetch(self._clock() - t)
        return _TimedIterator(it, self._on_fetch, self._clock, self._when)


class _TimedIterator:
    __slots__ = ("_it", "_on_fetch", "_clock", "_when")

    def __init__(self, it, on_fetch, clock, when):
        self._it = it
        self._on_fetch = on_fetch
        self._clock = clock
        self._when = when

    def __iter__(self):
        return self

    def __next__(self):
        if not self._when():  # a fetch nobody measures costs one call
            return next(self._it)
        t = self._clock()
        try:
            return next(self._it)
        finally:
            self._on_fetch(self._clock() - t)


def time_epoch_iterator(
    epoch_iterator,
    on_fetch: Callable[[float], None],
    clock: Callable[[], float],
    when: Callable[[], bool] = lambda: True,
) -> Callable[[], None]:
    """Times every batch fetch of a fit()'s epoch iterator; returns the undo.

    Wraps the iterator that ``EpochIterator._get_iterator()`` returns (built
    at the start of each epoch), so each ``next()`` reports its duration, when
    ``when()`` says it is wanted. The batches and their order are unchanged.
    """
    original = epoch_iterator._get_iterator

    @functools.wraps(original)
    def timed():
        return _TimedIterable(original(), on_fetch, clock, when)

    epoch_iterator._get_iterator = timed

    def undo():
        if epoch_iterator.__dict__.get("_get_iterator") is timed:
            del epoch_iterator.__dict__["_get_iterator"]

    return undo


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


def inspect_tf_dataset(dataset) -> dict[str, Any]:
    """The transformations of a ``tf.data.Dataset``, from the end backwards.

    Reads the Python dataset objects (``_inputs()``), which TensorFlow keeps
    for every transformation. ``ops`` lists them last first;
    ``ends_with_prefetch``, ``parallel_map``, ``sequential_map``, ``cache`` and
    ``interleave`` summarise what matters for input speed; ``after_cache``
    lists the transformations after ``cache()`` (last first): once the cache
    is filled, they are all that runs.
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
        op = _TF_OP_NAMES.get(cls, cls)
        if op in ("tfrecord", "text_line", "fixed_length_record") and getattr(ds, "_num_parallel_reads", None):
            op = "parallel_interleave"  # a reader with num_parallel_reads interleaves its files
        ops.append(op)
        inputs = getattr(ds, "_inputs", None)
        try:
            stack = list(inputs()) + stack if callable(inputs) else stack
        except Exception:
            pass
    tail = [op for op in ops if op not in ("options",)]
    # What runs after the cache once it is filled (last first); the source and
    # the maps before it run only while it fills.
    after_cache = ops[: ops.index("cache")] if "cache" in ops else []
    return {
        "ops": ops,
        "ends_with_prefetch": bool(tail) and tail[0] == "prefetch",
        "parallel_map": "parallel_map" in ops,
        "sequential_map": "map" in ops,
        "cache": "cache" in ops,
        "after_cache": after_cache,
        "interleave": "interleave" in ops or "parallel_interleave" in ops,
    }


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
    "TensorSliceDataset": "from_tensor_slices",
    "TensorDataset": "from_tensors",
    "RangeDataset": "range",
    "TFRecordDatasetV2": "tfrecord",
    "TFRecordDatasetV1": "tfrecord",
    "TFRecordDataset": "tfrecord",
    "TextLineDataset": "text_line",
    "FixedLengthRecordDataset": "fixed_length_record",
    "TextLineDatasetV2": "text_line",
    "FixedLengthRecordDatasetV2": "fixed_length_record",
}
