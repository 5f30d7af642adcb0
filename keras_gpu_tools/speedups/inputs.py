"""The user's training input as the timed fits take it, and the input changes that can make it faster.

:func:`describe` tells the input's kind (arrays, a `tf.data.Dataset`, a
`keras.utils.PyDataset`, a torch `DataLoader`), refuses what cannot be timed
without consuming it (a generator) or holds no batch, and returns a
:class:`TrainingInput`: the fit's data (:meth:`TrainingInput.fit_input`, as
given or with a change), one batch of it (the input-free ceiling and the
numerical checks repeat it), and the input changes that apply to its kind
(:meth:`TrainingInput.changes`), each with the line of code that makes it.

Frameworks are imported inside the functions, and only where the input is of theirs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.memory.search import sample_batch
from keras_gpu_tools.memory.timed_fit import FitInput
from keras_gpu_tools.runtime.batches import leading_dim, map_leaves
from keras_gpu_tools.speedups import rebatch

ARRAYS = "arrays"
TF_DATA, PY_DATASET, DATA_LOADER = rebatch.TF_DATA, rebatch.PY_DATASET, rebatch.DATA_LOADER
DEFAULT_BATCH = 32  # model.fit's batch size for arrays when none is given


@dataclasses.dataclass(frozen=True)
class InputChange:
    """One change of the input pipeline: its name, its code, and the changed data ``fit`` takes."""

    change: str
    code: str
    data: Callable[[], Any]  # the changed x (built on demand: it may start workers)
    cost: str = ""
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # what it sets, by name


@dataclasses.dataclass
class TrainingInput:
    """The user's input: its kind, ``x`` and ``y`` as given, the batch size and one batch ``(x, y)``."""

    kind: str
    x: Any
    y: Any
    batch_size: int
    batch: tuple[Any, Any]
    batches: int | None  # batches of one pass (None: endless or unknown)

    def fit_input(self, per_call: int = 1, x: Any = None, batch_size: int | None = None) -> FitInput:
        """``model.fit``'s data: as given, or with ``x`` changed (an input change), at ``batch_size`` (or its own).

        A dataset at another batch is rebuilt by :mod:`~keras_gpu_tools.speedups.rebatch`
        (:meth:`rebatch_refused` says where it cannot be).
        """
        data = self.x if x is None else x
        b = batch_size or self.batch_size
        if self.kind == ARRAYS:
            n = leading_dim(self.x) or b
            return FitInput(lambda: {"x": data, "y": self.y, "batch_size": b}, math.ceil(n / b), per_call)
        batches = self.batches
        if b != self.batch_size:
            data, batches = rebatch.rebatched(self.kind, data, self.batch_size, b)
        # Keras stops and restarts a PyDataset's workers at every epoch: its windows are whole passes.
        return FitInput(lambda: {"x": data}, batches, per_call, whole_passes=self.kind == PY_DATASET)

    def samples_per_step(self, b: int | None = None) -> float:
        """The samples a step of the input at batch ``b`` trains, on average over a pass.

        A pass over arrays ends in a smaller batch where ``b`` does not divide
        the samples (a timed window of whole passes holds it); other inputs
        are counted at their full batch.
        """
        b = b or self.batch_size
        n = self.samples if self.kind == ARRAYS else None
        return n / math.ceil(n / b) if n else float(b)

    def batch_of(self, b: int) -> tuple[Any, Any]:
        """One batch ``(x, y)`` of ``b`` samples: the user's first ``b`` where they are arrays, else the first batch's
        samples repeated."""
        if b == self.batch_size:
            return self.batch
        if self.kind == ARRAYS and (self.samples or 0) >= b:
            return head(self.x, b), head(self.y, b)
        return sample_batch(*self.batch, b, self.batch_size)  # one batch: copying it whole is cheap

    def rebatch_refused(self, b: int) -> str | None:
        """Why this input cannot be timed at batch ``b`` (None where it can: arrays always)."""
        return None if self.kind == ARRAYS else rebatch.why_not(self.kind, self.x, self.batch_size, b)

    def timeable_batch(self, b: int, most: int | None = None) -> int:
        """The batch nearest ``b``, at most ``most``, that this input can be timed at
        (:func:`~keras_gpu_tools.speedups.rebatch.nearest`; the data bounds it too)."""
        bounds = [m for m in (most, self.largest_batch()) if m is not None]
        return b if self.kind == ARRAYS else rebatch.nearest(self.kind, self.batch_size, b, min(bounds, default=None))

    def rebatch_method(self, b: int) -> str:
        """How the input at batch ``b`` is built for its timing, in words."""
        if self.kind == ARRAYS:
            return f"your arrays at batch_size={b}"
        return rebatch.method(self.kind, self.batch_size, b)

    @property
    def samples(self) -> int | None:
        """The samples of one pass (None: endless or unknown)."""
        if self.kind == ARRAYS:
            return leading_dim(self.x)
        return None if self.batches is None else self.batches * self.batch_size

    def largest_batch(self) -> int | None:
        """The largest batch a pass over the data fills at least twice (None: no bound known)."""
        n = self.samples
        return None if n is None else n // 2

    def changes(self, on_gpu: bool) -> list[InputChange]:
        """The input changes that apply to this kind of input (none for arrays: Keras feeds them itself)."""
        if self.kind == TF_DATA:
            return [_tf_data_change(self.x)]
        if self.kind == PY_DATASET:
            return _py_dataset_changes(self.x)
        if self.kind == DATA_LOADER:
            return [_data_loader_change(self.x, on_gpu)]
        return []


def batch_code(kind: str, b: int) -> str:
    """The line that trains an input of ``kind`` at batch ``b``."""
    if kind == ARRAYS:
        return f"model.fit(x, y, batch_size={b})"
    if kind == TF_DATA:
        return f"dataset = dataset.rebatch({b})"
    return f"batch_size={b}  # in your {kind}"


def workers() -> int:
    """The workers an input change uses: the CPU cores, at most 8."""
    return max(2, min(8, os.cpu_count() or 2))


def describe(x: Any, y: Any, batch_size: int | None) -> TrainingInput:
    """``x`` and ``y`` as a :class:`TrainingInput`; a ValueError naming the argument for input that cannot be timed."""
    from keras_gpu_tools.memory.throughput_run import one_batch

    kind = _kind(x)
    if kind == ARRAYS and hasattr(x, "__next__") and not hasattr(x, "shape"):
        raise ValueError(
            f"Invalid value for argument `x`. Received: x of type {type(x).__name__} (a generator or iterator). "
            "Expected arrays, a tf.data.Dataset, a keras.utils.PyDataset or a torch DataLoader: the trials pass "
            "over the input several times, and a generator's batches would be gone from training."
        )
    if kind != ARRAYS and batch_size is not None:
        raise ValueError(
            f"Invalid value for argument `batch_size`. Received: batch_size={batch_size} with x of type "
            f"{type(x).__name__}. Expected None: the dataset is batched already."
        )
    if kind == DATA_LOADER:
        if y is not None:
            raise ValueError(
                f"Invalid value for argument `y`. Received: y of type {type(y).__name__} with a DataLoader. "
                "Expected None: the DataLoader yields the targets."
            )
        first = next(iter(x), None)
        if first is None:
            raise ValueError(
                "Invalid value for argument `x`. Received: an empty DataLoader. Expected at least one batch."
            )
        bx, by = (first[0], first[1] if len(first) > 1 else None) if isinstance(first, (list, tuple)) else (first, None)
        batch = (_numpy(bx), _numpy(by))
        batches = _len(x)
    else:
        batch = one_batch(x, y)  # refuses generators, empty datasets, y beside a dataset
        batches = None
        if kind == PY_DATASET:
            batches = x.num_batches
        elif kind == TF_DATA:
            n = int(x.cardinality())
            batches = n if n > 0 else None
    lead = leading_dim(batch[0])
    if not lead:
        raise ValueError(
            f"Invalid value for argument `x`. Received: x of type {type(x).__name__} with no samples. Expected an "
            "array, a list/dict of arrays, or a dataset, with at least one sample."
        )
    if kind == ARRAYS:
        if y is None:
            raise ValueError(
                "Invalid value for argument `y`. Received: y=None with array inputs. Expected the targets of `x`, "
                "as `model.fit(x, y)` takes them."
            )
        b = min(batch_size or DEFAULT_BATCH, lead)
        first = head(x, b), head(y, b)
        return TrainingInput(kind, x, y, b, first, math.ceil(lead / b))
    return TrainingInput(kind, x, None, int(lead), batch, batches)


def _kind(x: Any) -> str:
    if hasattr(x, "element_spec"):
        return TF_DATA
    if hasattr(x, "num_batches") and hasattr(x, "__getitem__") and hasattr(x, "workers"):
        return PY_DATASET
    if type(x).__name__ == "DataLoader" and type(x).__module__.startswith("torch.utils.data"):
        return DATA_LOADER
    return ARRAYS


def _len(x: Any) -> int | None:
    try:
        return len(x)
    except TypeError:  # an IterableDataset without a length
        return None


def _numpy(v: Any) -> Any:
    """A torch batch's tensors as NumPy arrays (anything else as it is)."""

    def host(a: Any) -> Any:
        detach = getattr(a, "detach", None)
        return detach().cpu().numpy() if callable(detach) else a

    return map_leaves(host, v)


def head(data: Any, n: int) -> Any:
    """The first ``n`` samples of arrays (nested in lists, tuples and dicts); None stays None."""
    return map_leaves(lambda a: a[:n], data)


def _tf_data_change(dataset: Any) -> InputChange:
    n = workers()

    def build():
        import tensorflow as tf

        options = tf.data.Options()
        options.autotune.enabled = True
        options.experimental_optimization.map_parallelization = True
        options.threading.private_threadpool_size = n
        return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)

    code = (
        "options = tf.data.Options(); options.autotune.enabled = True; "
        "options.experimental_optimization.map_parallelization = True; "
        f"options.threading.private_threadpool_size = {n}; "
        "dataset = dataset.with_options(options).prefetch(tf.data.AUTOTUNE)"
    )
    return InputChange(
        "tf.data options and prefetch",
        code,
        build,
        "host threads prepare batches ahead of the step (more host memory for the prefetched batches)",
        {"map_parallelization": True, "autotune": True, "private_threadpool_size": n, "prefetch": "AUTOTUNE"},
    )


def _py_dataset_changes(dataset: Any) -> list[InputChange]:
    """Workers as threads (where it has fewer), then as processes (where it uses none)."""
    n = workers()
    threads = (getattr(dataset, "workers", 1) or 1) < n
    processes = not getattr(dataset, "use_multiprocessing", False)
    return [_py_dataset_change(dataset, n, False)] * threads + [_py_dataset_change(dataset, n, True)] * processes


def _py_dataset_change(dataset: Any, n: int, processes: bool) -> InputChange:
    def build():
        changed = copy.copy(dataset)  # the user's dataset keeps its own settings
        changed.workers, changed.use_multiprocessing = n, processes
        return changed

    if processes:
        return InputChange(
            f"PyDataset workers={n}, use_multiprocessing=True",
            f"super().__init__(workers={n}, use_multiprocessing=True)  # in your PyDataset's __init__",
            build,
            f"{n} processes run __getitem__ (Python-bound decoding too); the dataset must be picklable, each "
            "process holds a copy of it",
            {"workers": n, "use_multiprocessing": True},
        )
    return InputChange(
        f"PyDataset workers={n}",
        f"super().__init__(workers={n})  # in your PyDataset's __init__",
        build,
        f"{n} threads fetch batches ahead of the step: pays where __getitem__ waits or releases the GIL",
        {"workers": n, "use_multiprocessing": False},
    )


def _data_loader_change(loader: Any, on_gpu: bool) -> InputChange:
    n = workers()
    pin = bool(on_gpu)

    def build():
        import torch

        if isinstance(loader.dataset, torch.utils.data.IterableDataset):
            raise ValueError(
                "an IterableDataset yields every sample in each worker unless it splits itself "
                "(torch.utils.data.get_worker_info): workers are not added for it"
            )
        settings = rebatch.loader_settings(loader, num_workers=n, pin_memory=pin, persistent_workers=True)
        return torch.utils.data.DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **settings)

    code = f"DataLoader(dataset, ..., num_workers={n}, pin_memory={pin}, persistent_workers=True)"
    return InputChange(
        f"DataLoader num_workers={n}, pin_memory={pin}, persistent_workers=True",
        code,
        build,
        f"{n} worker processes, kept between epochs; each holds a copy of the dataset"
        + ("; batches in page-locked host memory" if pin else ""),
        {"num_workers": n, "pin_memory": pin, "persistent_workers": True},
    )


__all__ = [
    "ARRAYS",
    "DATA_LOADER",
    "PY_DATASET",
    "TF_DATA",
    "InputChange",
    "TrainingInput",
    "batch_code",
    "describe",
    "head",
    "workers",
]
