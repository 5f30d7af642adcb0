"""Retrying evaluation and prediction steps: validation, evaluate() and predict(), split as training is.

:class:`EvalRetries` replaces Keras's test or predict function of a model by
one that runs each batch through a :class:`~keras_gpu_tools.memory.recovery.Recovery`
of its own (a split with the results of the unsplit step, see the backends'
``eval_runner``), and puts Keras's function back afterwards. A batch shape
that ran whole runs Keras's own step inside a ``try``. Keras is reached
through ``runtime.keras_internals`` and the backend object; no framework import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.errors import UnrecoverableOOM
from keras_gpu_tools.memory.accumulate import refusal
from keras_gpu_tools.memory.agreement import Agreement
from keras_gpu_tools.memory.recovery import Recovery
from keras_gpu_tools.memory.runners import EvalRunner
from keras_gpu_tools.memory.split import SplitController
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, leading_dim

EVAL_MARK = "_keras_gpu_tools_eval_original"  # on our test/predict function: Keras's own
PHASES = {"test": "evaluation", "predict": "prediction"}


@dataclass
class _Eval:
    """The retrying of one kind of step besides training: ``test`` (validation, evaluate()) or ``predict``."""

    kind: str
    controller: SplitController
    recovery: Recovery
    runner: EvalRunner | None = None
    backend: Any = None
    model: Any = None  # not the callback's `model` inside a step: on JAX that property syncs fit()'s state
    original: Callable | None = None
    active: bool = False
    idle: set = field(default_factory=set)  # batch shapes that ran whole: Keras's own step, no copy
    step: int = 0


class EvalRetries:
    """The test and predict steps of a reducer, each kind with its own split.

    Args:
        min_batch_size: the smallest micro-batch to try.
        mode: ``"accumulate"`` or ``"split"``.
        late_recovery: keep a copy of the small state at shapes that ran whole too.
        recovery: makes the :class:`Recovery` of a kind from its controller.
        classify: the backend's kind of an out-of-memory error (None for any other error).
        unrecoverable: ``unrecoverable(error, signature, phase, step)`` records an
            out-of-memory error that is not retried.
    """

    def __init__(
        self,
        min_batch_size: int,
        mode: str,
        late_recovery: bool,
        recovery: Callable[[SplitController], Recovery],
        classify: Callable[[BaseException], str | None],
        unrecoverable: Callable[[BaseException, Any, str, int], None],
    ):
        self.min_batch_size = min_batch_size
        self.mode = mode
        self.late_recovery = late_recovery
        self.make_recovery = recovery
        self.classify = classify
        self.unrecoverable = unrecoverable
        self._eval: dict[str, _Eval] = {}

    def attach(self, kind: str, model, backend, agree: Callable[..., Agreement] | None) -> None:
        """Runs each ``kind`` step of ``model`` through the retrying; ``agree`` in a job of several processes."""
        current = ki.eval_function(model, kind)
        if current is None:
            return
        current = getattr(current, EVAL_MARK, current)  # a wrapper an evaluate() that raised left behind
        ev = self._eval.get(kind)
        if ev is None:
            recovery = self.make_recovery(SplitController(self.min_batch_size))
            recovery.phase = kind
            ev = self._eval[kind] = _Eval(kind, recovery.controller, recovery)
        ev.recovery.agree = agree
        ev.runner = backend.eval_runner(model, kind, current, self.mode)
        ev.backend = backend
        ev.model = model
        ev.original = current
        replicas = max(1, int(backend.replicas(model) or 1))
        ev.controller.granule = replicas  # each device's share is split, as in training
        spe = ki.steps_per_execution(model)
        call = backend.eval_call(kind, lambda batch, state=None: self._one(ev, batch, state), spe, replicas)

        def function(*args):
            if not ev.active:  # left by an evaluate() that died: Keras's own function, and unwrap
                ki.set_eval_function(model, kind, current)
                return current(*args)
            return call(*args)

        setattr(function, EVAL_MARK, current)
        ev.active = True
        ki.set_eval_function(model, kind, function)

    def detach(self, kind: str) -> None:
        """Puts Keras's own function of ``kind`` back (where ours is still in place)."""
        ev = self._eval.get(kind)
        if ev is None or not ev.active:
            return
        ev.active = False
        model, original = ev.model, ev.original
        fn = ki.eval_function(model, kind) if model is not None else None
        if fn is not None and getattr(fn, EVAL_MARK, None) is original and original is not None:
            ki.set_eval_function(model, kind, original)
        ev.runner = ev.model = ev.backend = None

    def detach_all(self) -> None:
        for kind in list(self._eval):
            self.detach(kind)

    def _one(self, ev: _Eval, batch, state=None):
        runner = ev.runner
        if runner is None:  # detached: Keras's own function runs the steps
            raise RuntimeError(f"OOMBatchSizeReducer: its {PHASES[ev.kind]} step ran after it was detached")
        sig = batch_signature(batch)
        ev.step += 1
        if sig in ev.idle:
            try:
                return runner.run(batch, 0, 1, state, False)
            except Exception as e:
                if self.classify(e) is None:
                    self.detach(ev.kind)
                    raise
                if not runner.idle_recoverable:
                    self.unrecoverable(e, sig, ev.kind, ev.step - 1)
                    self.detach(ev.kind)
                    raise UnrecoverableOOM(
                        f"OOMBatchSizeReducer: out of memory in an {PHASES[ev.kind]} step at a batch shape that had "
                        f"already run whole ({sig!r}); no copy of its state was kept, so it cannot be retried "
                        "exactly. Set `late_recovery=True`, or lower the batch size."
                    ) from e
                ev.idle.discard(sig)  # a predict step has no state: retry it split
        n = leading_dim(batch) or 1
        if self.mode == "accumulate" and ev.kind == "test" and ev.controller.split_for(n) > 1:
            problem = ki.loss_reduction_problem(ev.model)
            if problem:
                self.detach(ev.kind)
                raise refusal(problem)
        try:
            result, k = ev.recovery.run(runner, batch, n, sig, state, step=ev.step - 1)
        except BaseException:
            if ev.recovery.restored_state is not None:
                ev.backend.hand_back_eval_state(ev.model, ev.kind, ev.recovery.restored_state)
            self.detach(ev.kind)
            raise
        if k == 1 and not self.late_recovery:
            ev.idle.add(sig)
        return result


__all__ = ["EVAL_MARK", "EvalRetries"]
