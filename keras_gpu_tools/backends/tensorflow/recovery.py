"""The train, test and predict functions the OOM reducer runs on TensorFlow.

Each fetches its batch(es) in Python, so that a batch survives an
out-of-memory error, and runs a batch of the idle signature on Keras's own
compiled step (:class:`~keras_gpu_tools.memory.idle.IdlePath`), any other
through the reducer's guarded path; the runners are in :mod:`.accumulate`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.tensorflow.accumulate import TFEvalRunner, TFRunner
from keras_gpu_tools.backends.tensorflow.data_parallel import replica_batch
from keras_gpu_tools.backends.tensorflow.step import end_of_data_errors, fetch_batches
from keras_gpu_tools.memory.accumulate import concat_outputs
from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.runners import EvalRunner, TrainRunner
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature


class TFRecovery(Backend):
    """The OOM reducer's side of the TensorFlow backend."""

    def reducer_problem(self, model) -> str | None:
        strategy = getattr(model, "distribute_strategy", None)
        n = getattr(strategy, "num_replicas_in_sync", 1)
        if n and n > 1 and type(strategy).__name__ != "MirroredStrategy":
            # MirroredStrategy is the one that trains under Keras 3 with several replicas in one
            # process; the others (TPUStrategy, parameter servers) are not tried.
            return (
                f"OOMBatchSizeReducer supports tf.distribute.MirroredStrategy, not {type(strategy).__name__} "
                f"with {n} replicas; use MirroredStrategy, train on one device or remove the callback."
            )
        return None

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs) -> TrainRunner:
        return TFRunner(model, original, mode, **kwargs)

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate") -> EvalRunner:
        return TFEvalRunner(model, kind, original, mode)

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        if kind == "predict":

            def predict_function(batches):  # already fetched by predict()
                if replicas > 1:  # per-replica values: each replica's share split, as in a test step
                    batches = [replica_batch(batch, replicas) for batch in batches]
                return concat_outputs([one(batch) for batch in batches])

            return predict_function

        def test_function(iterator):
            # Fetched in Python, like the training step, so that a batch survives an OOM.
            batches = fetch_batches(iterator, steps_per_execution)
            if not batches:
                raise StopIteration
            out = None
            for batch in batches:
                out = one(replica_batch(batch, replicas) if replicas > 1 else batch)
            return out

        return test_function

    def reducer_call(
        self, one: Callable, idle: IdlePath, runner: TrainRunner, steps_per_execution: int, replicas: int = 1
    ) -> Callable:
        run_idle = idle.run

        def whole(batch):  # Keras's own step on a fetched batch
            return runner.run(batch, 0, 1)

        made: list[Any] = [None, whole]  # the idle signature, and the step made for it (Keras's compiled one)

        def idle_step(batch):
            # Keras's compiled step, resolved once for this signature; where that fails (or
            # the batch is per-replica values), Keras's own path runs it.
            if replicas > 1:
                return whole
            try:
                return ki.tf_batch_step(runner.original, batch) or whole
            except Exception:
                return whole

        def step(batch):
            if batch_signature(batch) == idle.signature:  # the idle path (IdlePath)
                if made[0] is not idle.signature:
                    made[:] = idle.signature, idle_step(batch)
                return run_idle(made[1], batch)
            return one(batch)

        if replicas > 1:

            def replica_train_function(iterator):
                # Each batch is per-replica values: kept as they are for Keras's own step, and
                # seen as each replica's share for splitting.
                batches = fetch_batches(iterator, steps_per_execution)
                if not batches:
                    raise StopIteration
                out = None
                for batch in batches:
                    out = step(replica_batch(batch, replicas))
                return out

            return replica_train_function

        if steps_per_execution == 1:
            end = end_of_data_errors()

            def train_function_1(iterator):
                # The idle path of every step: one fetch, one call (see train_function).
                try:
                    batch = next(iterator)
                except end:
                    raise StopIteration from None
                return step(batch)

            return train_function_1

        def train_function(iterator):
            # Fetched in Python so that a batch survives an out-of-memory error
            # (one pulled inside the compiled loop is gone with it).
            batches = fetch_batches(iterator, steps_per_execution)
            if not batches:
                raise StopIteration
            out = None
            for batch in batches:
                out = step(batch)
            return out

        return train_function
