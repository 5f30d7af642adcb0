"""What the OOM reducer asks of a runner: one batch's step, whole or as micro-batches, and its state around it.

Each backend has its runners (``backends/<framework>/accumulate.py``; TensorFlow's and torch's build on
:class:`~keras_gpu_tools.memory.accumulate.StatefulRunner`). The retry loop (``memory.recovery``) protects the
state, runs an attempt, and puts the state back after an out-of-memory error before trying a larger split;
the reducer's train, test and predict functions (each backend's ``recovery.py``) hand them the batches.
JAX's runners also answer ``spans_processes``, ``rehearse``, ``predict_alone`` and ``memory_of``, asked
for only where a runner has them (a job's agreement on a split, the explanation of an error).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Snapshot:
    """What puts a step's state back after a failed attempt: ``kind`` ``"full"``, ``"small"`` or ``"none"``."""

    def __init__(self, kind: str, items: Any, iterations: int | None = None):
        self.kind = kind
        self.items = items  # the backend's copies
        self.iterations = iterations  # the optimizer's step count when it was taken, where kept


class Runner(Protocol):
    """One kind of step (train, test or predict) of one model, as the retry loop runs it."""

    #: Keras's own step function, which runs a batch whole (the reducer sets the one Keras made last).
    original: Callable

    def run(self, batch: Any, n: int, k: int, state: Any = None, guarded: bool = False) -> Any:
        """The step on ``batch`` (``n`` samples) split into ``k`` micro-batches, and its result.

        ``k == 1`` runs Keras's own step, untouched (``n`` is not read). The
        result is Keras's step's: the logs (the predictions of a predict step),
        and on JAX ``(logs, state)``. ``guarded``: the first attempt at this
        batch shape and split, whose state :meth:`protect` copied in full where
        it could; JAX then waits for the step to finish, so that an
        out-of-memory error surfaces inside the attempt.
        """
        ...

    def protect(self, state: Any, guarded: bool) -> Snapshot:
        """What puts the state back as it was before this attempt, should it fail."""
        ...

    def restore(self, snap: Snapshot, state: Any) -> Any:
        """The state from before the failed attempt (JAX's, or ``state`` put back in place).

        Raises :class:`~keras_gpu_tools.errors.UnrecoverableOOM` where it cannot be put back exactly.
        """
        ...

    def predict(self, batch: Any, n: int, k: int, state: Any) -> tuple[bool | None, int | None]:
        """``(fits, bytes needed)`` of the attempt at ``k`` before it runs; ``(None, None)`` where unknown."""
        ...


class TrainRunner(Runner, Protocol):
    """A training step's runner (``RecoveryBackend.accumulation_runner``).

    In mode ``accumulate`` the model's own ``train_step`` runs on every
    micro-batch with the optimizer's update accumulated and applied once, the
    losses weighted so that the gradient, the loss and the metrics are those of
    the whole batch; what cannot be reproduced exactly is refused
    (:func:`~keras_gpu_tools.memory.accumulate.refusal`) before anything is
    applied. In mode ``split`` the micro-batches run as separate steps.
    """

    @property
    def state_bytes(self) -> int | None:
        """The bytes of the model's state (weights, optimizer, metrics); None until known."""
        ...


class EvalRunner(Runner, Protocol):
    """An evaluation (``test``) or prediction (``predict``) step's runner (``RecoveryBackend.eval_runner``)."""

    @property
    def idle_recoverable(self) -> bool:
        """Whether an out-of-memory error of a batch run whole with no copy of the state can be retried."""
        ...
