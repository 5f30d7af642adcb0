"""Timing one all-reduce over the step's devices, as the gradient all-reduce of a data-parallel step runs."""

from __future__ import annotations

import time

from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime.units import format_bytes

RUNS = 5  # timed runs after the compiling one; their median is the figure

_timed: dict[tuple, float] = {}  # (device ids, bytes) -> seconds: measured once per process


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def time_allreduce(nbytes: int) -> tuple[float | None, str]:
    """Seconds of one all-reduce of ``nbytes`` (float32) over the devices of ``keras.distribution``'s mesh.

    Each device holds its own ``nbytes`` and gets the sum, as each holds its
    gradients in a data-parallel step; XLA picks the collective as it does
    for the step. None with the reason where it cannot be timed alone: one
    device, a mesh that shards the weights too, or devices in other processes
    (a collective outside the step needs every process to run it at the same
    moment; one that does not would hang the job).
    """
    jax = deps.loaded("jax")
    if jax is None:
        return None, "JAX is not loaded"
    import keras

    dist = keras.distribution.distribution()
    mesh = getattr(dist, "device_mesh", None)
    if mesh is None:
        return None, "one device runs the step: no all-reduce"
    devices = list(mesh.backend_mesh.devices.flat)  # the JAX devices (``mesh.devices`` holds their names)
    if len(devices) < 2:
        return None, "one device runs the step: no all-reduce"
    if len(mesh.shape) != 1:
        return (
            None,
            f"the mesh {dict(zip(mesh.axis_names, mesh.shape))} shards more than the batch: the all-reduce is not the weights'",
        )
    if any(d.process_index != jax.process_index() for d in devices):
        return None, (
            "the step's devices are in several processes: an all-reduce timed outside the step needs every "
            "process to run it at the same moment, and one process without this callback would hang the job"
        )
    n, k = len(devices), max(int(nbytes) // 4, 1)
    key = (tuple(d.id for d in devices), k)
    if key not in _timed:
        _timed[key] = _measure(jax, devices, n, k)
    return _timed[key], f"one all-reduce of {format_bytes(4 * k)} over {n} devices, timed alone"


def _measure(jax, devices, n: int, k: int) -> float:
    import numpy as np
    from jax import numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("d",))
    rows = NamedSharding(mesh, PartitionSpec("d", None))
    # Made on the devices (no host copy of n * k floats): one row, the "gradients", per device.
    x = jax.jit(lambda: jnp.ones((n, k), jnp.float32), out_shardings=rows)()
    total = jax.jit(lambda a: a.sum(0), out_shardings=NamedSharding(mesh, PartitionSpec()))
    total(x).block_until_ready()  # compiles
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        total(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    del x
    return _median(times)
