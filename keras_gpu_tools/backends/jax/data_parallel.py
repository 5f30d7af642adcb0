"""A batch laid out over several devices and processes: split where it lies, and rehearsed alone.

Under ``keras.distribution.DataParallel`` (one process or a job of several), a
batch is one array spread over the devices. The OOM reducer splits each
device's rows in place (:func:`device_micro_batches`) and, in a job, tries a
split on one process's device alone first (:func:`rehearse_alone`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.memory.accumulate import micro_batches
from keras_gpu_tools.memory.split import split_sizes
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import leaves


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


def local_copies(arrays) -> list:
    # This process's first copy: `addressable_data`, since some of Keras's replicated state arrays
    # of a job (the optimizer's and metrics' scalars) have no readable `addressable_shards`.
    return [a.addressable_data(0) if hasattr(a, "addressable_data") else a for a in arrays]


def jit_alone(fn: Callable) -> Callable:
    """``jax.jit`` for a program that this process compiles alone, in a job of several.

    On GPUs XLA shares the autotuning of each compilation between the job's
    processes (``xla_gpu_shard_autotuning``): a program that one process
    compiles alone would wait for the others' share and never finish compiling.
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

    out = alone(runner, batch, n, k, step)
    jax.block_until_ready(out)
    del out


def alone(runner, batch, n: int, k: int, step: Callable) -> Any:
    """``step(part, w, totals)`` on this process's rows of the first micro-batch, outside the Keras distribution.

    What :func:`rehearse_alone` runs, and what the runner lowers (never runs)
    to predict the rehearsal's memory: the same program either way.
    """
    import jax
    import keras
    import numpy as np

    part, w = device_micro_batches(batch, n, k)[0]
    part = jax.tree_util.tree_map(lambda a: local_copies([a])[0], part)
    totals = np.ones((max(1, len(ki.flat_losses(runner.model) or [])),), "float32")
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    runner.routing.lenient = True  # the totals' values do not matter: the outputs are dropped
    try:
        return step(part, np.float32(w), totals)
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
