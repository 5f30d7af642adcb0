"""The TensorFlow backend: step calls, syncs, profiler, OOM, accumulation, memory.

TensorFlow's train function is ``f(iterator)``: for a ``tf.data`` iterator it
runs a compiled multi-step loop that pulls batches inside the graph; for any
other iterable it calls the compiled per-batch ``one_step_on_data`` once per
element (``keras_internals.tf_run_batches``). A sampled step, and every step
of the OOM reducer, fetches its batches in Python and runs them the second way:
the same compiled step on the same batches, with the fetch timed and the
batch kept for a retry. The reducer's idle steps call the concrete function
of that compiled step for the batch's signature (``keras_internals.tf_batch_step``):
the same graph, without ``tf.function``'s per-call dispatch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from keras_gpu_tools.backends.base import Backend, Stats
from keras_gpu_tools.errors import InexactAccumulationError
from keras_gpu_tools.memory.accumulate import (
    StatefulEvalRunner,
    StatefulRunner,
    concat_outputs,
    measure_order,
    slice_batch,
)
from keras_gpu_tools.memory.split import split_sizes
from keras_gpu_tools.profiling.trace import ProfilerBusy, TracerOptions
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import ReplicaBatch, batch_signature, leading_dim, leaves

logger = logging.getLogger("keras_gpu_tools")


# -- the step ------------------------------------------------------------------------------
def _call_tf(hook, iterator):
    rec = hook.begin(lambda: hook.sync(hook.last_outputs))
    original = hook.inner
    has_around = bool(hook.arounds)
    if not rec.sampled and ki.tf_is_graph_iterator(iterator):
        rec.start = hook.clock()
        out = hook.around(rec, lambda: original(iterator)) if has_around else original(iterator)
        rec.end = hook.clock()
        hook.last_outputs = out
        return out
    clock = hook.clock
    rec.start = clock()

    def call():
        batches = _fetch(iterator, hook.steps_per_execution)
        if not batches:
            raise StopIteration
        fetched = clock()
        rec.fetch = max(0.0, fetched - rec.start - hook.fetch_overhead * len(batches))
        rec.steps = len(batches)
        n = leading_dim(batches[0])
        rec.samples = n * len(batches) if n is not None else None
        hook.check_signature(rec, batches[0])
        out = ki.tf_run_batches(original, batches)
        if rec.sampled:
            hook.sync(out)
            rec.compute = clock() - fetched
            if hook.fetch_overhead_unknown:
                _calibrate_tf_fetch(hook, batches[0])
        return out

    out = hook.around(rec, call) if has_around else call()
    rec.end = clock()
    hook.last_outputs = out
    return out


def _calibrate_tf_fetch(hook, batch) -> None:
    """The cost of ``next()`` itself on a ready element of this structure.

    A sampled TensorFlow step fetches in Python, which costs ~0.1 ms per
    batch that Keras's compiled loop does not pay. It is measured once on
    an in-memory dataset holding this batch and subtracted from the fetch.
    """
    hook.fetch_overhead_unknown = False
    tf = deps.loaded("tensorflow")
    if tf is None:
        return
    try:
        it = iter(tf.data.Dataset.from_tensors(batch).repeat())
        next(it)
        best = float("inf")
        for _ in range(7):
            t = hook.clock()
            next(it)
            best = min(best, hook.clock() - t)
        hook.fetch_overhead = best if best != float("inf") else 0.0
    except Exception:
        hook.fetch_overhead = 0.0


# -- profiler ------------------------------------------------------------------------------
class _TF:
    name = "tensorflow"
    owner_thread_only = False  # stop() only from the thread that called start()
    pattern = "*.xplane.pb"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def start(self, run_dir: str, options: TracerOptions) -> None:
        import tensorflow as tf

        opts = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=options.host_tracer_level,
            python_tracer_level=1 if options.python_tracer else 0,
            device_tracer_level=options.device_tracer_level,
        )
        try:
            tf.profiler.experimental.start(run_dir, options=opts)
        except tf.errors.AlreadyExistsError as e:
            raise ProfilerBusy(str(e) or "another TensorFlow profiler session is running") from None

    def step(self, step_num: int):
        import tensorflow as tf

        # `_r=1` makes this a root event: what xprof's step analysis looks for.
        return tf.profiler.experimental.Trace("train", step_num=step_num, _r=1)

    def stop(self, outputs=None) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()


# -- gradient accumulation -----------------------------------------------------------------
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
        self._accs = None
        self._rows = self._row_indices = None
        self._sparse: dict[int, None] = {}
        self._refused: InexactAccumulationError | None = None  # variables whose gradient is sparse (tf.IndexedSlices)
        self._w = None
        self._micro_fn = None
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
        per_replica = _replica_parts(batch, k)
        if self.mode == "split":
            out = None
            for micro in per_replica:
                out = self._run_original(_distribute(self.strategy, [part for part, _ in micro]))
            return out
        tf = self.tf
        totals = _replica_totals(self, per_replica)
        parts = [
            (
                _distribute(self.strategy, [part for part, _ in micro]),
                _distribute(self.strategy, [tf.constant(w, tf.float32) for _, w in micro]),
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

    def _build(self):
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
                        logs = _mean_over_replicas(strategy, logs)
                except InexactAccumulationError as e:
                    self._refused = e
                    raise
                return logs

            self._micro_fn = self._function(micro)

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

            def grad(i, has):
                if not has:
                    return None
                if i in sparse:
                    return tf.IndexedSlices(
                        self._rows[i].read_value(), self._row_indices[i].read_value(), tf.shape(variables[i])
                    )
                return self._accs[i].read_value()

            def apply():
                def replica():
                    grads = [grad(i, has) for i, has in applied]
                    self.model.optimizer.apply(grads, [variables[i] for i, _ in applied])
                    self._clear(i for i, _ in applied)
                    return tf.constant(0)

                return strategy.run(replica)

            fn = self._apply_fns[key] = self._function(apply)
        fn()

    def _clear(self, indices) -> None:
        tf = self.tf
        for i in indices:
            self._accs[i].assign(tf.zeros_like(self._accs[i]))
            if self._rows[i] is not None:
                self._rows[i].assign(self._rows[i][:0])
                self._row_indices[i].assign(self._row_indices[i][:0])

    def _sink(self, grads, variables):
        tf = self.tf
        for i, g in self._hand(grads, variables):
            if g is None:
                continue
            acc = self._accs[i]
            w = tf.cast(self._w, acc.dtype)
            if isinstance(g, tf.IndexedSlices) and self._rows[i] is not None:
                self._sparse[i] = None
                values = tf.cast(g.values, acc.dtype)
                self._rows[i].assign(tf.concat([self._rows[i], values if self._scaled else values * w], 0))
                self._row_indices[i].assign(tf.concat([self._row_indices[i], tf.cast(g.indices, tf.int64)], 0))
                continue
            g = tf.cast(tf.convert_to_tensor(g), acc.dtype)
            acc.assign_add(g if self._scaled else g * w)

    def _measure(self, part) -> list[float]:
        if self._measure_fn is None:
            self._measure_fn = self._function(_measuring(self))
        return [float(d) for d in self._measure_fn(part).numpy()]

    def _run_accumulated(self, parts, totals, distributed: bool = False):
        """``parts``: (micro-batch, its share); ``distributed``: per-replica values, with per-replica totals."""
        self._build()
        tf = self.tf
        logs = None
        if distributed:
            vector = totals if totals is not None else tf.constant([1.0], tf.float32)
        else:
            vector = tf.constant(totals if totals else [1.0], tf.float32)
        self._refused = None
        try:
            for part, w in parts:
                logs = self._micro_fn(part, w if distributed else tf.constant(w, tf.float32), vector)
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
        if self.replicas == 1:
            self._clear(range(len(self._accs)))
        else:  # a per-replica variable is written in its replica's context

            def clear():
                self._clear(range(len(self._accs)))
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
        per_replica = _replica_parts(batch, k)
        if self.kind == "predict":
            return self._predict_over_replicas(per_replica)
        if self.mode == "split":
            out = None
            for micro in per_replica:
                out = self._run_original(_distribute(self.strategy, [part for part, _ in micro]))
            return out
        totals = _replica_totals(self, per_replica)
        if totals is None:
            totals = tf.constant([1.0], tf.float32)
        if self._replica_fn is None:
            self._replica_fn = self._function(self._replica_micro)
        logs = None
        self._refused = None
        try:
            for micro in per_replica:
                data = _distribute(self.strategy, [part for part, _ in micro])
                w = _distribute(self.strategy, [tf.constant(share, tf.float32) for _, share in micro])
                logs = self._replica_fn(data, w, totals)
        except Exception:
            refused, self._refused = self._refused, None
            if refused is not None:
                raise refused from None
            raise
        return logs

    _replica_fn = None

    def _predict_over_replicas(self, per_replica):
        """Predictions of each replica's share split, in the unsplit step's order.

        Keras's predict step joins the replicas' outputs one after the other
        (replica 0's rows, then replica 1's): micro-batch ``i`` gives every
        replica's ``i``-th slice in that order, so its output is cut back per
        replica and each replica's slices joined before the next replica's.
        """
        tf = self.tf
        outputs = [self._run_original(_distribute(self.strategy, [part for part, _ in micro])) for micro in per_replica]
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
        return _mean_over_replicas(self.strategy, logs)

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


def _replica_parts(batch: ReplicaBatch, k: int) -> list[list[tuple[Any, float]]]:
    """``[micro][replica] -> (part, share)``: every replica's share split in ``k``, micro-batch ``i`` their ``i``-th slices.

    Each micro-batch is spread over the replicas as the batch was and no sample
    moves to another device; a replica's share of its own rows weights its loss
    (Keras's step averages each replica's loss over its own rows).
    """
    sizes = [leading_dim(p) or 0 for p in batch.parts]
    bounds = []
    for size in sizes:
        cuts = [0]
        for m in split_sizes(size, min(k, size)) if size else []:
            cuts.append(cuts[-1] + m)
        cuts += [cuts[-1]] * (k + 1 - len(cuts))
        bounds.append(cuts)
    return [
        [
            (slice_batch(p, b[i], b[i + 1]), (b[i + 1] - b[i]) / max(1, size))
            for p, b, size in zip(batch.parts, bounds, sizes)
        ]
        for i in range(k)
    ]


def _distribute(strategy, values: list):
    """Per-replica values (``values[r]`` on replica ``r``) as the strategy's distributed value."""
    return strategy.experimental_distribute_values_from_function(lambda ctx: values[ctx.replica_id_in_sync_group])


def _replica_totals(runner, per_replica):
    """Each replica's denominators of its share (what its loss averages over), where a loss needs them."""
    tf = runner.tf
    if not runner.routing.needs_totals():
        return None
    first = runner._measure(per_replica[0][0][0])
    runner.routing.measured = True
    if not runner.routing.needs_totals():
        return None
    rows = []
    for r in range(len(per_replica[0])):
        measured = [first] if r == 0 else [runner._measure(per_replica[0][r][0])]
        measured += [runner._measure(micro[r][0]) for micro in per_replica[1:]]
        rows.append(tf.constant(runner.routing.totals(measured), tf.float32))
    return _distribute(runner.model.distribute_strategy, rows)


def _mean_over_replicas(strategy, logs):
    """A step's per-replica logs as Keras's own step returns them (``reduce_per_replica``'s "auto": the mean)."""
    tf = deps.loaded("tensorflow")
    return tf.nest.map_structure(lambda v: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None), logs)


def _measuring(runner):
    """A function of one batch returning each compiled loss's denominator (a forward pass, no update)."""
    import keras

    tf = runner.tf

    def measure(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = runner.model(x, training=False)
        out = []
        with runner.routing.measuring(out):
            ki.compute_loss_of(runner.model, y, y_pred, sample_weight)
        found = measure_order(out)
        return tf.stack([tf.cast(d, tf.float32) for d in found]) if found else tf.zeros((0,))

    return measure


def _fetch(iterator, n: int) -> list[Any]:
    """Up to ``n`` batches pulled from the train function's iterator in Python."""
    end = end_of_data_errors()
    batches = []
    for _ in range(n):
        try:
            batches.append(next(iterator))
        except end:
            break
    return batches


def end_of_data_errors() -> tuple:
    tf = deps.loaded("tensorflow")
    return (StopIteration, tf.errors.OutOfRangeError) if tf is not None else (StopIteration,)


class TensorFlowBackend(Backend):
    """TensorFlow (``tf.data`` in the graph, ``tf.function`` steps, ``tf.profiler``)."""

    install_hint = (
        "install a GPU build: `pip install 'tensorflow[and-cuda]'` (tensorflow-cpu never uses a GPU; "
        "TensorFlow's GPU builds are for Linux/WSL2)"
    )

    def __init__(self):
        super().__init__("tensorflow")
        self._gpu_count = None  # fixed once TensorFlow has initialised its devices

    # -- devices and memory
    def gpu_devices(self) -> list[str]:
        tf = deps.loaded("tensorflow")
        if tf is None:
            return []
        return [d.name for d in tf.config.list_logical_devices("GPU")]

    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        tf = deps.loaded("tensorflow")
        out: Stats = {}
        if tf is None:
            return out
        if self._gpu_count is None:  # listing devices costs ~1 ms: once per process
            self._gpu_count = len(tf.config.list_logical_devices("GPU"))
        for i in indices:
            if i < self._gpu_count:
                info = tf.config.experimental.get_memory_info(f"GPU:{i}")
                out[i] = (float(info["current"]), float(info["peak"]))
        return out

    def device_memory(self) -> dict:
        tf = deps.loaded("tensorflow")
        if tf is None:
            return {}
        try:
            gpus = tf.config.list_logical_devices("GPU")
            if not gpus:
                return {}
            info = tf.config.experimental.get_memory_info("GPU:0")
            return {
                "device": "GPU:0",
                "bytes_in_use": int(info.get("current", 0)),
                "peak_bytes_in_use": int(info.get("peak", 0)),
            }
        except Exception:
            return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        tf = deps.loaded("tensorflow")
        if tf is None:
            return {}
        out = {}
        for i, _ in enumerate(tf.config.list_logical_devices("GPU")):
            info = tf.config.experimental.get_memory_info(f"GPU:{i}")
            out[i] = (float(info["peak"]), _gpu_total_bytes(i))
        return out

    def uses_tf32(self) -> bool:
        tf = deps.loaded("tensorflow")
        return bool(tf is not None and tf.config.experimental.is_tensor_float_32_execution_enabled())

    def framework_facts(self, facts) -> None:
        import tensorflow as tf

        facts.version = tf.__version__
        facts.gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
        facts.built_with_cuda = bool(tf.test.is_built_with_cuda())
        info = dict(tf.sysconfig.get_build_info())
        facts.cuda_version = info.get("cuda_version")
        facts.cudnn_version = info.get("cudnn_version")

    # -- the step
    def sync(self, outputs) -> None:
        if outputs is None:
            return
        leaf = next(leaves(outputs), None)
        if leaf is not None and hasattr(leaf, "numpy"):
            leaf.numpy()  # a device-to-host copy waits for the stream

    def step_caller(self, hook) -> Callable:
        return lambda iterator: _call_tf(hook, iterator)

    def execution_note(self, steps_per_execution: int) -> str | None:
        spe = steps_per_execution
        return (
            f"steps_per_execution={spe}: timed per execution of {spe} steps; a synced execution runs its "
            "batches one call each, so its compute includes per-step dispatch the compiled loop avoids."
        )

    # -- planning the batch size
    def replicas(self, model) -> int:
        return int(getattr(getattr(model, "distribute_strategy", None), "num_replicas_in_sync", 1) or 1)

    # -- the job
    def topology(self, model):
        from keras_gpu_tools.runtime import topology

        strategy = getattr(model, "distribute_strategy", None)
        n = self.replicas(model)
        tf = deps.loaded("tensorflow")
        if model is None and tf is not None:  # doctor: the strategy of the scope it runs in
            strategy = tf.distribute.get_strategy()
            n = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
        name = type(strategy).__name__ if strategy is not None else ""
        # The default strategy is one device; MultiWorkerMirroredStrategy does not
        # train under Keras 3 (keras-team/keras#20585), so a strategy is one process.
        engine = (
            f"tf.distribute {name} over {n} replicas"
            if n > 1 or name not in ("", "_DefaultDistributionStrategy")
            else "one device"
        )
        return topology.single(engine, n, tuple(range(n)) if n > 1 else None)

    def distribution_notes(self, topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
        # keras-team/keras#20585: "unsupported type PerReplica to a Tensor" inside fit(), with no callback.
        multi_worker = "TF_CONFIG" in env or "MultiWorker" in topology.engine
        notes = [
            (
                "warn" if multi_worker else "info",
                ("TF_CONFIG is set: " if "TF_CONFIG" in env else "")
                + "tf.distribute.MultiWorkerMirroredStrategy does not train with Keras 3's fit() "
                "(keras-team/keras#20585). Several hosts with Keras 3 means the JAX backend: "
                "keras.distribution.initialize() in every process, then keras.distribution.DataParallel. "
                "MirroredStrategy over one host's GPUs works.",
            )
        ]
        if gpus > 1 and topology.devices_in_step < 2:
            notes.append(
                (
                    "info",
                    f"{gpus} GPUs are visible and fit() runs on one: create and compile the model under "
                    "tf.distribute.MirroredStrategy().scope() to use them all.",
                )
            )
        return notes

    def _plan_devices(self, replicas: int) -> list[str]:
        tf = deps.loaded("tensorflow")
        gpus = tf.config.list_logical_devices("GPU") if tf is not None else []
        return [f"GPU:{i}" for i in range(min(replicas, len(gpus)))] if gpus else ["CPU:0"]

    def device_capacities(self, model, replicas: int) -> list[int | None]:
        devices = self._plan_devices(replicas)
        if devices == ["CPU:0"]:
            return [None] * replicas
        return [_gpu_total_bytes(int(d.split(":")[1])) for d in devices]

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """One trial step to trace and compile, then one measured: the allocator's peak per device."""
        tf = deps.loaded("tensorflow")
        x, y = batch
        model.train_on_batch(x, y)
        devices = self._plan_devices(replicas)
        try:
            for d in devices:
                tf.config.experimental.reset_memory_stats(d)
        except ValueError:  # "Cannot reset memory stats for device 'CPU:0'": an allocator without statistics
            peaks = []
        else:
            model.train_on_batch(x, y)
            peaks = [float(tf.config.experimental.get_memory_info(d)["peak"]) for d in devices]
        if not any(peaks):
            raise ValueError(
                "plan_batch_size: this TensorFlow CPU allocator keeps no memory statistics (with "
                "TF_ENABLE_ONEDNN_OPTS=0, say). Set TF_CPU_ALLOCATOR_USE_BFC=true in the environment before "
                "TensorFlow is imported, or plan on a GPU."
            )
        return peaks, self.plan_method(model)

    def plan_method(self, model) -> str:
        return (
            "trial steps (one to trace and compile, one measured): tf.config.experimental.get_memory_info's "
            "peak per device"
        )

    # -- profiler
    def profiler(self):
        return _TF()

    # -- out of memory
    def is_oom(self, exc: BaseException) -> bool:
        tf = deps.loaded("tensorflow")
        cls = getattr(getattr(tf, "errors", None), "ResourceExhaustedError", None) if tf is not None else None
        return cls is not None and isinstance(exc, cls)

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        return type(original)(getattr(original, "node_def", None), getattr(original, "op", None), message)

    def explain_oom(self, error, context) -> tuple[dict, dict]:
        """``get_memory_info`` of the device the error names (GPU:0 by default; the CPU where its allocator keeps statistics)."""
        tf = deps.loaded("tensorflow")
        figures: dict[str, Any] = {}
        if tf is None:
            return figures, {}
        text = str(error or "")
        device = "GPU:0"
        for name in ("GPU", "CPU"):
            marker = f"device:{name}:"
            if marker in text:
                index = text.split(marker, 1)[1].split()[0].rstrip(".,")
                device = f"{name}:{''.join(c for c in index if c.isdigit()) or '0'}"
                break
        else:
            if not tf.config.list_logical_devices("GPU"):
                device = "CPU:0"
        try:
            info = tf.config.experimental.get_memory_info(device)
            if info.get("peak"):  # the default CPU allocator keeps none (zeros)
                figures["in_use_bytes"] = int(info["current"])
                figures["peak_bytes"] = int(info["peak"])
                figures["sources"] = [f"tf.config.experimental.get_memory_info({device!r})"]
        except Exception:
            pass
        if device.startswith("GPU"):
            total = _gpu_total_bytes(int(device.split(":")[1]))
            if total:
                figures["capacity_bytes"] = total
                if "in_use_bytes" in figures:
                    figures["free_bytes"] = max(0, total - figures["in_use_bytes"])
                figures.setdefault("sources", []).append("NVML (the GPU's total memory)")
        return figures, {}

    def reducer_problem(self, model) -> str | None:
        strategy = getattr(model, "distribute_strategy", None)
        n = getattr(strategy, "num_replicas_in_sync", 1)
        if n and n > 1 and type(strategy).__name__ != "MirroredStrategy":
            # MirroredStrategy is the one that trains under Keras 3 with several replicas in one
            # process; the others (TPUStrategy, parameter servers) are not tried.
            return (
                f"OOMBatchSizeReducer supports tf.distribute.MirroredStrategy, not {type(strategy).__name__} "
                f"with {n} replicas; use MirroredStrategy, train on one device or remove the callback."
            )
        return None

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs):
        return TFRunner(model, original, mode, **kwargs)

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate"):
        return TFEvalRunner(model, kind, original, mode)

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        if kind == "predict":

            def predict_function(batches):  # already fetched by predict()
                if replicas > 1:  # per-replica values: each replica's share split, as in a test step
                    batches = [_replica_batch(batch, replicas) for batch in batches]
                return concat_outputs([one(batch) for batch in batches])

            return predict_function

        def test_function(iterator):
            # Fetched in Python, like the training step, so that a batch survives an OOM.
            batches = _fetch(iterator, steps_per_execution)
            if not batches:
                raise StopIteration
            out = None
            for batch in batches:
                out = one(_replica_batch(batch, replicas) if replicas > 1 else batch)
            return out

        return test_function

    def reducer_call(self, one: Callable, idle, runner, steps_per_execution: int, replicas: int = 1) -> Callable:
        whole, run_idle = runner._run_original, idle.run  # Keras's own step on a fetched batch
        made = [None, whole]  # the idle signature, and the step made for it (Keras's compiled one)

        def idle_step(batch):
            # Keras's compiled step, resolved once for this signature; where that fails (or
            # the batch is per-replica values), Keras's own path runs it.
            if replicas > 1:
                return whole
            try:
                return ki.tf_batch_step(runner.original, batch) or whole
            except Exception:
                return whole

        def step(batch):
            if batch_signature(batch) == idle.signature:  # the idle path (IdlePath)
                if made[0] is not idle.signature:
                    made[:] = idle.signature, idle_step(batch)
                return run_idle(made[1], batch)
            return one(batch)

        if replicas > 1:

            def replica_train_function(iterator):
                # Each batch is per-replica values: kept as they are for Keras's own step, and
                # seen as each replica's share for splitting.
                batches = _fetch(iterator, steps_per_execution)
                if not batches:
                    raise StopIteration
                out = None
                for batch in batches:
                    out = step(_replica_batch(batch, replicas))
                return out

            return replica_train_function

        if steps_per_execution == 1:
            end = end_of_data_errors()

            def train_function_1(iterator):
                # The idle path of every step: one fetch, one call (see train_function).
                try:
                    batch = next(iterator)
                except end:
                    raise StopIteration from None
                return step(batch)

            return train_function_1

        def train_function(iterator):
            # Fetched in Python so that a batch survives an out-of-memory error
            # (one pulled inside the compiled loop is gone with it).
            batches = _fetch(iterator, steps_per_execution)
            if not batches:
                raise StopIteration
            out = None
            for batch in batches:
                out = step(batch)
            return out

        return train_function


def _replica_batch(batch, replicas: int) -> ReplicaBatch:
    """A batch of per-replica values as a :class:`ReplicaBatch`: replica ``r``'s share of each leaf."""
    tf = deps.loaded("tensorflow")

    def share(r):
        return tf.nest.map_structure(lambda v: v.values[r] if hasattr(v, "values") else v, batch)

    return ReplicaBatch(batch, [share(r) for r in range(replicas)])


def _gpu_total_bytes(index: int) -> int | None:
    """The total memory of the framework's GPU ``index`` from NVML (TensorFlow reports no capacity itself)."""
    try:
        from keras_gpu_tools.telemetry import devices, nvml

        found = devices.visible_gpus(nvml.default_nvml())
        if index < len(found) and found[index].memory_total_bytes:
            return int(found[index].memory_total_bytes)
    except Exception:
        pass
    return None


BACKEND = TensorFlowBackend()
