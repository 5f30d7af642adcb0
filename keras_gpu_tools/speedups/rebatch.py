"""The user's own input at another batch size, as the batch-size row's line of code makes it.

The batch-size row is timed on the fit's real input where that input can be
rebuilt at the planned batch, so the row's figure carries the pipeline's cost
at that batch as well as the step's:

- a `tf.data.Dataset`: ``dataset.rebatch(b)``, the row's own code;
- a torch `DataLoader` with a plain batch sampler: the same dataset, sampler,
  collate function and workers at ``batch_size=b``;
- a `keras.utils.PyDataset`: its batches cannot be asked for at another size,
  so ``b / batch`` consecutive batches are joined into one. That is the
  dataset at batch ``b`` where its cost is per sample (a decoder's); a fixed
  cost per batch would gain more at ``b`` than the joined batches show.

:func:`why_not` says why an input cannot be rebuilt at ``b`` (the finder then
times the step alone, on one batch repeated). Frameworks are imported inside
the functions, and only where the input is of theirs.
"""

from __future__ import annotations

import math
from typing import Any

DATA_LOADER, PY_DATASET, TF_DATA = "DataLoader", "PyDataset", "tf.data"


def why_not(kind: str, x: Any, batch: int, b: int) -> str | None:
    """Why ``x`` (of ``kind``, batches of ``batch``) cannot be rebuilt at batch ``b``; None where it can."""
    if kind == PY_DATASET and b % batch:
        return f"batch {b} is not a multiple of your PyDataset's {batch}: its batches cannot be joined into it"
    if kind == DATA_LOADER and _batch_sampler(x) is None:
        return "your DataLoader's batch_sampler sets its batches: it cannot be rebuilt at another batch size"
    if kind not in (DATA_LOADER, PY_DATASET, TF_DATA):
        return f"an input of kind {kind} is not rebatched here"
    return None


def rebatched(kind: str, x: Any, batch: int, batches: int | None, b: int) -> tuple[Any, int | None]:
    """``x`` at batch ``b``: the rebuilt input and its batches per pass (None: unknown)."""
    if kind == PY_DATASET:
        joined = _joined(x, b // batch)
        return joined, joined.num_batches
    per_pass = None if batches is None else math.ceil(batches * batch / b)
    if kind == TF_DATA:
        return x.rebatch(b), per_pass
    sampler = _batch_sampler(x)
    assert sampler is not None  # why_not refused the others
    return _loader(x, sampler, b), per_pass


def method(kind: str, batch: int, b: int) -> str:
    """How :func:`rebatched` builds the input at batch ``b``, in words."""
    if kind == PY_DATASET:
        return (
            f"{b // batch} of your batches joined per step: your PyDataset at batch {b} where its cost is per "
            "sample; a fixed cost per batch gains more"
        )
    return f"dataset.rebatch({b})" if kind == TF_DATA else f"your DataLoader at batch_size={b}"


def _batch_sampler(loader: Any) -> Any | None:
    """The loader's plain `BatchSampler` (None for a custom one, whose batches are its own)."""
    import torch

    sampler = getattr(loader, "batch_sampler", None)
    return sampler if type(sampler) is torch.utils.data.BatchSampler else None


def _loader(loader: Any, sampler: Any, b: int) -> Any:
    import torch

    workers = loader.num_workers
    return torch.utils.data.DataLoader(
        loader.dataset,
        batch_size=b,
        sampler=sampler.sampler,
        drop_last=sampler.drop_last,
        collate_fn=loader.collate_fn,
        num_workers=workers,
        pin_memory=loader.pin_memory,
        persistent_workers=bool(workers and loader.persistent_workers),
    )


def _joined(dataset: Any, k: int) -> Any:
    """A PyDataset whose batch ``i`` is ``dataset``'s batches ``i*k .. i*k+k-1`` joined; workers as ``dataset``'s."""
    import keras

    class Joined(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(
                workers=dataset.workers,
                use_multiprocessing=dataset.use_multiprocessing,
                max_queue_size=dataset.max_queue_size,
            )

        @property
        def num_batches(self) -> int | None:
            n = dataset.num_batches
            return None if n is None else n // k

        def __getitem__(self, i: int) -> Any:
            parts = [dataset[i * k + j] for j in range(k)]
            return keras.tree.map_structure(_join, *parts)

    return Joined()


def _join(*parts: Any) -> Any:
    """The parts as one array along the batch axis: a view where they are adjacent slices of one array, as
    a dataset that slices its arrays returns at the larger batch too; else one copy."""
    import numpy as np

    arrays = [np.asarray(p) for p in parts]
    first = arrays[0]
    base = first.base
    if base is not None and first.ndim and all(a.base is base and a.flags.c_contiguous for a in arrays):
        step = first.strides[0]
        start = first.__array_interface__["data"][0]
        adjacent = all(
            a.dtype == first.dtype and a.shape[1:] == first.shape[1:] and a.strides == first.strides for a in arrays
        )
        at = start
        for a in arrays:
            adjacent = adjacent and a.__array_interface__["data"][0] == at
            at += a.shape[0] * step
        if adjacent:
            n = sum(a.shape[0] for a in arrays)
            return np.lib.stride_tricks.as_strided(first, (n, *first.shape[1:]), first.strides, writeable=False)
    return np.concatenate(arrays)


__all__ = ["method", "rebatched", "why_not"]
