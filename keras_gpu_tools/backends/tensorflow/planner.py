"""Planning the batch size on TensorFlow (``plan_batch_size``): trial steps and the allocator's peak.

Under ``tf.distribute.MirroredStrategy`` (one process, several devices) the
plan is per replica: every trial step is a real ``fit()`` step of the global
batch, which the strategy splits over the replicas, so each device's peak is
its replica's; the variables are copied and put back per replica (a metric's
``SyncOnReadVariable`` holds a different value on each).
"""

from __future__ import annotations

import contextlib
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.tensorflow.flops import step_flops
from keras_gpu_tools.backends.tensorflow.memory import gpu_total_bytes
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import leading_dim

PLANNED_STRATEGIES = ("MirroredStrategy", "OneDeviceStrategy")  # one process; fit() splits each batch over replicas


class TFPlanner(Backend):
    """The planner's side of the TensorFlow backend."""

    def _plan_devices(self, model, replicas: int) -> list[str]:
        """The devices whose peaks are read: the strategy's (``GPU:<i>``, ``CPU:<i>``), else the first GPUs."""
        strategy = _strategy(model)
        if strategy is not None:
            return [_short_name(d) for d in strategy.extended.worker_devices]
        tf = deps.loaded("tensorflow")
        gpus = tf.config.list_logical_devices("GPU") if tf is not None else []
        return [f"GPU:{i}" for i in range(min(replicas, len(gpus)))] if gpus else ["CPU:0"]

    def device_capacities(self, model, replicas: int) -> list[int | None]:
        if _strategy_problem(model) is not None:  # refused by plan_problem: no device of it is read
            return [None] * replicas
        devices = self._plan_devices(model, replicas)
        if any(d.startswith("CPU") for d in devices):
            return [None] * replicas
        return [gpu_total_bytes(int(d.split(":")[1])) for d in devices]

    def plan_snapshot(self, model, batch) -> Any:
        """As the base, the model built inside its strategy's scope (as ``fit()`` builds it)."""
        with _scope(model):
            return super().plan_snapshot(model, batch)

    def host_value(self, variable) -> Any:
        """The variable's value, or under a strategy each replica's (a tuple): put back replica by replica."""
        tf = deps.loaded("tensorflow")
        value = variable.value
        if tf is not None and isinstance(value, tf.distribute.DistributedValues):
            return tuple(component.numpy() for component in value.values)
        return super().host_value(variable)

    def assign_host_value(self, variable, value) -> None:
        if isinstance(value, tuple):
            for component, v in zip(variable.value.values, value):
                component.assign(v)
        else:
            super().assign_host_value(variable, value)

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """One trial step to trace and compile, then one measured: the allocator's peak per device."""
        tf = deps.loaded("tensorflow")
        devices = self._plan_devices(model, replicas)
        x, y = batch
        step = _fit_step if _strategy(model) is not None else _batch_step
        step(model, x, y)
        try:
            for d in devices:
                tf.config.experimental.reset_memory_stats(d)
        except ValueError:  # "Cannot reset memory stats for device 'CPU:0'": an allocator without statistics
            peaks = []
        else:
            step(model, x, y)
            peaks = [float(tf.config.experimental.get_memory_info(d)["peak"]) for d in devices]
        if not any(peaks):
            raise ValueError(
                "plan_batch_size: this TensorFlow CPU allocator keeps no memory statistics (with "
                "TF_ENABLE_ONEDNN_OPTS=0, say). Set TF_CPU_ALLOCATOR_USE_BFC=true in the environment before "
                "TensorFlow is imported, or plan on a GPU."
            )
        return peaks, self.plan_method(model)

    def plan_step_flops(self, model, batch, replicas: int) -> float | None:
        """The FLOPs of one step on ``batch`` (shapes and dtypes suffice), counted as ``step_flops`` does.

        Under a strategy each replica's share is traced: the step's graph holds
        one copy of the model's work per replica, so the count is the global
        batch's.
        """
        tf = deps.loaded("tensorflow")
        function = ki.tf_step_function(model.make_train_function())
        if tf is None or function is None:
            return None
        share = max(int(replicas), 1) if _strategy(model) is not None else 1

        def spec(a):
            shape = tuple(int(d) for d in a.shape)
            return tf.TensorSpec((shape[0] // share, *shape[1:]), tf.as_dtype(a.dtype))

        specs = tuple(None if a is None else tf.nest.map_structure(spec, a) for a in batch)
        if specs[-1] is None:
            specs = specs[:-1]
        with _scope(model):
            flops, _ = step_flops(function, specs)
        return flops

    def plan_problem(self, model, replicas: int, memory_search: bool) -> str | None:
        """A strategy a plan cannot be exact for (see :func:`_strategy_problem`), before anything is built."""
        problem = _strategy_problem(model)
        if problem is not None or not memory_search:
            return problem
        strategy, devices = _strategy(model), self._plan_devices(model, replicas)
        if strategy is not None and len(devices) > 1 and any(d.startswith("CPU") for d in devices):
            return (
                f"plan_batch_size: the {len(devices)} replicas of this {type(strategy).__name__} are CPU devices, "
                "which share one allocator: its peak is every replica's together, not one replica's, so no "
                "per-replica memory can be planned. Plan the memory on GPUs, or plan objective='throughput' with "
                "max_batch_size= (or global_batch_size=) and no memory_limit_mib."
            )
        return None

    def repeated_batch(self, batch):
        """A ``tf.data`` dataset: Keras would feed a Python generator through a ``py_function`` on every step,
        which on a short step costs as much as the step."""
        import tensorflow as tf

        x, y = batch
        return tf.data.Dataset.from_tensors((x, y) if y is not None else (x,)).repeat()

    def plan_method(self, model) -> str:
        strategy = _strategy(model)
        how = (
            f"fit() steps of the global batch, which {type(strategy).__name__} splits over its replicas"
            if strategy is not None
            else "steps"
        )
        return (
            f"trial {how} (one to trace and compile, one measured): tf.config.experimental.get_memory_info's "
            "peak per device"
        )


def _batch_step(model, x, y) -> None:
    model.train_on_batch(x, y)


def _fit_step(model, x, y) -> None:
    # train_on_batch would hand every replica the whole batch (strategy.run of plain tensors): a fit of one
    # step distributes it as training does, each replica its share.
    model.fit(x, y, batch_size=leading_dim(x), epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)


def _strategy(model) -> Any:
    """The model's ``tf.distribute`` strategy, or the one in scope; None for the default (no strategy)."""
    tf = deps.loaded("tensorflow")
    if tf is None:
        return None
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    if strategy is None:
        strategy = getattr(model, "distribute_strategy", None)  # the one the model was built under
    if strategy is None or type(strategy).__name__ == "_DefaultDistributionStrategy":
        return None
    return strategy


def _scope(model) -> Any:
    strategy = _strategy(model)
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def _short_name(device: str) -> str:
    """``/job:localhost/replica:0/task:0/device:GPU:1`` -> ``GPU:1`` (what the memory statistics take)."""
    kind, _, index = device.rsplit("device:", 1)[-1].partition(":")
    return f"{kind.upper()}:{index or 0}"


def _strategy_problem(model) -> str | None:
    """Why a plan cannot be exact under the model's strategy (None: no strategy, or one it plans under).

    ``MirroredStrategy`` and ``OneDeviceStrategy`` are planned (one process,
    ``fit()`` splits each batch over the replicas). A multi-worker strategy
    spreads the replicas over processes that ``plan_batch_size`` cannot time
    together (and whose ``fit()`` Keras 3 does not support); a TPU or
    parameter-server strategy is not one batch split over devices alike.
    """
    strategy = _strategy(model)
    if strategy is None or type(strategy).__name__ in PLANNED_STRATEGIES:
        return None
    n = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    return (
        f"plan_batch_size does not support this tf.distribute strategy ({type(strategy).__name__} over {n} "
        f"replicas): it plans under {' or '.join(PLANNED_STRATEGIES)}, whose replicas are one process's devices "
        "and each train an equal share of every batch. Plan the same model under MirroredStrategy over one "
        "host's devices (or outside any strategy, on one device): its `per_device_batch_size` times the "
        "replicas is the global batch size to train with."
    )
