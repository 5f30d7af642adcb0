"""The JAX job: this process, its devices, data parallelism, and what ``doctor`` reports of them."""

from __future__ import annotations

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.jax.memory import local_gpus
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.topology import Topology


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


class JaxTopology(Backend):
    """Processes and devices of the JAX backend."""

    def gpu_devices(self) -> list[str]:
        return [str(d) for d in local_gpus()]

    def topology(self, model) -> Topology:
        from keras_gpu_tools.runtime import topology
        from keras_gpu_tools.runtime.kv_exchange import KVExchange

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
        gpus = local_gpus()
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
            exchange=KVExchange(client, index, count) if client is not None else None,
        )

    def distribution_notes(self, topology: Topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
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

    def replicas(self, model) -> int:
        return ki.jax_data_parallel()[0]

    def time_allreduce(self, model, nbytes: int) -> tuple[float | None, str]:
        from keras_gpu_tools.backends.jax.collective import time_allreduce

        return time_allreduce(nbytes)
