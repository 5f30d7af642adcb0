"""Planning the batch size on JAX (``plan_batch_size``): XLA's memory analysis of the compiled step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.jax.memory import abstract_arrays, analysed_memory, local_gpus
from keras_gpu_tools.runtime import keras_internals as ki


class JaxPlanner(Backend):
    """The planner's side of the JAX backend."""

    #: XLA's memory analysis needs the batch's shapes and dtypes only: no host batch of a trial's size is built.
    plans_on_shapes = True
    async_device: Callable[[], bool]  # JaxStep's

    def device_capacities(self, model, replicas: int) -> list[int | None]:
        out = []
        for dev in local_gpus()[:replicas]:
            limit = (dev.memory_stats() or {}).get("bytes_limit")
            out.append(int(limit) if limit else None)
        return out + [None] * (replicas - len(out))

    def _lowered(self, model, batch, flops: bool = False):
        """Keras's jitted train step, and its abstract arguments (state and batch) for ``batch``'s shapes."""
        import jax

        model.make_train_function()
        step: Any = ki.jax_step_function(model.train_function)  # a jitted function (lower)
        if step is None:
            raise ValueError(
                "plan_batch_size: the JAX train step is not jitted (run_eagerly=True or jit_compile=False); "
                "XLA's memory analysis needs the compiled step."
            )
        _, dist = ki.jax_data_parallel()

        def spec(a):
            if a is None:
                return None
            dtype = jax.dtypes.canonicalize_dtype(a.dtype)  # int64 is int32 without x64, as JAX converts arrays
            sharding = None if flops else ki.jax_batch_sharding(dist, tuple(a.shape))
            return jax.ShapeDtypeStruct(a.shape, dtype, sharding=sharding)

        x, y = batch
        data = jax.tree_util.tree_map(spec, (x, y) if y is not None else (x,))
        return step, abstract_arrays(ki.jax_state_of(model)), data

    def plan_step_flops(self, model, batch, replicas: int) -> float | None:
        """The FLOPs of one global step on ``batch``'s shapes (as the detector counts them), or None."""
        import jax

        _, state, data = self._lowered(model, batch, flops=True)
        # Lowered for the CPU (see step_flops): shapes and dtypes only, no device's sharding.
        state = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
        flops, _ = self.step_flops(model.train_function, (state, data))
        return flops

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """XLA's memory analysis of Keras's compiled train step on ``batch``'s shapes; compiled, not run.

        ``batch`` holds arrays or :class:`~keras_gpu_tools.memory.search.ArraySpec` stand-ins: only each
        leaf's ``shape`` and ``dtype`` are read.
        """
        step, state, data = self._lowered(model, batch)
        memory = analysed_memory(step.lower(state, data), self.async_device())
        if memory is None:
            raise ValueError("plan_batch_size: XLA returned no memory analysis for the train step.")
        peak = memory["arguments"] + memory["temporaries"] + memory["outputs"] - memory["aliased"]
        return [float(peak)] * replicas, self.plan_method(model)

    def repeated_batch(self, batch):
        """A generator of the batch placed on the device once: Keras's JAX feed ``jax.device_put``s every
        batch, which for an array already there costs nothing, so no step pays a host-to-device copy. None
        under a ``keras.distribution``, whose feed lays each batch out over its devices itself."""
        import jax
        import keras

        if keras.distribution.distribution() is not None:
            return None
        x, y = batch
        placed = jax.device_put((x, y) if y is not None else (x,))

        def repeat():
            while True:
                yield placed

        return repeat()

    def plan_method(self, model) -> str:
        return (
            "XLA's memory analysis of the compiled train step, per device (arguments + temporaries + outputs, "
            "less the outputs that reuse donated arguments); compiled, never run"
        )
