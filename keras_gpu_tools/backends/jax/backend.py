"""The JAX backend: step calls, syncs, profiler, OOM, accumulation, memory, FLOPs.

JAX's train function is ``logs, state = f(state, iterator)``; it calls
``next(iterator)`` in Python, so the step hook wraps the iterator to time every
fetch. The jitted step donates its state (``donate_argnums=0``): after an OOM
every weight and optimizer array of the failed call is deleted, which is why
the OOM reducer keeps a host copy for a first attempt, and why XLA's memory
analysis (``predicts_memory``) is worth asking before running.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

from keras_gpu_tools.backends.base import Backend, Stats
from keras_gpu_tools.errors import KerasInternalsError, UnrecoverableOOM
from keras_gpu_tools.memory.accumulate import (
    FULL_SNAPSHOT_MAX_BYTES,
    LossRouting,
    Snapshot,
    concat_outputs,
    measure_order,
    micro_batches,
    nbytes,
    refusal,
)
from keras_gpu_tools.memory.split import split_sizes
from keras_gpu_tools.profiling.trace import ProfilerBusy, TracerOptions
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, leading_dim, leaves, shape_and_dtype
from keras_gpu_tools.telemetry import peaks as gpu_peaks

logger = logging.getLogger("keras_gpu_tools")


# -- the step ------------------------------------------------------------------------------
class _FetchTimer:
    """Wraps the JAX train function's iterator: times and counts each next()."""

    __slots__ = ("it", "clock", "total", "count", "samples", "last")

    def __init__(self, clock):
        self.clock = clock

    def reset(self, it, count_samples: bool = True):
        self.it = it
        self.total = 0.0
        self.count = 0
        self.samples = 0 if count_samples else None
        self.last = None
        return self

    def __iter__(self):
        return self

    def __next__(self):
        t = self.clock()
        try:
            batch = next(self.it)
        finally:
            self.total += self.clock() - t
        self.count += 1
        self.last = batch
        if self.samples is not None:
            n = leading_dim(batch)
            self.samples = None if n is None else self.samples + n
        return batch


def _call_jax(hook, state, iterator):
    jax = deps.loaded("jax")
    rec = hook.begin(lambda: _wait(jax, state))  # before the step donates it
    timer = hook.fetch_timer.reset(iterator)
    rec.start = hook.clock()
    out = hook.around(rec, lambda: hook.inner(state, timer))
    returned = hook.clock()
    if rec.sampled and jax is not None:
        _wait(jax, out)
    rec.end = hook.clock()
    rec.fetch = timer.total
    rec.steps = max(timer.count, 1)
    rec.samples = timer.samples if timer.count else None
    if rec.sampled:
        if BACKEND.async_device():
            # On a GPU the step's single executable is launched when the
            # call returns; the Python before it (argument handling) is
            # host time that overlaps the previous step in a pipeline.
            rec.compute = rec.end - returned
            rec.dispatch = max(0.0, returned - rec.start - timer.total)
        else:
            rec.compute = rec.end - rec.start - timer.total
        hook.check_signature(rec, timer.last)
        if hook.capture_args:  # shapes for an observer's cost analysis
            rec.extra["jax_args"] = (state, timer.last)
    timer.it = timer.last = None
    return out


def _light_jax(hook, state, iterator):
    """The light path: Keras's step with its fetch timed, no record, no sync."""
    timer = hook.fetch_timer.reset(iterator, count_samples=False)
    try:
        out = hook.inner(state, timer)
    finally:
        timer.it = timer.last = None
    hook.add_covered_fetch(timer.total, timer.count)
    return out


def _wait(jax, tree) -> None:
    """Waits until the step that produced ``tree`` has finished.

    One leaf is enough: a step is one XLA executable, whose outputs are ready
    together, and the state chains every step to the one before. Waiting on
    every leaf costs a round trip per array (about 2.5 ms per sync for a small
    MLP's state on an H200, 2% of a 1 ms step at one sample in 100).
    """
    if jax is None:
        return
    leaf = next(leaves(tree), None)
    if leaf is not None:
        jax.block_until_ready(leaf)


def iter_one(batch):
    return iter([batch])


def _batch_shards(batch):
    """The leaves of a batch laid out over several devices along the batch axis (data parallelism), or None."""
    found = list(leaves(batch))
    if not found or not all(hasattr(a, "addressable_shards") for a in found):
        return None
    first = found[0].sharding
    if len(first.device_set) <= 1 or first.is_fully_replicated:
        return None
    return found


def spans_processes(batch) -> bool:
    """Whether a batch is one array over the devices of several processes (a step of a job), not this process's own."""
    return any(getattr(a, "is_fully_addressable", True) is False for a in leaves(batch))


def _local(arrays) -> list:
    # This process's first copy: `addressable_data`, since some of Keras's replicated state arrays
    # of a job (the optimizer's and metrics' scalars) have no readable `addressable_shards`.
    return [a.addressable_data(0) if hasattr(a, "addressable_data") else a for a in arrays]


def jit_alone(fn: Callable) -> Callable:
    """``jax.jit`` for a program that this process compiles alone, in a job of several.

    On GPUs XLA shares the autotuning of each compilation between the job's
    processes (``xla_gpu_shard_autotuning``): a program that one process
    compiles alone would wait for the others' share, a hang. Seen on 2 H200s:
    a program compiled by process 0 only never finished compiling.
    """
    import jax

    try:
        return jax.jit(fn, compiler_options={"xla_gpu_shard_autotuning": False})
    except TypeError:  # a JAX without per-jit compiler options
        return jax.jit(fn)


def rehearse_alone(runner, batch, n: int, k: int, step: Callable) -> None:
    """Runs ``step(part, w, totals)`` on the first micro-batch of ``n`` as ``k``, on this process's first device.

    Traced without the Keras distribution and run on one local device (the
    state given as this process's own copies, the part as its rows on its
    first device), the step has no collective, so an out-of-memory error here
    stops this process only; nothing is updated (the outputs are dropped,
    nothing is donated).
    """
    import jax
    import keras
    import numpy as np

    part, w = device_micro_batches(batch, n, k)[0]
    part = jax.tree_util.tree_map(lambda a: _local([a])[0], part)
    totals = np.ones((max(1, len(ki.flat_losses(runner.model) or [])),), "float32")
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    runner.routing.lenient = True  # the totals' values do not matter: the outputs are dropped
    try:
        out = step(part, np.float32(w), totals)
        jax.block_until_ready(out)
        del out
    finally:
        runner.routing.lenient = False
        keras.distribution.set_distribution(previous)


def device_micro_batches(batch, n: int, k: int) -> list[tuple[Any, float]]:
    """``(micro_batch, share)`` pairs of a batch split in ``k``; under data parallelism, each device's share split.

    A batch spread over several devices (``keras.distribution.DataParallel``,
    one process or several) is split where it lies: micro-batch ``i`` is
    every device's ``i``-th slice of its own rows, assembled as an array of
    the same layout. No sample moves to another device or process, every
    micro-batch is spread over all devices as the batch was, and every
    sample is in exactly one. Elsewhere, :func:`micro_batches`.
    """
    if _batch_shards(batch) is None:
        return micro_batches(batch, n, k)
    import jax

    def rows(a) -> int:
        shard = a.addressable_shards[0]
        return int(shard.data.shape[0])

    local = rows(next(leaves(batch)))
    k = min(k, local)
    cuts = [0]
    for size in split_sizes(local, k):
        cuts.append(cuts[-1] + size)

    def piece(a, i):
        if a is None:
            return None
        lo, hi = cuts[i], cuts[i + 1]
        if rows(a) != local:
            raise ValueError(
                f"OOMBatchSizeReducer: the inputs of a batch hold {local} and {rows(a)} rows per device; "
                "they cannot be split together."
            )
        shape = (a.shape[0] // local * (hi - lo),) + tuple(a.shape[1:])
        return jax.make_array_from_single_device_arrays(
            shape, a.sharding, [s.data[lo:hi] for s in a.addressable_shards]
        )

    out = []
    for i in range(k):
        part = jax.tree_util.tree_map(lambda a, i=i: piece(a, i), batch)
        out.append((part, (cuts[i + 1] - cuts[i]) / local))
    return out


# -- profiler ------------------------------------------------------------------------------
class _JAX:
    name = "jax"
    owner_thread_only = False  # stop() only from the thread that called start()
    pattern = "*.xplane.pb"

    def available(self) -> tuple[bool, str]:
        if sys.version_info < (3, 12):
            # Keras itself disables JAX profiling below 3.12 (a segfault was reported).
            return False, (
                "JAX profiling is unavailable on Python < 3.12: Keras disables it there "
                "because jax.profiler was reported to crash"
            )
        return True, ""

    def start(self, run_dir: str, options: TracerOptions) -> None:
        import jax

        kwargs = {}
        if hasattr(jax.profiler, "ProfileOptions"):
            po = jax.profiler.ProfileOptions()
            for attr, value in (
                ("host_tracer_level", options.host_tracer_level),
                ("python_tracer_level", 1 if options.python_tracer else 0),
            ):
                if hasattr(po, attr):
                    setattr(po, attr, value)
            kwargs["profiler_options"] = po
        try:
            jax.profiler.start_trace(run_dir, **kwargs)
        except RuntimeError as e:
            if "already" in str(e).lower():
                raise ProfilerBusy(str(e)) from None
            raise

    def step(self, step_num: int):
        import jax

        return jax.profiler.StepTraceAnnotation("train", step_num=step_num)

    def stop(self, outputs=None) -> None:
        import jax

        if outputs is not None:
            jax.block_until_ready(outputs)  # let the window's kernels finish inside the trace
        jax.profiler.stop_trace()


# -- gradient accumulation -----------------------------------------------------------------
class _HostSnapshot:
    """The state of a JAX step put back after a failed attempt: a host copy, since Keras's steps donate it."""

    state_bytes: int | None = None
    full_snapshot_max_bytes = FULL_SNAPSHOT_MAX_BYTES

    def _forget(self) -> None:
        """What a failed attempt leaves behind besides the state (the accumulator)."""

    def _state_bytes(self, state) -> int:
        if self.state_bytes is None:
            self.state_bytes = sum(nbytes(a) for part in state for a in part)
        return self.state_bytes

    def protect(self, state, guarded: bool) -> Snapshot:
        if guarded and self._state_bytes(state) <= self.full_snapshot_max_bytes:
            host = self.jax.device_get([list(p) for p in state])
            shardings = [[getattr(a, "sharding", None) for a in p] for p in state]
            return Snapshot("full", (host, shardings))
        return Snapshot("none", None)

    def restore(self, snap: Snapshot, state):
        self._forget()
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


class JaxRunner(_HostSnapshot):
    """JAX: the state is the train function's argument (donated by Keras's step)."""

    def _forget(self) -> None:
        self._acc = None

    backend = "jax"
    spans_processes = staticmethod(spans_processes)

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
        self._measure_jit = jax.jit(self._measure_fn)
        self._zeros_jit = None
        self._rehearse_jit = None
        self._step = ki.jax_step_function(original)
        self.state_bytes = None
        self.routing = LossRouting(model)
        self._memory: dict[tuple, dict[str, int] | None] = {}  # (batch signature, split) -> memory analysis

    # -- traced functions ------------------------------------------------------
    def _micro(self, tv, ntv, ov, mv, acc, data, w, totals):
        box, scaled = [], []
        with ki.capture_apply(
            self.model.optimizer, box.append, weight=w, on_scaled=lambda: scaled.append(1), stateless=True
        ):
            with self.routing.micro(w, totals):
                logs, state = self.model.train_step((tv, ntv, ov, mv), data)
        self.routing.check_step()
        if not box:
            raise KerasInternalsError("keras_gpu_tools: train_step did not call optimizer.stateless_apply")
        if len(box) > 1:
            raise refusal(
                "train_step applied gradients more than once (a second optimizer, or the same one twice): "
                "one accumulated update per batch cannot reproduce that"
            )
        grads = box[0]
        _, ntv2, _, mv2 = ki.jax_state_parts(state)
        factor = 1.0 if scaled else w  # the loss was already weighted by scale_loss
        acc = [a + (g * factor).astype(a.dtype) for a, g in zip(acc, grads)]
        return logs, list(ntv2), list(mv2), acc

    def rehearse(self, batch, n: int, k: int, state) -> None:
        """Runs the first micro-batch's step of a split on this process's first device alone; raises its error.

        What one device of a job's step holds: its rows of the micro-batch (the
        largest), the weights, the optimizer state and an accumulator, through
        the model's own ``train_step`` (see :func:`rehearse_alone`).
        """
        if self._rehearse_jit is None:
            self._rehearse_jit = jit_alone(self._micro)
        tv, ntv, ov, mv = (_local(p) for p in ki.jax_state_parts(state))
        acc = [self.jnp.zeros_like(a) for a in tv]
        rehearse_alone(
            self, batch, n, k, lambda part, w, totals: self._rehearse_jit(tv, ntv, ov, mv, acc, part, w, totals)
        )

    def _apply(self, tv, ov, acc):
        tv2, ov2 = self.model.optimizer.stateless_apply(ov, acc, tv)
        return list(tv2), list(ov2), [self.jnp.zeros_like(a) for a in acc]

    def _measure_fn(self, tv, ntv, data):
        return _measure_losses(self, tv, ntv, data)

    # -- running ---------------------------------------------------------------------
    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if k == 1:
            out = self.original(state, iter_one(batch))
        elif self.mode == "split":
            out = None
            for part, _ in device_micro_batches(batch, n, k):
                out = self.original(state, iter_one(part))
                state = out[1]
        else:
            out = self._run_accumulated(batch, n, k, state)
        if guarded:
            self.jax.block_until_ready(out)  # a late out-of-memory error surfaces here
        return out

    def _zeros(self, tv):
        if self._zeros_jit is None:  # laid out as the variables are (replicated over a mesh, say)
            self._zeros_jit = self.jax.jit(lambda t: [self.jnp.zeros_like(a) for a in t])
        return self._zeros_jit(list(tv))

    def _totals(self, parts, tv, ntv):
        routing = self.routing
        if not routing.needs_totals():
            return None
        first = [float(d) for d in self._measure_jit(tv, ntv, parts[0][0])]
        routing.measured = True
        if not routing.needs_totals():
            return None
        rest = [[float(d) for d in self._measure_jit(tv, ntv, part)] for part, _ in parts[1:]]
        return routing.totals([first] + rest)

    def _run_accumulated(self, batch, n, k, state):
        tv, ntv, ov, mv = ki.jax_state_parts(state)
        import numpy as np

        parts = device_micro_batches(batch, n, k)
        totals = self._totals(parts, tv, ntv)
        # Host values, not arrays on one device: under a job of several processes they are the
        # same everywhere, which a jit over the job's devices takes as replicated.
        vector = np.asarray(totals if totals else [1.0], "float32")
        acc = self._acc
        if acc is None or any(a.is_deleted() for a in acc):
            acc = self._zeros(tv)
        self._acc = None
        logs = None
        for part, w in parts:
            logs, ntv, mv, acc = self._micro_jit(tv, ntv, ov, mv, acc, part, np.float32(w), vector)
        tv, ov, acc = self._apply_jit(tv, ov, acc)
        self._acc = acc
        return logs, (tv, ntv, ov, mv)

    # -- state -------------------------------------------------------------------------
    def finish(self, result, guarded: bool):
        return result

    def memory_of(self, batch, n: int, k: int, state) -> dict[str, int] | None:
        """XLA's memory analysis of the program one attempt at ``k`` runs, compiled but not run; cached.

        ``arguments``, ``outputs``, ``temporaries``, ``aliased`` (outputs that
        reuse donated arguments) and ``need``: what the attempt adds to the
        memory in use, temporaries and new outputs, plus the accumulator and the
        batch's copy to the device where they are not there yet. Compiled with
        GPU autotuning off (:func:`analysed_memory`): autotuning runs
        candidate kernels, which is what made each failing split cost seconds.
        """
        key = (batch_signature(batch), k)
        if key in self._memory:
            return self._memory[key]
        found = None
        try:
            jnp = self.jnp
            state = _specs(state)
            if k == 1:
                if self._step is None:
                    return None
                lowered = self._step.lower(state, batch)
                extra = 0
            else:
                tv, ntv, ov, mv = ki.jax_state_parts(state)
                part, w = device_micro_batches(batch, n, k)[0]
                totals = jnp.ones((max(1, len(ki.flat_losses(self.model) or [])),), "float32")
                self.routing.lenient = True  # a trace for its memory analysis: the totals' values do not matter
                try:
                    lowered = self._micro_jit.lower(tv, ntv, ov, mv, list(tv), part, jnp.float32(w), totals)
                finally:
                    self.routing.lenient = False
                extra = 0 if self._acc is not None else sum(nbytes(a) for a in tv)  # the accumulator
            found = analysed_memory(lowered)
            if found is not None:
                host = sum(nbytes(x) for x in leaves(batch) if not hasattr(x, "is_deleted"))  # copied in
                found["need"] = found["temporaries"] + found["outputs"] - found["aliased"] + extra + host
        except Exception as e:
            logger.debug("keras_gpu_tools: memory analysis failed: %s", e)
            found = None
        self._memory[key] = found
        return found

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        """(fits, bytes needed) from XLA's memory analysis, or (None, None) where the device has no limit."""
        mem = BACKEND.device_memory()
        limit = mem.get("bytes_limit")
        if not limit:
            return None, None
        in_use = mem.get("bytes_in_use", 0)
        sig = batch_signature(batch)
        micro = -(-n // k)
        # A larger split than one analysed already: its need scaled by the micro-batch size (an
        # overestimate: the state's part does not shrink). Clearly fitting, it runs with no analysis.
        known = [(-(-n // kk), f["need"]) for (s, kk), f in self._memory.items() if s == sig and f and kk < k]
        if known:
            m0, need0 = min(known)
            estimate = int(need0 * micro / m0)
            if in_use + estimate <= ESTIMATE_FRACTION * limit:
                return True, estimate
        found = self.memory_of(batch, n, k, state)
        if found is None:
            return None, None
        need = found["need"]
        return in_use + need <= PREDICT_FRACTION * limit, need


#: The share of the device's memory limit a step may be predicted to use (XLA's
#: analysis leaves out allocator fragmentation and the runtime's own buffers).
PREDICT_FRACTION = 0.95
#: Below this share, a split estimated from a smaller one's analysis runs without an analysis of its own.
ESTIMATE_FRACTION = 0.8


def _specs(tree):
    """Shape-only stand-ins (with their sharding) of the arrays in ``tree``; donated ones included."""
    import jax

    def spec(a):
        if hasattr(a, "shape") and hasattr(a, "dtype") and hasattr(a, "is_deleted"):
            sharding = getattr(a, "sharding", None)
            try:
                return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
            except Exception:
                return jax.ShapeDtypeStruct(a.shape, a.dtype)
        return a

    return jax.tree_util.tree_map(spec, tree)


def analysed_memory(lowered) -> dict[str, int] | None:
    """XLA's memory analysis of ``lowered`` (see :func:`program_memory`), compiled but never run.

    On a GPU, compiled without autotuning (autotuning runs candidate kernels on
    buffers of the real size: 17 s and more at the sizes that run out of
    memory), twice: XLA's default GEMMs without autotuning are Triton fusions
    with their epilogue fused, while the autotuner may pick cuBLAS, whose
    output is a buffer of its own (seen on an H200: Dense(64 -> 65536, relu)
    at batch 262144, temporaries of 64.1 GiB with Triton, 128.1 GiB with
    cuBLAS and in the autotuned program that runs). The larger of the two is
    what the step may ask.
    """
    if not BACKEND.async_device():
        return program_memory(lowered.compile())
    found = None
    for options in ({"xla_gpu_enable_triton_gemm": False}, {}):
        try:
            memory = program_memory(lowered.compile(compiler_options={"xla_gpu_autotune_level": 0, **options}))
        except Exception as e:  # an XLA without these options
            logger.debug("keras_gpu_tools: compiling for the memory analysis (%s) failed: %s", options, e)
            continue
        if memory is not None and (found is None or memory["temporaries"] > found["temporaries"]):
            found = memory
    return found if found is not None else program_memory(lowered.compile())


def program_memory(compiled) -> dict[str, int] | None:
    """``arguments``, ``outputs``, ``temporaries``, ``aliased`` bytes of a compiled program (XLA's analysis)."""
    ma = compiled.memory_analysis()
    if isinstance(ma, (list, tuple)):
        ma = ma[0] if ma else None
    if ma is None:
        return None
    return {
        "arguments": int(getattr(ma, "argument_size_in_bytes", 0)),
        "outputs": int(getattr(ma, "output_size_in_bytes", 0)),
        "temporaries": int(getattr(ma, "temp_size_in_bytes", 0)),
        "aliased": int(getattr(ma, "alias_size_in_bytes", 0)),
    }


class JaxEvalRunner(_HostSnapshot):
    """JAX: a test step (state: trainable, non-trainable, metrics) or a predict step (trainable, non-trainable).

    Keras's own steps donate their state, so a first attempt keeps a host copy
    (:class:`_HostSnapshot`); split, the micro-batches run through a jit of the
    model's own ``test_step``/``predict_step`` that donates nothing.
    """

    backend = "jax"
    idle_recoverable = False  # Keras's step donated the weights: without a copy nothing can be retried

    def __init__(self, model, kind: str, original: Callable, mode: str = "accumulate"):
        import jax
        import jax.numpy as jnp

        self.jax = jax
        self.jnp = jnp
        self.model = model
        self.kind = kind
        self.original = original
        self.mode = mode
        self.routing = LossRouting(model)
        self._micro_jit = jax.jit(self._micro)
        self._plain_jit = jax.jit(lambda state, data: self.model.test_step(state, data))
        self._measure_jit = jax.jit(lambda tv, ntv, data: _measure_losses(self, tv, ntv, data))
        self._rehearse_jit = None

    def _micro(self, state, data, w, totals):
        if self.kind == "predict":
            outputs, ntv = self.model.predict_step(state, data)
            return outputs, (state[0], ntv)
        with self.routing.micro(w, totals):
            logs, state = self.model.test_step(state, data)
        self.routing.check_step()
        return logs, state

    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if k == 1:
            out = self.original(state, iter_one(batch))
        elif self.kind == "predict":
            outputs = []
            for part, _ in device_micro_batches(batch, n, k):
                o, state = self._micro_jit(state, part, self.jnp.float32(1.0), self.jnp.ones((1,), "float32"))
                outputs.append(o)
            out = (concat_outputs(outputs), state)
        elif self.mode == "split":
            out = None
            for part, _ in device_micro_batches(batch, n, k):
                out = self._plain_jit(state, part)  # Keras's own test_step, not donating
                state = out[1]
        else:
            parts = device_micro_batches(batch, n, k)
            totals = None
            if self.routing.needs_totals():
                tv, ntv = state[0], state[1]
                first = [float(d) for d in self._measure_jit(tv, ntv, parts[0][0])]
                self.routing.measured = True
                if self.routing.needs_totals():
                    rest = [[float(d) for d in self._measure_jit(tv, ntv, p)] for p, _ in parts[1:]]
                    totals = self.routing.totals([first] + rest)
            vector = self.jnp.asarray(totals if totals else [1.0], "float32")
            out = None
            for part, w in parts:
                out = self._micro_jit(state, part, self.jnp.float32(w), vector)
                state = out[1]
        if guarded:
            self.jax.block_until_ready(out)
        return out

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        return None, None

    spans_processes = staticmethod(spans_processes)

    def rehearse(self, batch, n: int, k: int, state) -> None:
        """The first micro-batch's test or predict step on this process's first device alone (see :func:`rehearse_alone`)."""
        if self._rehearse_jit is None:
            self._rehearse_jit = jit_alone(self._micro)
        local = tuple(_local(p) for p in state)
        rehearse_alone(self, batch, n, k, lambda part, w, totals: self._rehearse_jit(local, part, w, totals))


def _measure_losses(runner, tv, ntv, data):
    """Each compiled loss's denominator on ``data`` (traced: a forward pass in inference mode)."""
    import keras

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred, _ = runner.model.stateless_call(tv, ntv, x, **ki.training_kwargs(runner.model, False))
    out = []
    with runner.routing.measuring(out):
        ki.compute_loss_of(runner.model, y, y_pred, sample_weight)
    return [runner.jnp.asarray(d, "float32") for d in measure_order(out)]


# -- FLOPs ---------------------------------------------------------------------------------
def _flops_of(cost) -> float | None:
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    try:
        flops = float((cost or {}).get("flops", 0.0))
    except (TypeError, ValueError, AttributeError):
        return None
    return flops if flops > 0 else None


def _one_execution(iterator, steps: int):
    """The batches of one call of ``steps_per_execution`` steps, fetched as they are used.

    No first batch ends the epoch (``StopIteration``, as Keras's own function
    raises it); a shorter last execution just runs fewer steps.
    """
    first = next(iterator)
    return itertools.chain((first,), itertools.islice(iterator, steps - 1))


def _distributed_client():
    """The client of ``jax.distributed`` (its key-value store is the job's channel), or None.

    JAX exposes it only as ``jax._src.distributed.global_state.client`` (checked
    with JAX 0.10 to 0.12); a JAX that moves it leaves job-wide figures out.
    """
    try:
        from jax._src import distributed

        client = distributed.global_state.client
    except Exception:
        return None
    return client if hasattr(client, "blocking_key_value_get") else None


class JaxBackend(Backend):
    """JAX (jitted steps with donated state, ``jax.profiler``, XLA memory analysis)."""

    install_hint = "install the CUDA plugin: `pip install -U 'jax[cuda13]'` (or jax[cuda12] for CUDA 12 drivers)"

    traced_flops = True
    predicts_memory = True
    even_shares = True
    counts_idle_batches = True

    def __init__(self):
        super().__init__("jax")
        self._gpus = None  # the device list is fixed once JAX has started
        self._async = None

    # -- devices and memory
    def _gpu_list(self):
        jax = deps.loaded("jax")
        if jax is None:
            return []
        if self._gpus is None:
            self._gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
        return self._gpus

    def gpu_devices(self) -> list[str]:
        return [str(d) for d in self._gpu_list()]

    # -- the job
    def topology(self, model):
        from keras_gpu_tools.runtime import topology

        jax = deps.loaded("jax")
        if jax is None:
            return topology.single()
        import keras

        dist = keras.distribution.distribution()
        mesh = getattr(dist, "device_mesh", None)
        in_step = int(getattr(getattr(mesh, "devices", None), "size", 0) or 1)
        engine = (
            f"keras.distribution {type(dist).__name__}, mesh {dict(zip(mesh.axis_names, mesh.shape))}"
            if mesh is not None
            else "one device"
        )
        gpus = self._gpu_list()
        ids = tuple(int(d.id) for d in (gpus or jax.local_devices()))
        count = jax.process_count()
        if count <= 1:
            return topology.single(engine, in_step, ids)
        index = jax.process_index()
        # Processes meet only where the step does (its mesh reaches other processes'
        # devices); a job whose processes each train their own model would otherwise
        # make the fastest wait for the slowest at every epoch end.
        spans = in_step > len(jax.local_devices())
        client = _distributed_client() if spans else None
        return topology.Topology(
            process_index=index,
            process_count=count,
            device_ids=ids,
            devices_in_step=in_step,
            engine=engine if spans else f"{engine}: each of the {count} processes trains its own model",
            source="jax.distributed",
            exchange=topology.KVExchange(client, index, count) if client is not None else None,
        )

    def distribution_notes(self, topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
        jax = deps.loaded("jax")
        if jax is None:
            return []
        notes = []
        local = len(jax.local_devices())
        if local > 1 and topology.devices_in_step < 2:
            notes.append(
                (
                    "info",
                    f"JAX sees {local} devices and no keras.distribution is set: fit() runs on one. "
                    "keras.distribution.set_distribution(keras.distribution.DataParallel()) spreads each batch "
                    "over all of them.",
                )
            )
        return notes

    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        gpus = self._gpu_list()
        out: Stats = {}
        for i in indices:
            if i < len(gpus):
                stats = gpus[i].memory_stats() or {}
                if "bytes_in_use" in stats:
                    out[i] = (
                        float(stats["bytes_in_use"]),
                        float(stats.get("peak_bytes_in_use", stats["bytes_in_use"])),
                    )
        return out

    def device_memory(self) -> dict:
        """The first JAX device's memory figures (empty where it reports none, e.g. CPU)."""
        jax = deps.loaded("jax")
        if jax is None:
            return {}
        try:
            dev = jax.local_devices()[0]
            stats = dev.memory_stats() or {}
            out = {"device": getattr(dev, "device_kind", str(dev))}
            for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use"):
                if k in stats:
                    out[k] = int(stats[k])
            return out
        except Exception:
            return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        out = {}
        for i, dev in enumerate(self._gpu_list()):
            stats = dev.memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                limit = stats.get("bytes_limit")
                out[i] = (float(stats["peak_bytes_in_use"]), float(limit) if limit else None)
        return out

    def uses_tf32(self) -> bool:
        jax = deps.loaded("jax")
        return jax is not None and jax.config.jax_default_matmul_precision in (None, "default", "tensorfloat32")

    def framework_facts(self, facts) -> None:
        import os

        import jax

        facts.version = jax.__version__
        try:
            has_gpu = bool(jax.devices("gpu"))
        except RuntimeError:  # "Unknown backend: 'gpu' requested" on a CPU-only jaxlib
            has_gpu = False
        facts.gpus = [str(d) for d in jax.devices() if d.platform == "gpu"] if has_gpu else []
        facts.notes.append(f"default JAX platform: {jax.default_backend()}")
        if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() != "false":
            facts.notes.append(
                "JAX preallocates 75% of GPU memory: NVML's 'memory used' says little; "
                "GPUUtilizationLogger's allocator_memory_mib shows what is really held"
            )

    def async_device(self) -> bool:
        """Whether the default device runs asynchronously to the host (a GPU, not the CPU)."""
        if self._async is None:
            jax = deps.loaded("jax")
            try:
                self._async = jax is not None and jax.default_backend() != "cpu"
            except Exception:
                self._async = False
        return self._async

    # -- the step
    def sync(self, outputs) -> None:
        jax = deps.loaded("jax")
        if outputs is not None and jax is not None:
            _wait(jax, outputs)

    def step_caller(self, hook) -> Callable:
        hook.fetch_timer = _FetchTimer(hook.clock)
        return lambda state, iterator: _call_jax(hook, state, iterator)

    def fetch_caller(self, hook) -> Callable:
        return lambda state, iterator: _light_jax(hook, state, iterator)

    def shape_specs(self, args):
        try:
            import jax

            def spec(a):
                return jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") and hasattr(a, "dtype") else a

            return jax.tree_util.tree_map(spec, args)
        except Exception:
            return None

    def step_flops(self, train_function: Callable, specs) -> tuple[float | None, str]:
        step = ki.jax_step_function(train_function)
        if step is None or specs is None:
            return None, ""
        # XLA's HLO cost analysis of the un-optimised step, lowered for the CPU
        # platform (a GPU-compiled program hides its matmuls in cuBLAS custom
        # calls, which count 0). Where this JAX has no lowered cost analysis,
        # the matmuls and convolutions of the step's jaxpr are counted instead.
        try:
            flops = _flops_of(step.trace(*specs).lower(lowering_platforms=("cpu",)).cost_analysis())
        except Exception:
            flops = None
        if flops:
            return flops, "XLA cost analysis"
        import jax

        flops = gpu_peaks.jaxpr_flops(jax.make_jaxpr(step)(*specs)) or None
        return flops, "matmul/convolution FLOPs of the step's jaxpr"

    # -- planning the batch size
    def replicas(self, model) -> int:
        return ki.jax_data_parallel()[0]

    def device_capacities(self, model, replicas: int) -> list[int | None]:
        out = []
        for dev in self._gpu_list()[:replicas]:
            limit = (dev.memory_stats() or {}).get("bytes_limit")
            out.append(int(limit) if limit else None)
        return out + [None] * (replicas - len(out))

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """XLA's memory analysis of Keras's compiled train step on ``batch``'s shapes; compiled, not run."""
        import jax

        model.make_train_function()
        step = ki.jax_step_function(model.train_function)
        if step is None:
            raise ValueError(
                "plan_batch_size: the JAX train step is not jitted (run_eagerly=True or jit_compile=False); "
                "XLA's memory analysis needs the compiled step."
            )
        _, dist = ki.jax_data_parallel()

        def spec(a):
            if a is None:
                return None
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=ki.jax_batch_sharding(dist, tuple(a.shape)))

        x, y = batch
        data = jax.tree_util.tree_map(spec, (x, y) if y is not None else (x,))
        memory = analysed_memory(step.lower(_specs(ki.jax_state_of(model)), data))
        if memory is None:
            raise ValueError("plan_batch_size: XLA returned no memory analysis for the train step.")
        peak = memory["arguments"] + memory["temporaries"] + memory["outputs"] - memory["aliased"]
        return [float(peak)] * replicas, self.plan_method(model)

    def plan_method(self, model) -> str:
        return (
            "XLA's memory analysis of the compiled train step, per device (arguments + temporaries + outputs, "
            "less the outputs that reuse donated arguments); compiled, never run"
        )

    # -- profiler
    def profiler(self):
        return _JAX()

    # -- out of memory
    def is_oom(self, exc: BaseException) -> bool:
        if deps.loaded("jax") is None and deps.loaded("jaxlib") is None:
            return False
        return any(isinstance(exc, cls) for cls in _runtime_errors()) and _is_xla_oom_message(str(exc))

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        made = type(original)(message)
        return made if isinstance(made, BaseException) else None

    def explain_oom(self, error, context) -> tuple[dict, dict]:
        """The device's memory statistics, the largest live arrays, the failing program's memory analysis,
        and (``context["files"]``) the device memory profile (pprof, for ``pprof`` or xprof)."""
        jax = deps.loaded("jax")
        figures: dict[str, Any] = {"sources": []}
        artifacts: dict[str, bytes] = {}
        if jax is None:
            return figures, artifacts
        try:
            dev = jax.local_devices()[0]
            stats = dev.memory_stats() or {}
            if stats:
                figures["device"] = getattr(dev, "device_kind", str(dev))
                figures["in_use_bytes"] = stats.get("bytes_in_use")
                figures["peak_bytes"] = stats.get("peak_bytes_in_use")
                limit = stats.get("bytes_limit")
                if limit:
                    figures["capacity_bytes"] = int(limit)
                    figures["free_bytes"] = max(0, int(limit) - int(stats.get("bytes_in_use", 0)))
                figures["sources"].append(f"{dev}.memory_stats()")
        except Exception:
            pass
        try:
            live = sorted(jax.live_arrays(), key=lambda a: -int(getattr(a, "nbytes", 0)))[:5]
            figures["largest"] = [(f"live array {a.dtype}{list(a.shape)}", int(a.nbytes)) for a in live]
            if live:
                figures["sources"].append("jax.live_arrays()")
        except Exception:
            pass
        runner = context.get("runner")
        if hasattr(runner, "memory_of"):
            program = runner.memory_of(context["batch"], context["n"], context["k"], context["state"])
            if program:
                figures["program"] = {k: v for k, v in program.items() if k != "need"}
                figures["sources"].append("XLA's memory analysis of the failing program (compiled, not run)")
                if error is None and context.get("predicted_need") is not None:
                    figures["requested_bytes"] = int(context["predicted_need"])
                    figures["allocation"] = f"the step at split {context['k']} (predicted, not run)"
        if context.get("files"):
            try:
                artifacts["device_memory.prof"] = jax.profiler.device_memory_profile()
            except Exception:
                logger.debug("keras_gpu_tools: no device memory profile", exc_info=True)
        return figures, artifacts

    def reducer_problem(self, model) -> str | None:
        return None

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs):
        return JaxRunner(model, original, mode, **kwargs)

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate"):
        return JaxEvalRunner(model, kind, original, mode)

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        def step_function(state, iterator):
            outputs = []
            for batch in _one_execution(iterator, steps_per_execution):
                out, state = one(batch, state)
                outputs.append(out)
            return (concat_outputs(outputs) if kind == "predict" else outputs[-1]), state

        return step_function

    def hand_back_eval_state(self, model, kind: str, state) -> None:
        ki.jax_write_variables(model, kind, state)

    def reducer_call(self, one: Callable, idle, runner, steps_per_execution: int, replicas: int = 1) -> Callable:
        original, run_idle = runner.original, idle.run
        step = ki.jax_batch_step(original) if steps_per_execution == 1 else None
        if step is None:  # not Keras's own one-batch function: the batch goes in as an iterator

            def step(state, batch):
                return original(state, iter((batch,)))

        def train_function_1(state, iterator):
            if idle.free:  # one of the epoch's full batches, whose shape ran whole: unchecked (IdlePath), inline
                idle.free -= 1
                batch = next(iterator)  # outside the try: the end of data is not the step's error
                try:
                    out = step(state, batch)
                except Exception as e:
                    idle.failed(e, idle.full)
                    raise
                idle.steps += 1
                return out
            batch = next(iterator)
            try:  # batch_signature(batch), its common case inline (see the torch backend's)
                sig = tuple(map(shape_and_dtype, batch)) if type(batch) is tuple else batch_signature(batch)
            except AttributeError:  # a None or a nested leaf
                sig = batch_signature(batch)
            if sig == idle.signature:  # the idle path (IdlePath)
                return run_idle(step, state, batch)
            return one(batch, state)

        if steps_per_execution == 1:
            return train_function_1

        def train_function(state, iterator):
            logs = None
            for batch in _one_execution(iterator, steps_per_execution):
                logs, state = train_function_1(state, iter((batch,)))
            return logs, state

        return train_function

    def check_late_error(self, model) -> BaseException | None:
        try:
            import jax

            jax.block_until_ready([v.value for v in model.variables])
        except Exception as e:
            return e
        return None

    def hand_back_state(self, model, state) -> None:
        ki.jax_hand_back_state(model, state)


_XLA_OOM_PREFIX = "RESOURCE_EXHAUSTED"


def _is_xla_oom_message(message: str) -> bool:
    # GPU: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate ...".
    # XLA's CPU runtime reports a failed temporary allocation as
    # "INTERNAL: Error dispatching computation: ... Out of memory allocating N bytes".
    m = message.lstrip()
    return (
        m.startswith(_XLA_OOM_PREFIX)
        or "Out of memory allocating" in m
        or "Out of memory while trying to allocate" in m
    )


def _runtime_errors() -> tuple[type, ...]:
    out = []
    jax = deps.loaded("jax")
    errors = getattr(jax, "errors", None) if jax is not None else None
    for name in ("JaxRuntimeError", "XlaRuntimeError"):
        cls = getattr(errors, name, None)
        if isinstance(cls, type):
            out.append(cls)
    xc = deps.loaded("jaxlib.xla_client")
    cls = getattr(xc, "XlaRuntimeError", None) if xc is not None else None
    if isinstance(cls, type):
        out.append(cls)
    return tuple(out)


BACKEND = JaxBackend()
