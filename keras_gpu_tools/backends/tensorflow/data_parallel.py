"""A batch over ``tf.distribute.MirroredStrategy``'s replicas: each replica's share split where it lies.

Under a strategy of several replicas the batches are per-replica values; the
OOM reducer splits every replica's share and runs micro-batch ``i`` as every
replica's ``i``-th slice, so that no sample moves to another device.
"""

from __future__ import annotations

from typing import Any

from keras_gpu_tools.memory.accumulate import slice_batch
from keras_gpu_tools.memory.split import split_sizes
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime.batches import ReplicaBatch, leading_dim


def replica_parts(batch: ReplicaBatch, k: int) -> list[list[tuple[Any, float]]]:
    """``[micro][replica] -> (part, share)``: every replica's share split in ``k``, micro-batch ``i`` their ``i``-th slices.

    Each micro-batch is spread over the replicas as the batch was and no sample
    moves to another device; a replica's share of its own rows weights its loss
    (Keras's step averages each replica's loss over its own rows).
    """
    sizes = [leading_dim(p) or 0 for p in batch.parts]
    bounds = []
    for size in sizes:
        cuts = [0]
        for m in split_sizes(size, min(k, size)) if size else []:
            cuts.append(cuts[-1] + m)
        cuts += [cuts[-1]] * (k + 1 - len(cuts))
        bounds.append(cuts)
    return [
        [
            (slice_batch(p, b[i], b[i + 1]), (b[i + 1] - b[i]) / max(1, size))
            for p, b, size in zip(batch.parts, bounds, sizes)
        ]
        for i in range(k)
    ]


def distribute(strategy, values: list):
    """Per-replica values (``values[r]`` on replica ``r``) as the strategy's distributed value."""
    return strategy.experimental_distribute_values_from_function(lambda ctx: values[ctx.replica_id_in_sync_group])


def replica_totals(runner, per_replica):
    """Each replica's denominators of its share (what its loss averages over), where a loss needs them."""
    tf = runner.tf
    if not runner.routing.needs_totals():
        return None
    first = runner._measure(per_replica[0][0][0])
    runner.routing.measured = True
    if not runner.routing.needs_totals():
        return None
    rows = []
    for r in range(len(per_replica[0])):
        measured = [first] if r == 0 else [runner._measure(per_replica[0][r][0])]
        measured += [runner._measure(micro[r][0]) for micro in per_replica[1:]]
        rows.append(tf.constant(runner.routing.totals(measured), tf.float32))
    return distribute(runner.model.distribute_strategy, rows)


def mean_over_replicas(strategy, logs):
    """A step's per-replica logs as Keras's own step returns them (``reduce_per_replica``'s "auto": the mean)."""
    tf = deps.loaded("tensorflow")
    return tf.nest.map_structure(lambda v: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None), logs)


def replica_batch(batch, replicas: int) -> ReplicaBatch:
    """A batch of per-replica values as a :class:`ReplicaBatch`: replica ``r``'s share of each leaf."""
    tf = deps.loaded("tensorflow")

    def share(r):
        return tf.nest.map_structure(lambda v: v.values[r] if hasattr(v, "values") else v, batch)

    return ReplicaBatch(batch, [share(r) for r in range(replicas)])
