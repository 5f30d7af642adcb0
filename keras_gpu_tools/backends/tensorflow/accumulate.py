"""TensorFlow gradient-accumulation runners: one batch as micro-batches with one optimizer update.

What ``OOMBatchSizeReducer`` runs a batch with after an out-of-memory error
(the framework-free part is :mod:`keras_gpu_tools.memory.accumulate`): each
micro-batch's gradients are summed into variables (per replica under
``MirroredStrategy``), then applied once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from keras_gpu_tools.backends.tensorflow.data_parallel import (
    distribute,
    mean_over_replicas,
    replica_parts,
    replica_totals,
)
from keras_gpu_tools.errors import InexactAccumulationError
from keras_gpu_tools.memory.accumulate import StatefulEvalRunner, StatefulRunner, measure_order
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import ReplicaBatch, leading_dim


class TFRunner(StatefulRunner):
    backend = "tensorflow"

    # What differs per replica while a micro-batch is traced (replica functions run on threads).
    @property
    def _tls(self):
        tls = self.__dict__.get("_tls_obj")
        if tls is None:
            tls = self.__dict__["_tls_obj"] = threading.local()
        return tls

    @property
    def _w(self):
        return getattr(self._tls, "w", None)

    @_w.setter
    def _w(self, value):
        self._tls.w = value

    @property
    def _scaled(self):
        return getattr(self._tls, "scaled", False)

    @_scaled.setter
    def _scaled(self, value):
        self._tls.scaled = value

    @property
    def applies(self):
        return getattr(self._tls, "applies", 0)

    @applies.setter
    def applies(self, value):
        self._tls.applies = value

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import tensorflow as tf

        self.tf = tf
        # Built at the first accumulated step (_build): a summed gradient per trainable variable, and a
        # sparse gradient's rows and indices (None for a scalar variable).
        self._accs: list[Any] | None = None
        self._rows: list[Any] | None = None
        self._row_indices: list[Any] | None = None
        self._sparse: dict[int, None] = {}
        self._refused: InexactAccumulationError | None = None  # variables whose gradient is sparse (tf.IndexedSlices)
        self._w = None
        self._micro_fn: Callable | None = None
        self._apply_fns: dict[tuple, Callable] = {}
        self._measure_fn = None
        self._small_fn = None
        self.strategy = self.model.distribute_strategy
        self.replicas = int(getattr(self.strategy, "num_replicas_in_sync", 1) or 1)

    def _run_original(self, batch):
        if type(batch) is ReplicaBatch:
            batch = batch.original
        return ki.tf_run_batches(self.original, [batch])

    def _variable(self, initial, **kwargs):
        """An accumulator: under a strategy of several replicas, one copy per replica (summed when read across)."""
        tf = self.tf
        if self.replicas == 1:
            return tf.Variable(initial, trainable=False, **kwargs)
        with self.strategy.scope():
            return tf.Variable(
                initial,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
                **kwargs,
            )

    # -- several replicas (MirroredStrategy): each replica's share is split ----------------------
    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if type(batch) is not ReplicaBatch or k == 1:
            return super().run(batch, n, k, state, guarded)
        per_replica = replica_parts(batch, k)
        if self.mode == "split":
            out = None
            for micro in per_replica:
                out = self._run_original(distribute(self.strategy, [part for part, _ in micro]))
            return out
        tf = self.tf
        totals = replica_totals(self, per_replica)
        parts = [
            (
                distribute(self.strategy, [part for part, _ in micro]),
                distribute(self.strategy, [tf.constant(w, tf.float32) for _, w in micro]),
            )
            for micro in per_replica
        ]
        return self._run_accumulated(parts, totals, distributed=True)

    def _host(self, v):
        if self.replicas == 1:
            return super()._host(v)
        # A metric's variable is one per replica (ON_READ): read across replicas (their sum), and
        # assigned back the same way (TensorFlow spreads a SUM variable's value over the replicas).
        return v.numpy()

    def _function(self, fn):
        if getattr(self.model, "run_eagerly", False):
            return fn
        return self.tf.function(fn, reduce_retracing=True, jit_compile=bool(getattr(self.model, "jit_compile", False)))

    def _buffers(self) -> tuple[list[Any], list[Any], list[Any]]:
        """The accumulators, the sparse rows and their indices, built by :meth:`_build`."""
        if self._accs is None or self._rows is None or self._row_indices is None:
            raise RuntimeError("keras_gpu_tools: the accumulators are read before they were built")
        return self._accs, self._rows, self._row_indices

    def _build(self) -> Callable:
        """The compiled micro-batch step, with the accumulators it adds to (made at the first call)."""
        tf = self.tf
        if self._accs is None:
            self._accs = [
                self._variable(tf.zeros(tuple(v.shape), dtype=v.dtype), name="kgt_oom_acc")
                for v in self.model.trainable_variables
            ]
            # Sparse gradients (an embedding's tf.IndexedSlices) are kept as the rows and
            # indices of every micro-batch, concatenated: Keras's optimizers treat repeated
            # indices slice by slice (Adam squares each), so a dense sum would differ.
            self._rows = [
                self._variable(
                    tf.zeros((0, *tuple(v.shape)[1:]), dtype=v.dtype),
                    shape=tf.TensorShape([None, *tuple(v.shape)[1:]]),
                    name="kgt_oom_rows",
                )
                if len(v.shape)
                else None
                for v in self.model.trainable_variables
            ]
            self._row_indices = [
                self._variable(tf.zeros((0,), tf.int64), shape=tf.TensorShape([None]), name="kgt_oom_idx")
                if len(v.shape)
                else None
                for v in self.model.trainable_variables
            ]
            strategy = self.model.distribute_strategy

            def micro(data, w, totals):
                # Under MirroredStrategy each replica's function runs on a thread of its own and they
                # take turns at every merge_call (a summed variable's update): the optimizer and the
                # losses are routed once around all of them, and what differs per replica (its
                # weight, its totals, its count of applies) is kept per thread.
                local = self._tls

                def replica(d, w, totals):
                    local.w, local.totals, local.scaled, local.applies = w, totals, False, 0
                    return self.model.train_step(d)

                try:
                    with ki.capture_apply(
                        self.model.optimizer, self._sink, weight=lambda: local.w, on_scaled=self._mark_scaled
                    ):
                        with self.routing.micro(lambda: local.w, lambda: local.totals):
                            logs = strategy.run(replica, args=(data, w, totals))
                    self.routing.check_step(self.replicas)
                    if self.replicas > 1:
                        logs = mean_over_replicas(strategy, logs)
                except InexactAccumulationError as e:
                    self._refused = e
                    raise
                return logs

            self._micro_fn = self._function(micro)
        if self._micro_fn is None:
            raise RuntimeError("keras_gpu_tools: the accumulators were built without their step")
        return self._micro_fn

    def _apply(self):
        applied = self._applied()
        if not applied:
            return  # train_step applied nothing (no trainable weights): neither does the batch
        key = tuple(applied)
        fn = self._apply_fns.get(key)
        if fn is None:
            tf = self.tf
            strategy = self.model.distribute_strategy
            variables = self.model.trainable_variables

            sparse = set(self._sparse)
            accs, rows, row_indices = self._buffers()

            def grad(i, has):
                if not has:
                    return None
                if i in sparse:
                    return tf.IndexedSlices(rows[i].read_value(), row_indices[i].read_value(), tf.shape(variables[i]))
                return accs[i].read_value()

            def apply():
                def replica():
                    grads = [grad(i, has) for i, has in applied]
                    self.model.optimizer.apply(grads, [variables[i] for i, _ in applied])
                    self._clear(i for i, _ in applied)
                    return tf.constant(0)

                return strategy.run(replica)

            fn = self._apply_fns[key] = self._function(apply)
        fn()

    def _clear(self, indices: Iterable[int]) -> None:
        tf = self.tf
        accs, rows, row_indices = self._buffers()
        for i in indices:
            accs[i].assign(tf.zeros_like(accs[i]))
            if rows[i] is not None:
                rows[i].assign(rows[i][:0])
                row_indices[i].assign(row_indices[i][:0])

    def _sink(self, grads, variables):
        tf = self.tf
        accs, rows, row_indices = self._buffers()
        for i, g in self._hand(grads, variables):
            if g is None:
                continue
            acc = accs[i]
            w = tf.cast(self._w, acc.dtype)
            if isinstance(g, tf.IndexedSlices) and rows[i] is not None:
                self._sparse[i] = None
                values = tf.cast(g.values, acc.dtype)
                rows[i].assign(tf.concat([rows[i], values if self._scaled else values * w], 0))
                row_indices[i].assign(tf.concat([row_indices[i], tf.cast(g.indices, tf.int64)], 0))
                continue
            g = tf.cast(tf.convert_to_tensor(g), acc.dtype)
            acc.assign_add(g if self._scaled else g * w)

    def _measure(self, part) -> list[float]:
        if self._measure_fn is None:
            self._measure_fn = self._function(_measuring(self))
        return [float(d) for d in self._measure_fn(part).numpy()]

    def _run_accumulated(self, parts, totals, distributed: bool = False):
        """``parts``: (micro-batch, its share); ``distributed``: per-replica values, with per-replica totals."""
        micro_fn = self._build()
        tf = self.tf
        logs = None
        if distributed:
            vector = totals if totals is not None else tf.constant([1.0], tf.float32)
        else:
            vector = tf.constant(totals if totals else [1.0], tf.float32)
        self._refused = None
        try:
            for part, w in parts:
                logs = micro_fn(part, w if distributed else tf.constant(w, tf.float32), vector)
            self._apply()
        except Exception:
            refused, self._refused = self._refused, None
            if refused is not None:  # autograph turns it into a StagingError while tracing
                raise refused from None
            raise
        finally:
            self._w = None
        return logs

    def _reset_accumulator(self):
        if self._accs is None:
            return
        every = range(len(self._accs))
        if self.replicas == 1:
            self._clear(every)
        else:  # a per-replica variable is written in its replica's context

            def clear():
                self._clear(every)
                return self.tf.constant(0)

            self.strategy.run(clear)

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


class TFEvalRunner(StatefulEvalRunner):
    """TensorFlow: a test step (``f(iterator)``) or a predict step (``f(batches)``), split."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import tensorflow as tf

        self.tf = tf
        self._micro_fn = None
        self._measure_fn = None
        self._refused: InexactAccumulationError | None = None
        self.strategy = self.model.distribute_strategy
        self.replicas = int(getattr(self.strategy, "num_replicas_in_sync", 1) or 1)
        self._tls = threading.local()  # each replica's weight and totals while a micro-batch is traced

    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if type(batch) is not ReplicaBatch:
            return super().run(batch, n, k, state, guarded)
        if k == 1:
            return self._run_original(batch)
        # A test step over several replicas: each replica's share split (see TFRunner.run).
        tf = self.tf
        per_replica = replica_parts(batch, k)
        if self.kind == "predict":
            return self._predict_over_replicas(per_replica)
        if self.mode == "split":
            out = None
            for micro in per_replica:
                out = self._run_original(distribute(self.strategy, [part for part, _ in micro]))
            return out
        totals = replica_totals(self, per_replica)
        if totals is None:
            totals = tf.constant([1.0], tf.float32)
        if self._replica_fn is None:
            self._replica_fn = self._function(self._replica_micro)
        logs = None
        self._refused = None
        try:
            for micro in per_replica:
                data = distribute(self.strategy, [part for part, _ in micro])
                w = distribute(self.strategy, [tf.constant(share, tf.float32) for _, share in micro])
                logs = self._replica_fn(data, w, totals)
        except Exception:
            refused, self._refused = self._refused, None
            if refused is not None:
                raise refused from None
            raise
        return logs

    _replica_fn: Callable | None = None

    def _predict_over_replicas(self, per_replica):
        """Predictions of each replica's share split, in the unsplit step's order.

        Keras's predict step joins the replicas' outputs one after the other
        (replica 0's rows, then replica 1's): micro-batch ``i`` gives every
        replica's ``i``-th slice in that order, so its output is cut back per
        replica and each replica's slices joined before the next replica's.
        """
        tf = self.tf
        outputs = [self._run_original(distribute(self.strategy, [part for part, _ in micro])) for micro in per_replica]
        sizes = [[leading_dim(part) or 0 for part, _ in micro] for micro in per_replica]  # [micro][replica]

        def join(*leaves):
            pieces = []
            for r in range(len(sizes[0])):
                for i, leaf in enumerate(leaves):
                    start = sum(sizes[i][:r])
                    pieces.append(leaf[start : start + sizes[i][r]])
            return tf.concat(pieces, 0)

        return tf.nest.map_structure(join, *outputs)

    def _replica_micro(self, data, w, totals):
        local = self._tls

        def replica(d, w, totals):
            local.w, local.totals = w, totals
            return self.model.test_step(d)

        try:
            with self.routing.micro(lambda: local.w, lambda: local.totals):
                logs = self.strategy.run(replica, args=(data, w, totals))
            self.routing.check_step(self.replicas)
        except InexactAccumulationError as e:
            self._refused = e
            raise
        return mean_over_replicas(self.strategy, logs)

    def _function(self, fn):
        if getattr(self.model, "run_eagerly", False):
            return fn
        return self.tf.function(fn, reduce_retracing=True, jit_compile=bool(getattr(self.model, "jit_compile", False)))

    def _host(self, v):
        if int(getattr(self.model.distribute_strategy, "num_replicas_in_sync", 1) or 1) == 1:
            return super()._host(v)
        return v.numpy()  # a metric's per-replica variable, read across the replicas (see TFRunner._host)

    def _run_original(self, batch):
        if type(batch) is ReplicaBatch:
            batch = batch.original
        if self.kind == "predict":
            return self.original([batch])
        return ki.tf_run_batches(self.original, [batch])

    def _micro_test(self, part, w: float, totals: list[float]):
        tf = self.tf
        if self._micro_fn is None:

            def micro(data, w, totals):
                try:
                    with self.routing.micro(w, totals):
                        logs = self.model.test_step(data)
                    self.routing.check_step()
                except InexactAccumulationError as e:
                    self._refused = e
                    raise
                return logs

            self._micro_fn = self._function(micro)
        self._refused = None
        try:
            return self._micro_fn(part, tf.constant(w, tf.float32), tf.constant(totals, tf.float32))
        except Exception:
            refused, self._refused = self._refused, None
            if refused is not None:
                raise refused from None
            raise

    def _measure(self, part) -> list[float]:
        if self._measure_fn is None:
            self._measure_fn = self._function(_measuring(self))
        return [float(d) for d in self._measure_fn(part).numpy()]


def _measuring(runner):
    """A function of one batch returning each compiled loss's denominator (a forward pass, no update)."""
    import keras

    tf = runner.tf

    def measure(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = runner.model(x, training=False)
        out: list[tuple[int, Any]] = []
        with runner.routing.measuring(out):
            ki.compute_loss_of(runner.model, y, y_pred, sample_weight)
        found = measure_order(out)
        return tf.stack([tf.cast(d, tf.float32) for d in found]) if found else tf.zeros((0,))

    return measure
