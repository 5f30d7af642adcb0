"""Running one batch as micro-batches with one optimizer update: what all backends share.

The runners themselves live with their backend (``keras_gpu_tools/_backends``:
``TFRunner``, ``JaxRunner``, ``TorchRunner``; TensorFlow and torch build on
:class:`StatefulRunner` here). Each runner has the same methods:

- ``run(batch, k, state, guarded)``: the step on ``batch`` split into ``k``
  micro-batches (``k == 1``: Keras's own train function, untouched). In the
  default mode ``accumulate`` the model's own ``train_step`` runs on every
  micro-batch with the optimizer's apply routed to an accumulator
  (``ki.capture_apply``): gradients are summed with weights
  ``n_i / n`` (so a loss that is a mean over the batch, Keras's default, gets
  exactly the gradient of the whole batch), metrics and non-trainable
  updates run per micro-batch, and the optimizer applies once. Mode
  ``split`` runs the micro-batches as separate steps. JAX returns
  ``(logs, state)``; the others return the logs.
- ``protect(state, guarded)`` / ``restore(snapshot, state)``: what is needed
  to put the state back as it was before a failed attempt. A guarded attempt
  (the first at a batch shape and split) keeps a host copy of every
  variable when the state is at most ``full_snapshot_max_bytes``; other
  attempts keep a device copy of the small state (non-trainable and metric
  variables, the optimizer's counters) on TensorFlow and torch. ``restore``
  raises :class:`~keras_gpu_tools._core.oom.UnrecoverableOOM` where the
  state cannot be put back exactly.
- ``predict(batch, k, state)`` (JAX): whether the compiled step fits the
  device's memory limit, from XLA's memory analysis; None where unknown.

No module-level framework import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from keras_gpu_tools._core import keras_internals as ki
from keras_gpu_tools._core.oom import split_sizes
from keras_gpu_tools.errors import UnrecoverableOOM

logger = logging.getLogger("keras_gpu_tools")

FULL_SNAPSHOT_MAX_BYTES = 4 * 2**30


def slice_batch(batch, a: int, b: int):
    if batch is None:
        return None
    if isinstance(batch, tuple):
        return tuple(slice_batch(x, a, b) for x in batch)
    if isinstance(batch, list):
        return [slice_batch(x, a, b) for x in batch]
    if isinstance(batch, dict):
        return {k: slice_batch(v, a, b) for k, v in batch.items()}
    return batch[a:b]


def micro_batches(batch, n: int, k: int) -> list[tuple[Any, float]]:
    """``(micro_batch, n_i / n)`` pairs of a batch of ``n`` split in ``k``."""
    out, start = [], 0
    for size in split_sizes(n, k):
        out.append((slice_batch(batch, start, start + size), size / n))
        start += size
    return out


def nbytes(x) -> int:
    try:
        return int(x.nbytes)
    except Exception:
        try:
            import numpy as np

            return int(np.prod(x.shape)) * 4
        except Exception:
            return 0


class Snapshot:
    def __init__(self, kind: str, items, iterations: int | None = None):
        self.kind = kind  # "full", "small", "none"
        self.items = items
        self.iterations = iterations


class StatefulRunner:
    """TensorFlow and torch: Keras variables hold the state."""

    backend = ""
    _scaled = False  # train_step called optimizer.scale_loss, which weighted the loss

    def _mark_scaled(self) -> None:
        self._scaled = True

    def __init__(
        self,
        model,
        original: Callable,
        mode: str = "accumulate",
        full_snapshot_max_bytes: int = FULL_SNAPSHOT_MAX_BYTES,
    ):
        self.model = model
        self.original = original
        self.mode = mode
        self.full_snapshot_max_bytes = full_snapshot_max_bytes
        self._index = {id(v): i for i, v in enumerate(model.trainable_variables)}
        self._counted = None
        self._refresh()

    def _refresh(self) -> None:
        # Compiled metrics (TensorFlow) and optimizer slots are built at the
        # first trace: collect the variables again until their number settles.
        count = (
            len(self.model.metrics_variables),
            len(getattr(getattr(self.model, "optimizer", None), "variables", []) or []),
        )
        if count == self._counted:
            return
        self._counted = count
        self._all = ki.variables_of(self.model, "all")
        self._small = ki.variables_of(self.model, "small")
        self.state_bytes = sum(nbytes(v) for v in self._all)
        self._small_changed()

    def _small_changed(self) -> None:
        pass

    def _reset_new_metrics(self, snap: Snapshot) -> None:
        """Metric variables created by the failed attempt itself go back to zero (their initial value)."""
        import keras

        known = {id(v) for v, _ in snap.items}
        for v in self.model.metrics_variables:
            if id(v) not in known:
                v.assign(keras.ops.zeros(tuple(v.shape), dtype=v.dtype))

    # -- state ---------------------------------------------------------------
    def protect(self, state, guarded: bool) -> Snapshot:
        if guarded:
            self._refresh()
        if guarded and self.state_bytes <= self.full_snapshot_max_bytes:
            import keras

            return Snapshot("full", [(v, keras.ops.convert_to_numpy(v.value)) for v in self._all])
        return Snapshot(
            "small",
            list(zip(self._small, self._copy_small())),
            ki.iterations_value(self.model) if guarded else None,
        )

    def restore(self, snap: Snapshot, state):
        self._reset_accumulator()
        if snap.kind == "full":
            for v, value in snap.items:
                v.assign(value)
            self._reset_new_metrics(snap)
            self._refresh()
            return state
        before = snap.iterations
        if before is None:
            before = self._iterations_from_small(snap)
        now = ki.iterations_value(self.model)
        if before is not None and now is not None and now != before:
            raise UnrecoverableOOM(
                "OOMBatchSizeReducer: the out-of-memory error came after the optimizer had started to update the "
                f"weights (optimizer.iterations went from {before} to {now}), and no full copy of the state was kept, "
                "so the step cannot be retried without applying part of an update twice."
            )
        for v, value in snap.items:
            v.assign(value)
        self._reset_new_metrics(snap)
        self._refresh()
        return state

    def _iterations_from_small(self, snap: Snapshot) -> int | None:
        it = ki.iterations_variable(getattr(self.model, "optimizer", None))
        for v, value in snap.items:
            if v is it:
                try:
                    import keras

                    return int(keras.ops.convert_to_numpy(value))
                except Exception:
                    return None
        return None

    def finish(self, result, guarded: bool):
        return result

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        return None, None  # TensorFlow and torch cannot tell before running

    # -- running -------------------------------------------------------------
    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if k == 1:
            return self._run_original(batch)
        parts = micro_batches(batch, n, k)
        if self.mode == "split":
            out = None
            for part, _ in parts:
                out = self._run_original(part)
            return out
        return self._run_accumulated(parts)

    def whole(self, batch, state=None):
        """The idle path: Keras's own step on the whole batch, nothing else."""
        return self._run_original(batch)

    def _run_original(self, batch):
        raise NotImplementedError

    def _run_accumulated(self, parts):
        raise NotImplementedError

    def _copy_small(self):
        raise NotImplementedError

    def _reset_accumulator(self):
        pass
