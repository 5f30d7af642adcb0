"""The JAX step: the step hook's callers, the device sync, and the step's FLOPs.

JAX's train function is ``logs, state = f(state, iterator)``; it calls
``next(iterator)`` in Python, so the step hook wraps the iterator to time every
fetch. On a GPU the device runs asynchronously to the host, so a sampled step
waits on its outputs before its end is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import leading_dim, leaves
from keras_gpu_tools.telemetry import peaks as gpu_peaks

#: Where the layer table's FLOPs per layer come from on JAX.
LAYER_SOURCE = "matmul/convolution FLOPs of the step's jaxpr, by the name stack of each op"


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


def _call_jax(backend: JaxStep, hook, state, iterator):
    jax = deps.loaded("jax")
    rec = hook.begin(lambda: _wait(jax, state))  # before the step donates it
    timer = hook.fetch_timer.reset(iterator)
    rec.start = hook.clock()

    def call():
        out = hook.inner(state, timer)
        rec.steps = max(timer.count, 1)  # the steps it ran, for an observer around it (steps_per_execution)
        return out

    out = hook.around(rec, call)
    returned = hook.clock()
    if rec.sampled and jax is not None:
        _wait(jax, out)
    rec.end = hook.clock()
    rec.fetch = timer.total
    rec.samples = timer.samples if timer.count else None
    if rec.sampled:
        if backend.async_device():
            # On a GPU the step's single executable is launched when the
            # call returns; the Python before it (argument handling) is
            # host time that overlaps the previous step in a pipeline.
            rec.compute = rec.end - returned
            rec.dispatch = max(0.0, returned - rec.start - timer.total)
        else:
            rec.compute = rec.end - rec.start - timer.total
        hook.check_signature(rec, timer.last)
        if hook.capture_args and not rec.warmup:  # shapes for an observer's cost analysis
            rec.extra["step_args"] = (state, timer.last)
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
    every leaf costs a round trip per array, milliseconds per sync for a
    model's whole state.
    """
    if jax is None:
        return
    leaf = next(leaves(tree), None)
    if leaf is not None:
        jax.block_until_ready(leaf)


def _flops_of(cost) -> float | None:
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    try:
        flops = float((cost or {}).get("flops", 0.0))
    except (TypeError, ValueError, AttributeError):
        return None
    return flops if flops > 0 else None


class JaxStep(Backend):
    """The step hook's side of the JAX backend (see :class:`~keras_gpu_tools.backends.protocols.StepBackend`)."""

    _async: bool | None = None  # whether the default device is asynchronous; asked once

    def uses_tf32(self) -> bool:
        jax = deps.loaded("jax")
        return jax is not None and jax.config.jax_default_matmul_precision in (None, "default", "tensorfloat32")

    def async_device(self) -> bool:
        """Whether the default device runs asynchronously to the host (a GPU, not the CPU)."""
        if self._async is None:
            jax = deps.loaded("jax")
            try:
                self._async = jax is not None and jax.default_backend() != "cpu"
            except Exception:
                self._async = False
        return self._async

    def sync(self, outputs) -> None:
        jax = deps.loaded("jax")
        if outputs is not None and jax is not None:
            _wait(jax, outputs)

    def step_caller(self, hook) -> Callable:
        hook.fetch_timer = _FetchTimer(hook.clock)
        return lambda state, iterator: _call_jax(self, hook, state, iterator)

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
        step: Any = ki.jax_step_function(train_function)  # a jitted function (lower, trace)
        if step is None or specs is None:
            return None, ""
        # XLA's HLO cost analysis of the un-optimised step, lowered for the CPU
        # platform (a GPU-compiled program hides its matmuls in cuBLAS custom
        # calls, which count 0). It counts a loop's body once: where the
        # matmuls and convolutions of the step's jaxpr, each scan's body times
        # its length, come to more (a Keras RNN), they are the count; they are
        # also the count where this JAX has no lowered cost analysis.
        import jax

        try:
            traced = step.trace(*specs)
            jaxpr = traced.jaxpr
        except Exception:
            traced, jaxpr = None, jax.make_jaxpr(step)(*specs)
        try:
            flops = _flops_of(traced.lower(lowering_platforms=("cpu",)).cost_analysis()) if traced else None
        except Exception:
            flops = None
        matmuls = gpu_peaks.jaxpr_flops(jaxpr) or None
        if flops and (matmuls is None or flops >= matmuls):
            return flops, "XLA cost analysis"
        if flops:
            return (
                matmuls,
                "matmul/convolution FLOPs of the step's jaxpr, scans times their length (XLA's cost analysis counts a loop's body once)",
            )
        return matmuls, "matmul/convolution FLOPs of the step's jaxpr"

    def layer_flops(self, train_function: Callable, specs) -> tuple[list[tuple[str, float]] | None, str]:
        """The matmuls and convolutions of the step's jaxpr, each with its name stack (the Keras layer scopes)."""
        step: Any = ki.jax_step_function(train_function)
        if step is None or specs is None:
            return None, "no step's arguments were seen in the window"
        import jax

        try:
            jaxpr = step.trace(*specs).jaxpr
        except Exception:
            jaxpr = jax.make_jaxpr(step)(*specs)
        return gpu_peaks.jaxpr_op_flops(jaxpr), LAYER_SOURCE
