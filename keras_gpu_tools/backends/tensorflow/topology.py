"""The TensorFlow job: its devices, ``tf.distribute`` replicas, and what ``doctor`` reports of them."""

from __future__ import annotations

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime.topology import Topology


class TFTopology(Backend):
    """Processes and devices of the TensorFlow backend."""

    def gpu_devices(self) -> list[str]:
        tf = deps.loaded("tensorflow")
        if tf is None:
            return []
        return [d.name for d in tf.config.list_logical_devices("GPU")]

    def framework_facts(self, facts) -> None:
        import tensorflow as tf

        facts.version = tf.__version__
        facts.gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
        facts.built_with_cuda = bool(tf.test.is_built_with_cuda())
        info = dict(tf.sysconfig.get_build_info())
        facts.cuda_version = info.get("cuda_version")
        facts.cudnn_version = info.get("cudnn_version")

    def replicas(self, model) -> int:
        return int(getattr(getattr(model, "distribute_strategy", None), "num_replicas_in_sync", 1) or 1)

    def time_allreduce(self, model, nbytes: int) -> tuple[float | None, str]:
        from keras_gpu_tools.backends.tensorflow.collective import time_allreduce

        return time_allreduce(getattr(model, "distribute_strategy", None), nbytes)

    def topology(self, model) -> Topology:
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

    def distribution_notes(self, topology: Topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
        # keras-team/keras#20585: "unsupported type PerReplica to a Tensor" inside fit(), with no callback.
        from keras_gpu_tools.runtime import topology as topo

        multi_worker = "TF_CONFIG" in env or "MultiWorker" in topology.engine
        # The note is for a user who could reach for several workers: several GPUs, several devices
        # in the step, or several processes. On one device with no cluster set up it has nothing to say.
        several = (
            gpus > 1 or topology.devices_in_step > 1 or topology.multi_process or topo.from_launcher(env) is not None
        )
        notes = []
        if multi_worker or several:
            notes.append(
                (
                    "warn" if multi_worker else "info",
                    ("TF_CONFIG is set: " if "TF_CONFIG" in env else "")
                    + "tf.distribute.MultiWorkerMirroredStrategy does not train with Keras 3's fit() "
                    "(keras-team/keras#20585). Several hosts with Keras 3 means the JAX backend: "
                    "keras.distribution.initialize() in every process, then keras.distribution.DataParallel. "
                    "MirroredStrategy over one host's GPUs works.",
                )
            )
        if gpus > 1 and topology.devices_in_step < 2:
            notes.append(
                (
                    "info",
                    f"{gpus} GPUs are visible and fit() runs on one: create and compile the model under "
                    "tf.distribute.MirroredStrategy().scope() to use them all.",
                )
            )
        return notes
