"""Timing one all-reduce over a ``tf.distribute`` strategy's replicas, as its gradient all-reduce runs."""

from __future__ import annotations

import time
import weakref

from keras_gpu_tools.runtime.units import format_bytes

RUNS = 5  # timed runs after the tracing one; their median is the figure

_timed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # strategy -> {bytes: seconds}


def time_allreduce(strategy, nbytes: int) -> tuple[float | None, str]:
    """Seconds of one all-reduce of ``nbytes`` (float32) over ``strategy``'s replicas.

    Each replica sums its own tensor through the replica context's
    ``all_reduce``, the path of the gradients in ``optimizer.apply`` under
    the strategy (NCCL between GPUs where the strategy uses it).
    """
    n = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    if n < 2:
        return None, "one device runs the step: no all-reduce"
    k = max(int(nbytes) // 4, 1)
    try:
        timed = _timed.setdefault(strategy, {})
    except TypeError:  # a strategy without weak references: measured each time
        timed = {}
    if k not in timed:
        timed[k] = _measure(strategy, k)
    return timed[k], f"one all-reduce of {format_bytes(4 * k)} over {n} replicas, timed alone"


def _measure(strategy, k: int) -> float:
    import tensorflow as tf

    with strategy.scope():
        x = tf.Variable(tf.ones([k]), trainable=False)  # one copy per replica, as the gradients

    @tf.function
    def reduce():
        def one():
            # One element back: the host waits for the sum, not for a copy of it.
            return tf.distribute.get_replica_context().all_reduce("sum", x.read_value())[:1]

        return strategy.run(one)

    def run():
        out = reduce()
        for v in strategy.experimental_local_results(out):
            v.numpy()  # every replica's sum

    run()  # traces
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
