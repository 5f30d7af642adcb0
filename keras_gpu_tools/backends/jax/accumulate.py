"""JAX gradient-accumulation runners: one batch as micro-batches with one optimizer update.

What ``OOMBatchSizeReducer`` runs a batch with after an out-of-memory error
(the framework-free part is :mod:`keras_gpu_tools.memory.accumulate`). Keras's
jitted step donates its state (``donate_argnums=0``): after an OOM every weight
and optimizer array of the failed call is deleted, which is why a first
attempt keeps a host copy, and why XLA's memory analysis is asked before running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from keras_gpu_tools.backends.jax.data_parallel import (
    alone,
    device_micro_batches,
    jit_alone,
    local_copies,
    rehearse_alone,
    spans_processes,
)
from keras_gpu_tools.backends.jax.memory import abstract_arrays, analysed_memory
from keras_gpu_tools.errors import KerasInternalsError, UnrecoverableOOM
from keras_gpu_tools.memory.accumulate import (
    FULL_SNAPSHOT_MAX_BYTES,
    LossRouting,
    concat_outputs,
    measure_order,
    nbytes,
    refusal,
)
from keras_gpu_tools.memory.runners import Snapshot
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, leaves

logger = logging.getLogger("keras_gpu_tools")


class Device(Protocol):
    """What a runner asks of the JAX backend: the device's memory, and whether it runs asynchronously."""

    def device_memory(self) -> dict[str, Any]: ...

    def async_device(self) -> bool: ...


def iter_one(batch):
    return iter([batch])


class _HostSnapshot:
    """The state of a JAX step put back after a failed attempt: a host copy, since Keras's steps donate it."""

    jax: Any  # the jax module, set by the runner
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
        *,
        device: Device,
    ):
        import jax
        import jax.numpy as jnp

        self.jax = jax
        self.jnp = jnp
        self.model = model
        self.original = original
        self.mode = mode
        self.full_snapshot_max_bytes = full_snapshot_max_bytes
        self.device = device
        self._acc = None
        self._micro_jit = jax.jit(self._micro, donate_argnums=(4,))
        self._apply_jit = jax.jit(self._apply, donate_argnums=(0, 1, 2))
        self._measure_jit = jax.jit(self._measure_fn)
        self._zeros_jit: Callable | None = None
        self._rehearse_jit: Callable | None = None
        self._step: Any = ki.jax_step_function(original)  # a jitted function (lower, trace)
        self.state_bytes = None
        self.routing = LossRouting(model)
        self._memory: dict[tuple, dict[str, int] | None] = {}  # (batch signature, split) -> memory analysis
        # (per-sample shapes, whole or split) -> [(micro-batch size, need)]: bounds for smaller batches
        self._needs: dict[tuple, list[tuple[int, int]]] = {}
        self.alone_memory: dict[tuple[int, int], dict[str, int]] = {}  # (n, k) -> the rehearsal's analysis

    # -- traced functions ------------------------------------------------------
    def _micro(self, tv, ntv, ov, mv, acc, data, w, totals):
        box: list[Any] = []  # the gradients train_step hands the optimizer
        scaled: list[int] = []
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
        jitted = self._rehearse_jit
        tv, ntv, ov, mv = (local_copies(p) for p in ki.jax_state_parts(state))
        acc = [self.jnp.zeros_like(a) for a in tv]
        rehearse_alone(self, batch, n, k, lambda part, w, totals: jitted(tv, ntv, ov, mv, acc, part, w, totals))

    def predict_alone(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        """(fits, bytes needed) of :meth:`rehearse`'s program on this process's first device, compiled, never run.

        XLA's memory analysis of the rehearsal (see :func:`analysed_memory`):
        in a job, a split predicted not to fit on this process is voted out of
        memory without compiling it for running or running it. (None, None)
        where the device has no memory limit or the analysis fails.
        """
        mem = self.device.device_memory()
        limit, in_use = mem.get("bytes_limit"), mem.get("bytes_in_use", 0)
        if not limit:
            return None, None
        if self._rehearse_jit is None:
            self._rehearse_jit = jit_alone(self._micro)
        jitted: Any = self._rehearse_jit
        tv, ntv, ov, mv = (abstract_arrays(local_copies(p)) for p in ki.jax_state_parts(state))
        accumulator = sum(nbytes(a) for a in tv)  # made by the rehearsal, next to the state
        try:
            lowered = alone(
                self, batch, n, k, lambda part, w, totals: jitted.lower(tv, ntv, ov, mv, tv, part, w, totals)
            )
            host = sum(nbytes(x) for x in leaves(batch) if not hasattr(x, "is_deleted"))

            def need(m: dict[str, int]) -> int:
                return m["temporaries"] + m["outputs"] - m["aliased"] + accumulator + host

            found = analysed_memory(lowered, self.device.async_device(), settled=self._settled(need))
        except Exception as e:
            logger.debug("keras_gpu_tools: memory analysis of the rehearsal failed: %s", e)
            return None, None
        if found is None:
            return None, None
        found["need"] = need(found)
        self.alone_memory[(n, k)] = found  # for the explanation of a split voted out on this prediction
        return in_use + found["need"] <= PREDICT_FRACTION * limit, found["need"]

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
            state = abstract_arrays(state)
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
            host = sum(nbytes(x) for x in leaves(batch) if not hasattr(x, "is_deleted"))  # copied in

            def need(m: dict[str, int]) -> int:
                return m["temporaries"] + m["outputs"] - m["aliased"] + extra + host

            found = analysed_memory(lowered, self.device.async_device(), settled=self._settled(need))
            if found is not None:
                found["need"] = need(found)
                self._needs.setdefault(_family(batch, k), []).append((-(-n // k), found["need"]))
        except Exception as e:
            logger.debug("keras_gpu_tools: memory analysis failed: %s", e)
            found = None
        self._memory[key] = found
        return found

    def _settled(self, need: Callable[[dict[str, int]], int]) -> Callable[[dict[str, int]], bool]:
        """For :func:`analysed_memory`: whether one compile's analysis already decides the prediction.

        Over the limit, it does not fit whatever a second compile says (the
        larger one counts); under it with its temporaries twice over, it fits
        even where the other GEMMs double them. Only in between is the step
        compiled a second time.
        """
        mem = self.device.device_memory()
        limit, in_use = mem.get("bytes_limit"), mem.get("bytes_in_use", 0)

        def settled(m: dict[str, int]) -> bool:
            if not limit:
                return False
            total = in_use + need(m)
            return total > PREDICT_FRACTION * limit or total + m["temporaries"] <= PREDICT_FRACTION * limit

        return settled

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        """(fits, bytes needed) from XLA's memory analysis, or (None, None) where the device has no limit."""
        mem = self.device.device_memory()
        limit = mem.get("bytes_limit")
        if not limit:
            return None, None
        in_use = mem.get("bytes_in_use", 0)
        sig = batch_signature(batch)
        micro = -(-n // k)
        # A micro-batch no larger than one analysed already, of the same per-sample shapes and program
        # (whole or split): it needs no more than that one (the last, smaller batch of an epoch, say).
        bounds = [need for m, need in self._needs.get(_family(batch, k), ()) if m >= micro]
        if bounds and in_use + min(bounds) <= PREDICT_FRACTION * limit:
            return True, min(bounds)
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


def _family(batch, k: int) -> tuple:
    """The per-sample shapes and dtypes of ``batch``, and whether it runs whole: batches whose needs compare."""
    return (k == 1, tuple((tuple(getattr(x, "shape", ())[1:]), str(getattr(x, "dtype", ""))) for x in leaves(batch)))


#: The share of the device's memory limit a step may be predicted to use (XLA's
#: analysis leaves out allocator fragmentation and the runtime's own buffers).
PREDICT_FRACTION = 0.95
#: Below this share, a split estimated from a smaller one's analysis runs without an analysis of its own.
ESTIMATE_FRACTION = 0.8


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
        self._rehearse_jit: Callable | None = None

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
        jitted = self._rehearse_jit
        local = tuple(local_copies(p) for p in state)
        rehearse_alone(self, batch, n, k, lambda part, w, totals: jitted(local, part, w, totals))


def _measure_losses(runner, tv, ntv, data):
    """Each compiled loss's denominator on ``data`` (traced: a forward pass in inference mode)."""
    import keras

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred, _ = runner.model.stateless_call(tv, ntv, x, **ki.training_kwargs(runner.model, False))
    out: list[tuple[int, Any]] = []
    with runner.routing.measuring(out):
        ki.compute_loss_of(runner.model, y, y_pred, sample_weight)
    return [runner.jnp.asarray(d, "float32") for d in measure_order(out)]
