"""find_speedups: each known speed-up measured on the user's own model and input, and what it is worth.

The arguments are checked first (nothing is built or trained before); then
the model's state is kept as ``plan_batch_size`` keeps it (the backend's
``plan_snapshot``, put back by ``plan_restore`` whatever happens) and every
trial runs on a clone (:mod:`~keras_gpu_tools.speedups.trials`), timed by
the planner's timed fits (:func:`~keras_gpu_tools.memory.timed_fit.time_fit`
on the user's input, :func:`~keras_gpu_tools.memory.timed_fit.time_batch` on
one batch repeated) within the planner's :class:`~keras_gpu_tools.memory.throughput.Budget`.
:class:`_Finder` (``speedups/finder.py``) decides the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_gpu_tools.runtime.validation import check_choices, check_int, check_log_dir, check_number

CHANGES = ("input", "steps_per_execution", "jit_compile", "mixed_precision", "batch_size")


def find_speedups(
    model,
    x,
    y=None,
    *,
    batch_size: int | None = None,
    max_seconds: float = 180,
    changes: Sequence[str] | None = None,
    log_dir: str | None = None,
):
    """Measures each known speed-up of training on `model` and its input, alone and combined.

    Every trial trains a clone of the model with `model.fit` (compile time
    apart, then steady windows until samples/s is known within ±2% or its
    share of `max_seconds` is spent): the fit as given (the baseline), one
    batch repeated (the input-free ceiling: the most any input change can
    give), then each change alone:

    - `"input"`: a `tf.data.Dataset`'s options (autotune, map
      parallelization, a private threadpool) and a prefetch; a `PyDataset`'s
      `workers` (threads, then processes); a `DataLoader`'s `num_workers`,
      `pin_memory` (on a GPU) and `persistent_workers`.
    - `"steps_per_execution"`: N steps per call, N from the per-call host
      time (the intercept of step time over batch size), where the backend
      allows it (not torch).
    - `"jit_compile"`: XLA (TensorFlow), `torch.compile` (torch); JAX
      compiles already.
    - `"mixed_precision"`: `mixed_bfloat16` (`mixed_float16` before Ampere)
      with `MixedPrecisionOutput` on the outputs, where the GPU has tensor cores.
    - `"batch_size"`: `plan_batch_size(objective="throughput")`, up to half
      the samples of one pass where that is known: a larger batch leaves
      under two steps an epoch (and a batch over the data is never trained).

    Then the baseline again: each row is read against the baseline as at the
    row's own time, on the line between the two timings (a host whose pace
    drifts during the search moves each row's "before" with it), with at
    least half their difference as its uncertainty, so that the drift shows
    in the baseline's ± and not as a speed-up. Then the changes that paid,
    together, read against the second timing (the nearer). Mixed precision
    and `jit_compile` get a numerical check: the loss after a few steps against the float32
    baseline's; a loss that diverges makes the change "unsafe". A change that
    raises is "not applicable" (with the error's first line), one that would
    not finish within `max_seconds` "not measured" (with the reason). The
    model's weights, optimizer state, metrics and the random states are as
    they were afterwards.

    Args:
        model: a compiled Keras model (Functional or Sequential: trials run on clones).
        x: the training input as `model.fit` takes it: arrays (with `y`), a
            `tf.data.Dataset`, a `keras.utils.PyDataset` or a torch `DataLoader`.
        y: the targets of array inputs; None for a dataset. Defaults to `None`.
        batch_size: the batch size of array inputs, as `model.fit` takes it;
            None for datasets. Defaults to `None` (32 for arrays, as `fit`).
        max_seconds: the time the search may take, in seconds. Defaults to `180`.
        changes: the changes to try, among `"input"`, `"steps_per_execution"`,
            `"jit_compile"`, `"mixed_precision"` and `"batch_size"`. Defaults
            to `None` (all).
        log_dir: a TensorBoard log directory: the report goes to its run
            `speedups` (the table as text, a bar chart, a scalar per row).
            Defaults to `None`.

    Returns:
        A `SpeedupReport`: `rows` (`SpeedupRow`: the change, its code,
        samples/s before and after with their uncertainty, the speed-up, the
        numerical check, the cost, the status), `print(report)`,
        `report.to_markdown()`, and `report.apply(model)`, which re-compiles
        the model with the compile-time changes that paid.

    Example:

    ```python
    import keras_gpu_tools

    report = keras_gpu_tools.find_speedups(model, dataset, max_seconds=120)
    print(report)
    report.apply(model)  # steps_per_execution / jit_compile, where they paid
    model.fit(dataset, epochs=10)
    ```
    """
    from keras_gpu_tools.speedups.finder import run

    max_seconds = check_number("max_seconds", max_seconds, low=0, exclusive_low=True, what="number of seconds")
    batch_size = check_int("batch_size", batch_size, low=1, allow_none=True)
    wanted = CHANGES if changes is None else check_choices("changes", changes, CHANGES)
    log_dir = check_log_dir("log_dir", log_dir)
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"Invalid value for argument `model`. Received: model={getattr(model, 'name', model)!r}, which is not "
            "compiled. Expected a compiled model (`model.compile(optimizer, loss)`): each speed-up is measured on "
            "its training step."
        )
    report = run(model, x, y, batch_size, max_seconds, tuple(wanted))
    if log_dir is not None:
        report.write(log_dir)
    return report


__all__ = ["CHANGES", "find_speedups"]
