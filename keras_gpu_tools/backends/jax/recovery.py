"""The train, test and predict functions the OOM reducer runs on JAX, and the state it hands back.

Each fetches its batch(es) in Python and runs a batch of the idle signature
on Keras's own step (:class:`~keras_gpu_tools.memory.idle.IdlePath`), any
other through the reducer's guarded path; the runners are in :mod:`.accumulate`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.jax.accumulate import JaxEvalRunner, JaxRunner
from keras_gpu_tools.memory.accumulate import concat_outputs
from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.runners import EvalRunner, TrainRunner
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, shape_and_dtype


def _one_execution(iterator, steps: int):
    """The batches of one call of ``steps_per_execution`` steps, fetched as they are used.

    No first batch ends the epoch (``StopIteration``, as Keras's own function
    raises it); a shorter last execution just runs fewer steps.
    """
    first = next(iterator)
    return itertools.chain((first,), itertools.islice(iterator, steps - 1))


class JaxRecovery(Backend):
    """The OOM reducer's side of the JAX backend."""

    async_device: Callable[[], bool]  # JaxStep's: the runners ask it (with device_memory) through ``device``

    def reducer_problem(self, model) -> str | None:
        return None

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs) -> TrainRunner:
        return JaxRunner(model, original, mode, device=self, **kwargs)

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate") -> EvalRunner:
        return JaxEvalRunner(model, kind, original, mode)

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        def step_function(state, iterator):
            outputs = []
            for batch in _one_execution(iterator, steps_per_execution):
                out, state = one(batch, state)
                outputs.append(out)
            return (concat_outputs(outputs) if kind == "predict" else outputs[-1]), state

        return step_function

    def hand_back_eval_state(self, model, kind: str, state) -> None:
        ki.jax_write_variables(model, kind, state)

    def reducer_call(
        self, one: Callable, idle: IdlePath, runner: TrainRunner, steps_per_execution: int, replicas: int = 1
    ) -> Callable:
        original, run_idle = runner.original, idle.run
        step = ki.jax_batch_step(original) if steps_per_execution == 1 else None
        if step is None:  # not Keras's own one-batch function: the batch goes in as an iterator

            def step(state, batch):
                return original(state, iter((batch,)))

        def train_function_1(state, iterator):
            if idle.free:  # one of the epoch's full batches, whose shape ran whole: unchecked (IdlePath), inline
                idle.free -= 1
                batch = next(iterator)  # outside the try: the end of data is not the step's error
                try:
                    out = step(state, batch)
                except Exception as e:
                    idle.failed(e, idle.full)
                    raise
                idle.steps += 1
                return out
            batch = next(iterator)
            try:  # batch_signature(batch), its common case inline (see the torch backend's)
                sig = tuple(map(shape_and_dtype, batch)) if type(batch) is tuple else batch_signature(batch)
            except AttributeError:  # a None or a nested leaf
                sig = batch_signature(batch)
            if sig == idle.signature:  # the idle path (IdlePath)
                return run_idle(step, state, batch)
            return one(batch, state)

        if steps_per_execution == 1:
            return train_function_1

        def train_function(state, iterator):
            logs = None
            for batch in _one_execution(iterator, steps_per_execution):
                logs, state = train_function_1(state, iter((batch,)))
            return logs, state

        return train_function

    def check_late_error(self, model) -> BaseException | None:
        try:
            import jax

            jax.block_until_ready([v.value for v in model.variables])
        except Exception as e:
            return e
        return None

    def hand_back_state(self, model, state) -> None:
        ki.jax_hand_back_state(model, state)
