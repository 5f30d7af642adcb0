"""Planning the batch size on TensorFlow (``plan_batch_size``): trial steps and the allocator's peak."""

from __future__ import annotations

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.tensorflow.memory import gpu_total_bytes
from keras_gpu_tools.runtime import deps


class TFPlanner(Backend):
    """The planner's side of the TensorFlow backend."""

    def _plan_devices(self, replicas: int) -> list[str]:
        tf = deps.loaded("tensorflow")
        gpus = tf.config.list_logical_devices("GPU") if tf is not None else []
        return [f"GPU:{i}" for i in range(min(replicas, len(gpus)))] if gpus else ["CPU:0"]

    def device_capacities(self, model, replicas: int) -> list[int | None]:
        _refuse_strategy(model)
        devices = self._plan_devices(replicas)
        if devices == ["CPU:0"]:
            return [None] * replicas
        return [gpu_total_bytes(int(d.split(":")[1])) for d in devices]

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


def _refuse_strategy(model) -> None:
    """Refuses a model under a ``tf.distribute`` strategy, before anything is built or trained.

    The trial steps and the snapshot that puts the model back would meet the
    strategy's per-replica variables (a metric's ``SyncOnReadVariable`` has no
    single host value), and a failure halfway would leave the optimizer
    half-built for the next ``fit()``.
    """
    tf = deps.loaded("tensorflow")
    if tf is None:
        return
    strategy = getattr(model, "distribute_strategy", None)
    if not tf.distribute.has_strategy() and (
        strategy is None or type(strategy).__name__ == "_DefaultDistributionStrategy"
    ):
        return
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else strategy
    n = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    raise ValueError(
        f"plan_batch_size does not support a tf.distribute strategy (this model's: {type(strategy).__name__} over "
        f"{n} replicas). Plan the same model built and compiled outside any strategy scope, on one of the "
        "devices: its `per_device_batch_size` times the replicas is the global batch size to train with."
    )
