"""The train, test and predict functions the OOM reducer runs on torch.

fit() hands each call its batches already fetched; a batch of the idle
signature runs on Keras's own step (:class:`~keras_gpu_tools.memory.idle.IdlePath`),
any other through the reducer's guarded path; the runners are in :mod:`.accumulate`.
"""

from __future__ import annotations

from collections.abc import Callable

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.torch.accumulate import TorchEvalRunner, TorchRunner
from keras_gpu_tools.memory.accumulate import concat_outputs
from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.runners import EvalRunner, TrainRunner
from keras_gpu_tools.runtime.batches import batch_signature, shape_and_dtype


class TorchRecovery(Backend):
    """The OOM reducer's side of the torch backend."""

    def reducer_problem(self, model) -> str | None:
        return None

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs) -> TrainRunner:
        return TorchRunner(model, original, mode, **kwargs)

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate") -> EvalRunner:
        return TorchEvalRunner(model, kind, original, mode)

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        if kind == "predict":

            def predict_function(data):
                return concat_outputs([one(batch) for batch in data])

            return predict_function

        def test_function(data):
            logs = None
            for batch in data:
                logs = one(batch)
            return logs

        return test_function

    def reducer_call(
        self, one: Callable, idle: IdlePath, runner: TrainRunner, steps_per_execution: int, replicas: int = 1
    ) -> Callable:
        original, run_idle = runner.original, idle.run

        def train_function(data):
            if len(data) != 1:
                logs = None
                for batch in data:
                    logs = train_function([batch])
                return logs
            if idle.free:  # one of the epoch's full batches, whose shape ran whole: unchecked (IdlePath), inline
                idle.free -= 1
                try:
                    logs = original(data)
                except Exception as e:
                    idle.failed(e, idle.full)
                    raise
                idle.steps += 1
                return logs
            batch = data[0]
            # batch_signature(batch), with its common case inline: a call less on every step,
            # whose tensors' attributes are out of the caches after Keras's step.
            try:
                sig = tuple(map(shape_and_dtype, batch)) if type(batch) is tuple else batch_signature(batch)
            except AttributeError:  # a None or a nested leaf
                sig = batch_signature(batch)
            if sig == idle.signature:  # the idle path (IdlePath), on Keras's own list
                return run_idle(original, data)
            return one(batch)

        return train_function
