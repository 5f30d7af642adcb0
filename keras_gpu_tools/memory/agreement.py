"""The agreement between the processes of a job on each new split, before any of them runs it.

In a job of several processes a training step is one program over every
process's devices, with collectives: a process that ran out of memory alone
would leave the others waiting. :class:`JobAgreement` is what
:class:`~keras_gpu_tools.memory.recovery.Recovery` calls (its ``agree``) before
each guarded attempt at a step of the job: this process rehearses the split on
one of its own devices (the runner's ``rehearse``, no collective), then every
process's outcome is gathered through the job's key-value store (which needs no
device memory), and the split runs only where it fits everywhere. Framework-free.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from keras_gpu_tools.memory.explain import OOMExplanation, explanation_of
from keras_gpu_tools.memory.runners import Runner
from keras_gpu_tools.memory.split import describe_split
from keras_gpu_tools.runtime.topology import ExchangeError
from keras_gpu_tools.runtime.units import format_bytes

logger = logging.getLogger("keras_gpu_tools")

# evaluate()/predict() calls outside fit() per (run name, kind) in this process: every process of a
# job counts alike, so the agreement keys of the same call match (the job's store refuses a key twice).
_EVAL_SERIAL: collections.Counter = collections.Counter()


@dataclass
class Agreement:
    """What the processes of a job agreed about one attempt, before any of them ran it.

    A process that runs out of memory before a collective leaves the others
    waiting in it for good (gloo and NCCL alike), so each process first
    rehearses the attempt on one of its own devices, with no collective, and
    the outcomes are gathered through the job's coordination service (which
    needs no device memory); the attempt runs only where every process fits it.
    """

    fits: bool
    error: BaseException | None = None  # this process's own out-of-memory error in the rehearsal
    kind: str = "agreed"  # the event's kind on a process that did not run out of memory itself
    note: str = ""  # who ran out of memory, for the messages
    explanation: dict[str, Any] | None = None


class Exchange(Protocol):
    """The job's channel: every process's ``value`` under ``key`` (``runtime.topology.KVExchange``)."""

    def gather(self, key: str, value: Any, timeout_s: float) -> list[Any]: ...


class JobAgreement:
    """Rehearses each guarded attempt on this process and agrees with the others whether it fits anywhere.

    One gather through the job's store per guarded attempt (a new batch shape
    or split, a regrow trial), never per step: every process reaches it at the
    same step with the same ``n`` and ``k``. The keys are
    ``<run_name>/<scope>/agree<i>``: ``scope`` is the fit (``fit<serial>``),
    or, for an evaluate()/predict() outside fit(), ``<kind><serial>`` numbered
    at its first agreement (a call on one process alone has none).

    Args:
        exchange: the job's channel.
        run_name: the reducer's run name (the keys' prefix).
        scope: the keys' scope, or None for an evaluate()/predict() outside fit().
        kind: ``"test"`` or ``"predict"``: the scope's name where ``scope`` is None.
        timeout_s: how long to wait for the other processes' rehearsals.
        granule: the data-parallel devices of a step (for the messages).
        classify: the backend's kind of an out-of-memory error (None for any other error).
        explain: the explanation of this process's own error (see ``Explainer``).
        warn: ``warn(key, message)``, once per key.
        abort: ends the reducer's fit before an error that stops training.
    """

    def __init__(
        self,
        exchange: Exchange,
        run_name: str,
        scope: str | None,
        kind: str,
        timeout_s: float,
        granule: int,
        classify: Callable[[BaseException], str | None],
        explain: Callable[[BaseException | None, dict[str, Any]], dict[str, Any] | None],
        warn: Callable[[str, str], None],
        abort: Callable[[], None],
    ):
        self.exchange = exchange
        self.run_name = run_name
        self.scope = scope
        self.kind = kind
        self.timeout_s = timeout_s
        self.granule = granule
        self.classify = classify
        self.explain = explain
        self.warn = warn
        self.abort = abort
        self.rounds = 0  # rounds of agreement in this scope (every process counts the same)
        # Predict each rehearsal from the runner's memory analysis (``predict_alone``) before running it:
        # a split predicted not to fit here is voted out of memory without running (the reducer's probe).
        self.predict = False

    def __call__(self, runner: Runner, batch, n: int, k: int, state) -> Agreement:
        """Rehearses ``n`` as ``k`` here (or predicts it does not fit), then gathers every process's outcome."""
        need = self._predicted_need(runner, batch, n, k, state)
        error = self._rehearse(runner, batch, n, k, state) if need is None else None
        if self.scope is None:
            _EVAL_SERIAL[(self.run_name, self.kind)] += 1
            self.scope = f"{self.kind}{_EVAL_SERIAL[(self.run_name, self.kind)]}"
        self.rounds += 1
        first_line = (str(error).strip().splitlines() or [""])[0][:300] if error is not None else ""
        if need is not None:
            first_line = f"predicted to need {format_bytes(need)} more, from XLA's memory analysis; not run"
        mine = {"n": n, "k": k, "oom": error is not None or need is not None, "error": first_line}
        key = f"{self.run_name}/{self.scope}/agree{self.rounds}"
        try:
            votes = self.exchange.gather(key, mine, self.timeout_s)
        except ExchangeError as e:
            self.abort()
            raise RuntimeError(
                f"OOMBatchSizeReducer: the processes of the job could not agree on the split of a batch of {n} ({e}). "
                "Running it without agreement could leave processes waiting in the step's collective for good, so "
                "training stops here."
            ) from error
        if any((v["n"], v["k"]) != (n, k) for v in votes):
            self.abort()
            raise RuntimeError(
                "OOMBatchSizeReducer: the processes of the job are at different batches or splits "
                f"({[(v['n'], v['k']) for v in votes]}): every process must give the same callbacks the same "
                "arguments and feed batches of the same size."
            )
        failed = [i for i, v in enumerate(votes) if v["oom"]]
        if not failed:
            return Agreement(fits=True)
        who = ", ".join(str(i) for i in failed)
        note = (
            f"out of memory on process {who} of {len(votes)} in its rehearsal of {n} as "
            f"{describe_split(n, k, self.granule)} ({votes[failed[0]]['error']}); every process retries the same split"
        )
        context = {"runner": runner, "batch": batch, "n": n, "k": k, "state": state}
        kind = (self.classify(error) or "agreed") if error is not None else "agreed"
        if need is not None:  # this process's own prediction
            kind, context["predicted_need"] = "predicted", need
            context["program"] = getattr(runner, "alone_memory", {}).get((n, k))  # no second analysis
        return Agreement(
            fits=False, error=error, kind=kind, note=note, explanation=self._explanation(error, note, context)
        )

    def _predicted_need(self, runner: Runner, batch, n: int, k: int, state) -> int | None:
        """The bytes the rehearsal would need where it is predicted not to fit here; None where it may fit."""
        predict = getattr(runner, "predict_alone", None) if self.predict else None
        if predict is None:
            return None
        try:
            fits, need = predict(batch, n, k, state)
        except Exception:
            logger.debug("keras_gpu_tools: predicting the rehearsal failed", exc_info=True)
            return None
        return int(need or 0) if fits is False else None

    def _rehearse(self, runner: Runner, batch, n: int, k: int, state) -> BaseException | None:
        """This process's own out-of-memory error in a rehearsal of the split, or None."""
        rehearse = getattr(runner, "rehearse", None)
        if rehearse is None:
            return None
        try:
            rehearse(batch, n, k, state)
        except Exception as e:
            if self.classify(e) is not None:
                return e
            logger.debug("keras_gpu_tools: the rehearsal failed", exc_info=True)
            self.warn(
                "rehearsal",
                f"OOMBatchSizeReducer: rehearsing a split on this process failed ({type(e).__name__}: "
                f"{str(e)[:200]}); such attempts run unrehearsed, so an out-of-memory error on one process "
                "alone cannot be retried.",
            )
        return None

    def _explanation(self, error: BaseException | None, note: str, context: dict[str, Any]) -> dict[str, Any]:
        """This process's explanation (its own error's, where it had one), led by who ran out of memory."""
        try:
            own = error is not None or context.get("predicted_need") is not None
            explanation = self.explain(error, context) if own else None
            if explanation is None:
                explanation = explanation_of(None).as_dict()
            explanation["notes"] = [note] + list(explanation.get("notes") or [])
            explanation["lines"] = OOMExplanation.from_dict(explanation).lines()
        except Exception:
            logger.debug("keras_gpu_tools: explaining an agreed out-of-memory error failed", exc_info=True)
            explanation = {"notes": [note], "lines": [note]}
        return explanation


__all__ = ["Exchange", "JobAgreement"]
