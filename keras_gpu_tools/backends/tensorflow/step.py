"""The TensorFlow step: the step hook's caller, the device sync, and fetching batches in Python.

TensorFlow's train function is ``f(iterator)``: for a ``tf.data`` iterator it
runs a compiled multi-step loop that pulls batches inside the graph; for any
other iterable it calls the compiled per-batch ``one_step_on_data`` once per
element (``keras_internals.tf_run_batches``). A sampled step, and every step
of the OOM reducer, fetches its batches in Python and runs them the second way:
the same compiled step on the same batches, with the fetch timed and the
batch kept for a retry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.tensorflow.flops import GRAPH_SOURCE, op_flops, step_flops
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import leading_dim, leaves


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
        batches = fetch_batches(iterator, hook.steps_per_execution)
        if not batches:
            raise StopIteration
        fetched = clock()
        rec.fetch = max(0.0, fetched - rec.start - hook.fetch_overhead * len(batches))
        rec.steps = len(batches)
        n = leading_dim(batches[0])
        rec.samples = n * len(batches) if n is not None else None
        hook.check_signature(rec, batches[0])
        if hook.capture_args and rec.sampled and not rec.warmup:  # the batch's shapes, for step_flops
            rec.extra["step_args"] = batches[0]
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


def fetch_batches(iterator, n: int) -> list[Any]:
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


class TFStep(Backend):
    """The step hook's side of the TensorFlow backend (see :class:`~keras_gpu_tools.backends.protocols.StepBackend`)."""

    traced_flops = True

    def shape_specs(self, args):
        """The batch's ``tf.TensorSpec`` structure (None where a leaf is not a dense tensor or array)."""
        tf = deps.loaded("tensorflow")
        if tf is None:
            return None
        try:
            return tf.nest.map_structure(
                lambda a: None if a is None else tf.TensorSpec(tuple(a.shape), tf.as_dtype(a.dtype)), args
            )
        except Exception:
            return None

    def step_flops(self, train_function: Callable, specs) -> tuple[float | None, str]:
        """FLOPs of Keras's per-batch step on a batch of ``specs``: XLA's HLO when jit-compiled, else the graph's."""
        function = ki.tf_step_function(train_function)
        if specs is None:
            return None, ""
        if function is None:
            raise ValueError("the step runs eagerly (run_eagerly=True): there is no traced step to count")
        return step_flops(function, specs)

    def layer_flops(self, train_function: Callable, specs) -> tuple[list[tuple[str, float]] | None, str]:
        """The matmul, einsum and convolution ops of the step's traced graph, by op name (the layers' scopes)."""
        function = ki.tf_step_function(train_function)
        if specs is None:
            return None, "no step's batch was seen in the window"
        if function is None:
            return None, "the step runs eagerly (run_eagerly=True): there is no traced step to count"
        return op_flops(function, specs), GRAPH_SOURCE

    def uses_tf32(self) -> bool:
        tf = deps.loaded("tensorflow")
        return bool(tf is not None and tf.config.experimental.is_tensor_float_32_execution_enabled())

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
