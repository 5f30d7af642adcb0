"""What the reducer checks of a fit before and while it runs, and the advice it gives.

- :func:`refuse_fit`, :func:`refuse_uneven`: what makes a fit impossible to
  retry, raised before it starts.
- :func:`uneven_share`: fit()'s batches that cannot be spread evenly over the
  process's data-parallel devices (every batch, and every micro-batch, holds
  an equal share per device), with the batch sizes that would work.
- :func:`uses_batch_statistics`: whether the model normalises by batch
  statistics, which a split changes (each micro-batch by its own).
- :func:`resolve_probe`: whether ``probe`` predicts anything here (and,
  for ``probe=True``, why not);
  :func:`start_memory_history` starts the allocator's record, or says why not.
- :func:`late_oom_refusal` and :data:`ASYNC_OOM_REFUSAL`: why an out-of-memory
  error at a step that kept no copy of its state cannot be retried, and what
  to do instead.

Keras is read through ``runtime.keras_internals``; no framework import.
"""

from __future__ import annotations

from collections.abc import Callable

from keras_gpu_tools.memory.accumulate import accumulation_problem, refusal
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import leading_dim

BATCH_STATISTICS_WARNING = (
    "OOMBatchSizeReducer: the model normalises by batch statistics (BatchNormalization): each "
    "micro-batch is normalised by its own, and the moving averages update once per micro-batch, so "
    "accumulate mode is not the unsplit batch there. Use GroupNormalization or LayerNormalization "
    "where that matters."
)

ASYNC_OOM_REFUSAL = (
    "OOMBatchSizeReducer: an out-of-memory error of a JAX step surfaced only when its results were "
    "read (asynchronous dispatch), after the step's donated state was gone; it cannot be retried. "
    "Use `probe=True`, or lower the batch size."
)


def late_oom_refusal(signature) -> str:
    """Why an out-of-memory error at a training batch shape that had already run whole is not retried."""
    return (
        "OOMBatchSizeReducer: out of memory at a batch shape that had already run whole "
        f"({signature!r}). No copy of the state is kept for such steps (it would cost time on every "
        "step), and the failed attempt may already have updated the metrics, the moving statistics "
        "and (JAX) freed the donated state, so the batch cannot be retried exactly. Set "
        "`late_recovery=True` (TensorFlow, torch) to keep that copy before every step, or lower the "
        "batch size."
    )


def refuse_fit(model, backend, mode: str) -> None:
    """Raises before a fit what makes its steps impossible to retry on ``backend`` (or, to accumulate, inexact)."""
    problem = backend.reducer_problem(model)
    if problem:
        raise ValueError(problem)
    inexact = accumulation_problem(model) if mode == "accumulate" else None
    if inexact:
        raise refusal(inexact)


def refuse_uneven(model, backend, replicas: int, processes: int) -> None:
    """Raises where ``backend`` needs even shares and fit()'s batches cannot be spread over the process's devices."""
    uneven = uneven_share(model, replicas // max(1, processes)) if replicas > 1 and backend.even_shares else None
    if uneven:
        raise ValueError(uneven)


PROBE_CHOICES: tuple[bool | str, ...] = (True, False, "auto")


def resolve_probe(probe: bool | str, backend, warn: Callable[[str, str], None]) -> bool:
    """Whether to predict each new batch shape's memory before running it, for ``probe`` on ``backend``.

    ``"auto"``: where ``backend`` predicts a compiled step's memory (JAX) and its
    device reports a memory limit (a GPU), silently off elsewhere. ``True``:
    the same, with a warning (``warn(key, message)``) where nothing can be
    predicted. ``False``: never.
    """
    if probe is False:
        return False
    if not backend.predicts_memory:
        if probe is True:
            warn(
                "probe",
                f"OOMBatchSizeReducer: probe=True needs the JAX backend (XLA's memory analysis); {backend.name} "
                "cannot tell before running, so the first step is simply retried if it runs out of memory.",
            )
        return False
    try:
        limit = (backend.device_memory() or {}).get("bytes_limit")
    except Exception:
        limit = None
    if not limit:
        if probe is True:
            warn(
                "probe-device",
                "OOMBatchSizeReducer: probe=True: this device reports no memory limit "
                "(CPU); nothing is predicted, out-of-memory errors are retried.",
            )
        return False
    return True


def start_memory_history(backend, warn: Callable[[str, str], None]) -> None:
    """Starts ``backend``'s record of the allocator's history; warns where it records nothing."""
    why = backend.start_memory_history()
    if why:
        warn("history", f"OOMBatchSizeReducer: record_memory_history=True: {why}; recording nothing.")


def uneven_share(model, devices: int) -> str | None:
    """Why fit()'s batches cannot be spread evenly over this process's ``devices`` data-parallel devices, or None.

    Read from fit()'s arguments before the first step (where fit() was given
    arrays): Keras would fail at that batch otherwise, mid-epoch for the last one.
    """
    if devices <= 1:
        return None
    args = ki.fit_locals(model)
    batch_size = args.get("batch_size")
    if not isinstance(batch_size, int) or batch_size < 1:
        return None
    where = f"the {devices} data-parallel devices of this process"

    def near(n: int) -> str:
        low, high = n - n % devices, n - n % devices + devices
        return f"{low} or {high}" if low else str(high)

    if batch_size % devices:
        return (
            f"OOMBatchSizeReducer: batch_size={batch_size} cannot be spread over {where}: each device takes an "
            f"equal share of every batch (and of every micro-batch), so the batch size must be a multiple of "
            f"{devices} ({near(batch_size)} would work)."
        )
    samples = leading_dim(args.get("x")) if args.get("x") is not None else None
    if samples and not args.get("steps_per_epoch") and samples % batch_size % devices:
        last = samples % batch_size
        return (
            f"OOMBatchSizeReducer: the last batch of each epoch holds {last} samples ({samples} samples in batches of "
            f"{batch_size}), which cannot be spread over {where}: each device takes an equal share, so every batch "
            f"must hold a multiple of {devices} samples. Use a number of samples that leaves a multiple of {devices} "
            f"(such as {samples - last + (last - last % devices)}), or a dataset that drops the remainder."
        )
    return None


def uses_batch_statistics(model) -> bool:
    """Whether a layer of ``model`` normalises by batch statistics (``BatchNormalization``, or one marked so)."""
    import keras

    layers = ki.all_layers(model) if model is not None else []
    return any(
        getattr(layer, "_keras_gpu_tools_batch_statistics", False) or isinstance(layer, keras.layers.BatchNormalization)
        for layer in layers
    )


__all__ = [
    "ASYNC_OOM_REFUSAL",
    "BATCH_STATISTICS_WARNING",
    "PROBE_CHOICES",
    "late_oom_refusal",
    "refuse_fit",
    "refuse_uneven",
    "resolve_probe",
    "start_memory_history",
    "uneven_share",
    "uses_batch_statistics",
]
