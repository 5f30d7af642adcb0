"""The user's own input at another batch size, as the batch-size row's line of code makes it.

The batch-size row is timed on the fit's real input where that input can be
rebuilt at the planned batch, so the row's figure carries the pipeline's cost
at that batch as well as the step's:

- a `tf.data.Dataset`: ``dataset.rebatch(b)``, the row's own code, over the
  dataset repeated (its cardinality is lost by the rebatch; every step a
  whole batch);
- a torch `DataLoader` with a plain batch sampler over a map-style dataset:
  the same dataset, sampler and settings at ``batch_size=b``, whole batches
  only (``drop_last``), so every timed step trains ``b`` samples;
- a `keras.utils.PyDataset`: its batches cannot be asked for at another size,
  so ``b / batch`` consecutive batches are joined into one, its epoch hooks
  passed on. That is the dataset at batch ``b`` where its cost is per sample
  (a decoder's); a fixed cost per batch would gain more at ``b`` than the
  joined batches show.

:func:`nearest` moves a planned batch to one the input can be rebuilt at (a `PyDataset`'s nearest
multiple), so that the row is timed on the user's input and its line of code makes that batch;
:func:`why_not` says why an input cannot be rebuilt at ``b`` (the finder then
times the step alone, on one batch repeated). Frameworks are imported inside
the functions, and only where the input is of theirs.
"""

from __future__ import annotations

from typing import Any

DATA_LOADER, PY_DATASET, TF_DATA = "DataLoader", "PyDataset", "tf.data"


def why_not(kind: str, x: Any, batch: int, b: int) -> str | None:
    """Why ``x`` (of ``kind``, batches of ``batch``) cannot be rebuilt at batch ``b``; None where it can."""
    if kind == PY_DATASET and b % batch:
        return f"batch {b} is not a multiple of your PyDataset's {batch}: its batches cannot be joined into it"
    if kind == DATA_LOADER:
        import torch

        if isinstance(x.dataset, torch.utils.data.IterableDataset):
            return "your DataLoader reads an IterableDataset: its batches are its own to make"
        if _batch_sampler(x) is None:
            return "your DataLoader's batch_sampler sets its batches: it cannot be rebuilt at another batch size"
    if kind not in (DATA_LOADER, PY_DATASET, TF_DATA):
        return f"an input of kind {kind} is not rebatched here"
    return None


def nearest(kind: str, batch: int, b: int, most: int | None) -> int:
    """The batch nearest ``b`` that an input of ``kind`` (batches of ``batch``) can be rebuilt at, at most ``most``:
    for a `PyDataset`, the nearest multiple of its batch, at least twice it (a batch its own code can make
    and the timing can join); else, or where no such multiple is at most ``most``, ``b`` itself."""
    if kind != PY_DATASET or b % batch == 0:
        return b
    joined = batch * max(2, int(b / batch + 0.5))
    if most is not None and joined > most:
        joined = batch * (most // batch)
    return joined if joined > batch else b


def rebatched(kind: str, x: Any, batch: int, b: int) -> tuple[Any, int | None]:
    """``x`` at batch ``b``, every step a whole batch: the rebuilt input and its batches per pass (None: endless)."""
    if kind == PY_DATASET:
        joined = _joined(x, b // batch)
        return joined, joined.num_batches
    if kind == TF_DATA:
        return x.repeat().rebatch(b), None
    sampler = _batch_sampler(x)
    assert sampler is not None  # why_not refused the others
    loader = _loader(x, sampler, b)
    return loader, len(loader)


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

    return torch.utils.data.DataLoader(
        loader.dataset, batch_size=b, sampler=sampler.sampler, drop_last=True, **loader_settings(loader)
    )


def loader_settings(loader: Any, **changed: Any) -> dict[str, Any]:
    """A DataLoader's own settings beside its dataset and batches (``changed`` set over them), for a rebuilt one."""
    settings = {
        "collate_fn": loader.collate_fn,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
        "pin_memory_device": getattr(loader, "pin_memory_device", ""),
    }
    if hasattr(loader, "in_order"):
        settings["in_order"] = loader.in_order
    settings.update(changed)
    if not settings["num_workers"]:  # torch refuses these without worker processes
        settings.update(persistent_workers=False, prefetch_factor=None)
    return settings


def _joined(dataset: Any, k: int) -> Any:
    """A PyDataset whose batch ``i`` is ``dataset``'s batches ``i*k .. i*k+k-1`` joined; workers and epoch hooks
    as ``dataset``'s."""
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

        def on_epoch_begin(self) -> None:
            dataset.on_epoch_begin()

        def on_epoch_end(self) -> None:
            dataset.on_epoch_end()

    return Joined()


def _join(*parts: Any) -> Any:
    """The parts as one along the batch axis: NumPy arrays that are adjacent slices of one array as a view (as
    a dataset that slices its arrays returns at the larger batch too), the backend's tensors by its own
    concatenation, anything else by one NumPy copy."""
    import keras
    import numpy as np

    first = parts[0]
    if first is None:
        return None
    if all(isinstance(p, np.ndarray) for p in parts):
        view = _adjacent_view(parts)
        return np.concatenate(parts) if view is None else view
    if all(keras.ops.is_tensor(p) for p in parts):
        return keras.ops.concatenate(list(parts), axis=0)
    return np.concatenate([np.asarray(p) for p in parts])


def _adjacent_view(arrays: Any) -> Any | None:
    """One view over ``arrays`` where they are C-contiguous slices of one array, end to end; else None."""
    import numpy as np

    first = arrays[0]
    base = first.base
    if base is None or not first.ndim:
        return None
    at = first.__array_interface__["data"][0]
    for a in arrays:
        same = a.base is base and a.flags.c_contiguous and a.dtype == first.dtype and a.strides == first.strides
        if not same or a.shape[1:] != first.shape[1:] or a.__array_interface__["data"][0] != at:
            return None
        at += a.shape[0] * first.strides[0]
    n = sum(a.shape[0] for a in arrays)
    writeable = all(a.flags.writeable for a in arrays)
    return np.lib.stride_tricks.as_strided(first, (n, *first.shape[1:]), first.strides, writeable=writeable)


__all__ = ["loader_settings", "method", "nearest", "rebatched", "why_not"]
