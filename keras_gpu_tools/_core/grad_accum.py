"""Running one batch as micro-batches, per backend, with one optimizer update.

Each runner has the same methods:

- ``run(batch, k, state, guarded)``: the step on ``batch`` split into ``k``
  micro-batches (``k == 1``: Keras's own train function, untouched). In the
  default mode ``accumulate`` the model's own ``train_step`` runs on every
  micro-batch with the optimizer's apply routed to an accumulator
  (``oom_compat.capture_apply``): gradients are summed with weights
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

No module-level framework import: the runners import their framework when built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from keras_gpu_tools._core import compat, oom_compat
from keras_gpu_tools._core.oom import split_sizes
from keras_gpu_tools._core.step_hook import leaves
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


def _nbytes(x) -> int:
    try:
        return int(x.nbytes)
    except Exception:
        try:
            import numpy as np

            return int(np.prod(x.shape)) * 4
        except Exception:
            return 0


class _Snapshot:
    def __init__(self, kind: str, items, iterations: int | None = None):
        self.kind = kind  # "full", "small", "none"
        self.items = items
        self.iterations = iterations


class _StatefulRunner:
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
        self._all = oom_compat.variables_of(self.model, "all")
        self._small = oom_compat.variables_of(self.model, "small")
        self.state_bytes = sum(_nbytes(v) for v in self._all)
        self._small_changed()

    def _small_changed(self) -> None:
        pass

    def _reset_new_metrics(self, snap: _Snapshot) -> None:
        """Metric variables created by the failed attempt itself go back to zero (their initial value)."""
        import keras

        known = {id(v) for v, _ in snap.items}
        for v in self.model.metrics_variables:
            if id(v) not in known:
                v.assign(keras.ops.zeros(tuple(v.shape), dtype=v.dtype))

    # -- state ---------------------------------------------------------------
    def protect(self, state, guarded: bool) -> _Snapshot:
        if guarded:
            self._refresh()
        if guarded and self.state_bytes <= self.full_snapshot_max_bytes:
            import keras

            return _Snapshot("full", [(v, keras.ops.convert_to_numpy(v.value)) for v in self._all])
        return _Snapshot(
            "small",
            list(zip(self._small, self._copy_small())),
            oom_compat.iterations_value(self.model) if guarded else None,
        )

    def restore(self, snap: _Snapshot, state):
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
        now = oom_compat.iterations_value(self.model)
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

    def _iterations_from_small(self, snap: _Snapshot) -> int | None:
        it = oom_compat.iterations_variable(getattr(self.model, "optimizer", None))
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

    def _run_original(self, batch):
        raise NotImplementedError

    def _run_accumulated(self, parts):
        raise NotImplementedError

    def _copy_small(self):
        raise NotImplementedError

    def _reset_accumulator(self):
        pass


class TFRunner(_StatefulRunner):
    backend = "tensorflow"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import tensorflow as tf

        self.tf = tf
        self._accs = None
        self._none = set()
        self._w = None
        self._micro_fn = None
        self._apply_fn = None
        self._small_fn = None

    def _run_original(self, batch):
        return compat.tf_run_batches(self.original, [batch])

    def _function(self, fn):
        if getattr(self.model, "run_eagerly", False):
            return fn
        return self.tf.function(fn, reduce_retracing=True, jit_compile=bool(getattr(self.model, "jit_compile", False)))

    def _build(self):
        tf = self.tf
        if self._accs is None:
            self._accs = [
                tf.Variable(tf.zeros(tuple(v.shape), dtype=v.dtype), trainable=False, name="kgt_oom_acc")
                for v in self.model.trainable_variables
            ]
            strategy = self.model.distribute_strategy

            def micro(data, w):
                def replica(d):
                    self._w = w
                    self._scaled = False
                    with oom_compat.capture_apply(
                        self.model.optimizer, "tensorflow", self._sink, weight=w, on_scaled=self._mark_scaled
                    ):
                        return self.model.train_step(d)

                return strategy.run(replica, args=(data,))

            def apply():
                def replica():
                    grads = [None if i in self._none else acc.read_value() for i, acc in enumerate(self._accs)]
                    oom_compat.real_apply(self.model.optimizer, "tensorflow")(grads, self.model.trainable_variables)
                    for acc in self._accs:
                        acc.assign(tf.zeros_like(acc))
                    return tf.constant(0)

                return strategy.run(replica)

            self._micro_fn = self._function(micro)
            self._apply_fn = self._function(apply)

    def _sink(self, grads, variables):
        tf = self.tf
        variables = variables if variables is not None else self.model.trainable_variables
        for g, v in zip(grads, variables):
            i = self._index.get(id(v))
            if i is None:
                raise compat.KerasInternalsError(
                    "keras_gpu_tools: train_step applied gradients to a variable that is not trainable"
                )
            if g is None:
                self._none.add(i)
                continue
            acc = self._accs[i]
            g = tf.cast(tf.convert_to_tensor(g), acc.dtype)
            acc.assign_add(g if self._scaled else g * tf.cast(self._w, acc.dtype))

    def _run_accumulated(self, parts):
        self._build()
        logs = None
        try:
            for part, w in parts:
                logs = self._micro_fn(part, self.tf.constant(w, self.tf.float32))
            self._apply_fn()
        finally:
            self._w = None
        return logs

    def _reset_accumulator(self):
        if self._accs is not None:
            for acc in self._accs:
                acc.assign(self.tf.zeros_like(acc))

    def _small_changed(self) -> None:
        self._small_fn = None

    def _copy_small(self):
        if not self._small:
            return []
        if self._small_fn is None:
            small = self._small
            tf = self.tf
            self._small_fn = tf.function(lambda: [tf.identity(v.value) for v in small])
        return self._small_fn()


class TorchRunner(_StatefulRunner):
    backend = "torch"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import torch

        self.torch = torch
        self._acc = {}
        self._w = 1.0

    def _run_original(self, batch):
        return self.original([batch])

    def _sink(self, grads, variables):
        variables = variables if variables is not None else self.model.trainable_variables
        with self.torch.no_grad():
            for g, v in zip(grads, variables):
                if g is None:
                    continue
                i = self._index[id(v)]
                w = 1.0 if self._scaled else self._w
                if i in self._acc:
                    self._acc[i].add_(g, alpha=w)
                else:
                    self._acc[i] = g.detach() * w

    def _run_accumulated(self, parts):
        model = self.model
        logs = None
        self._acc = {}
        try:
            for part, w in parts:
                self._w = w
                self._scaled = False
                with oom_compat.capture_apply(
                    model.optimizer, "torch", self._sink, weight=w, on_scaled=self._mark_scaled
                ):
                    logs = model.train_step(part)
            variables = model.trainable_variables
            grads = [self._acc.get(i) for i in range(len(variables))]
            with self.torch.no_grad():
                oom_compat.real_apply(model.optimizer, "torch")(grads, variables)
        finally:
            self._acc = {}
        return logs

    def _copy_small(self):
        return [v.value.detach().clone() for v in self._small]

    def restore(self, snap, state):
        out = super().restore(snap, state)
        torch = self.torch
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:
            pass
        return out


class JaxRunner:
    """JAX: the state is the train function's argument (donated by Keras's step)."""

    backend = "jax"

    def __init__(
        self,
        model,
        original: Callable,
        mode: str = "accumulate",
        full_snapshot_max_bytes: int = FULL_SNAPSHOT_MAX_BYTES,
    ):
        import jax
        import jax.numpy as jnp

        self.jax = jax
        self.jnp = jnp
        self.model = model
        self.original = original
        self.mode = mode
        self.full_snapshot_max_bytes = full_snapshot_max_bytes
        self._acc = None
        self._micro_jit = jax.jit(self._micro, donate_argnums=(4,))
        self._apply_jit = jax.jit(self._apply, donate_argnums=(0, 1, 2))
        self._step = compat.jax_step_function(original)
        self.state_bytes = None

    # -- traced functions ------------------------------------------------------
    def _micro(self, tv, ntv, ov, mv, acc, data, w):
        box, scaled = [], []
        with oom_compat.capture_apply(
            self.model.optimizer, "jax", box.append, weight=w, on_scaled=lambda: scaled.append(1)
        ):
            logs, state = self.model.train_step((tv, ntv, ov, mv), data)
        if not box:
            raise compat.KerasInternalsError("keras_gpu_tools: train_step did not call optimizer.stateless_apply")
        grads = box[0]
        _, ntv2, _, mv2 = oom_compat.jax_state_parts(state)
        factor = 1.0 if scaled else w  # the loss was already weighted by scale_loss
        acc = [a + (g * factor).astype(a.dtype) for a, g in zip(acc, grads)]
        return logs, list(ntv2), list(mv2), acc

    def _apply(self, tv, ov, acc):
        tv2, ov2 = oom_compat.real_apply(self.model.optimizer, "jax")(ov, acc, tv)
        return list(tv2), list(ov2), [self.jnp.zeros_like(a) for a in acc]

    # -- running ---------------------------------------------------------------------
    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if k == 1:
            out = self.original(state, oom_compat.iter_one(batch))
        elif self.mode == "split":
            out = None
            for part, _ in micro_batches(batch, n, k):
                out = self.original(state, oom_compat.iter_one(part))
                state = out[1]
        else:
            out = self._run_accumulated(batch, n, k, state)
        if guarded:
            self.jax.block_until_ready(out)  # a late out-of-memory error surfaces here
        return out

    def _zeros(self, tv):
        return [self.jnp.zeros(a.shape, a.dtype) for a in tv]

    def _run_accumulated(self, batch, n, k, state):
        tv, ntv, ov, mv = oom_compat.jax_state_parts(state)
        acc = self._acc
        if acc is None or any(a.is_deleted() for a in acc):
            acc = self._zeros(tv)
        self._acc = None
        logs = None
        for part, w in micro_batches(batch, n, k):
            logs, ntv, mv, acc = self._micro_jit(tv, ntv, ov, mv, acc, part, self.jnp.float32(w))
        tv, ov, acc = self._apply_jit(tv, ov, acc)
        self._acc = acc
        return logs, (tv, ntv, ov, mv)

    # -- state -------------------------------------------------------------------------
    def _state_bytes(self, state) -> int:
        if self.state_bytes is None:
            self.state_bytes = sum(_nbytes(a) for part in state for a in part)
        return self.state_bytes

    def protect(self, state, guarded: bool) -> _Snapshot:
        if guarded and self._state_bytes(state) <= self.full_snapshot_max_bytes:
            host = self.jax.device_get([list(p) for p in state])
            shardings = [[getattr(a, "sharding", None) for a in p] for p in state]
            return _Snapshot("full", (host, shardings))
        return _Snapshot("none", None)

    def restore(self, snap: _Snapshot, state):
        self._acc = None
        alive = all(not a.is_deleted() for p in state for a in p)
        if alive:
            try:
                self.jax.block_until_ready(state)  # an error of an earlier step may sit in the inputs
                return state  # nothing was donated (the micro-batch path donates only its accumulator)
            except Exception:
                alive = False
        if snap.kind != "full":
            raise UnrecoverableOOM(
                "OOMBatchSizeReducer: out of memory in a JAX step whose state Keras had donated to the failed call "
                "(the weights and optimizer state were freed with it), and no host copy was kept (the state is over "
                f"{self.full_snapshot_max_bytes / 2**30:.1f} GiB, or this split had already run at this batch shape). "
                "Use `probe=True` so the split is chosen from the compiled step's memory analysis before running."
            )
        host, shardings = snap.items
        jax = self.jax
        restored = []
        for values, shards in zip(host, shardings):
            restored.append(
                [jax.device_put(v, s) if s is not None else jax.device_put(v) for v, s in zip(values, shards)]
            )
        return tuple(restored)

    def finish(self, result, guarded: bool):
        return result

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        """(fits, bytes needed) from XLA's memory analysis, or (None, None) where the device has no limit."""
        mem = oom_compat.jax_device_memory()
        limit = mem.get("bytes_limit")
        if not limit:
            return None, None
        try:
            jnp = self.jnp
            if k == 1:
                if self._step is None:
                    return None, None
                compiled = self._step.lower(state, batch).compile()
                extra = 0
            else:
                tv, ntv, ov, mv = oom_compat.jax_state_parts(state)
                part, w = micro_batches(batch, n, k)[0]
                acc = [self.jax.ShapeDtypeStruct(a.shape, a.dtype) for a in tv]
                compiled = self._micro_jit.lower(tv, ntv, ov, mv, acc, part, jnp.float32(w)).compile()
                extra = 0 if self._acc is not None else sum(_nbytes(a) for a in tv)
            ma = compiled.memory_analysis()
            if ma is None:
                return None, None
            need = (
                int(getattr(ma, "temp_size_in_bytes", 0))
                + int(getattr(ma, "output_size_in_bytes", 0))
                - int(getattr(ma, "alias_size_in_bytes", 0))
                + extra
            )
            need += sum(_nbytes(x) for x in leaves(batch) if not hasattr(x, "is_deleted"))  # host inputs to copy
            in_use = mem.get("bytes_in_use", 0)
            return in_use + need <= 0.95 * limit, need
        except Exception as e:
            logger.debug("keras_gpu_tools: memory analysis failed: %s", e)
            return None, None


def make_runner(backend: str, model, original: Callable, mode: str = "accumulate", **kwargs):
    cls = {"tensorflow": TFRunner, "jax": JaxRunner, "torch": TorchRunner}.get(backend)
    if cls is None:
        raise ValueError(
            f"OOMBatchSizeReducer: the Keras backend {backend!r} is not supported (tensorflow, jax, torch)."
        )
    return cls(model, original, mode, **kwargs)
