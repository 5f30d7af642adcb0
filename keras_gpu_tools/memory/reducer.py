"""One reducer's parts, wired: the split, the retrying of each kind of step, and what each event leaves.

:class:`ReducerState` is what an ``OOMBatchSizeReducer`` keeps across fits,
without Keras's callback machinery: the training
:class:`~keras_gpu_tools.memory.recovery.SplitController` and
:class:`~keras_gpu_tools.memory.recovery.Recovery`, the evaluation and
prediction retrying (:mod:`~keras_gpu_tools.memory.eval_retry`), the job's
agreement (:mod:`~keras_gpu_tools.memory.agreement`), the explanations
(:mod:`~keras_gpu_tools.memory.explain`), the record of each event
(:mod:`~keras_gpu_tools.memory.event_log`) and the headroom
(:mod:`~keras_gpu_tools.memory.headroom`). The backend object is reached
through ``backend()`` (the callback's, read anew each fit); no framework import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.memory import checks
from keras_gpu_tools.memory.agreement import Exchange, JobAgreement
from keras_gpu_tools.memory.eval_retry import EvalRetries
from keras_gpu_tools.memory.event_log import EventLog, unrecoverable_event
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.explain import Explainer
from keras_gpu_tools.memory.headroom import Headroom
from keras_gpu_tools.memory.recovery import Recovery
from keras_gpu_tools.memory.runners import TrainRunner
from keras_gpu_tools.memory.split import SplitController
from keras_gpu_tools.runtime.ticker import Job

WRITE_LATER_S = 0.5  # how often the session's thread writes the epoch figures handed over

logger = logging.getLogger("keras_gpu_tools")


class ReducerState:
    """A reducer's split, retrying and record of events (see the module docstring).

    Args:
        min_batch_size, regrow_after, mode, probe, late_recovery, verbose,
            run_name: the reducer's arguments.
        plan_size: the largest micro-batch of its plan, or None.
        backend: returns the backend object of the fit.
        run_dir: returns the reducer's run folder (None without a log dir).
        step: returns the reducer's global step (training batches run).
        classify: the backend's kind of an out-of-memory error (None for any other error).
        rebuild: ``rebuild(error, message)``: an error of the original type with ``message``.
        warn: ``warn(key, message)``, once per key.
        abort: ends the reducer's fit before an error that stops it.
        say: prints a line (with ``verbose``). Defaults to `print`.
    """

    def __init__(
        self,
        *,
        min_batch_size: int,
        regrow_after: int | None,
        plan_size: int | None,
        mode: str,
        probe: bool | str,
        late_recovery: bool,
        verbose: int,
        run_name: str,
        backend: Callable[[], Any],
        run_dir: Callable[[], str | None],
        step: Callable[[], int],
        classify: Callable[[BaseException], str | None],
        rebuild: Callable[[BaseException, str], BaseException],
        warn: Callable[[str, str], None],
        abort: Callable[[], None],
        say: Callable[[str], None] = print,
    ):
        self.mode = mode
        self.run_name = run_name
        self.backend = backend
        self.step = step
        self.classify = classify
        self.rebuild = rebuild
        self.warn = warn
        self.abort = abort
        self.controller = SplitController(min_batch_size, regrow_after, plan_size)
        self.explainer = Explainer(lambda error, context: backend().explain_oom(error, context))
        self.run_dir = run_dir
        self.log = EventLog(warn, verbose, run_dir, say)  # each event to the log, TensorBoard and files
        self._write_job: Job | None = None  # the epochs' figures written on the fit session's thread
        self.headroom = Headroom(plan_size)
        self.probe = probe  # the argument: resolved for each fit's backend and device (start_fit)
        self.recovery = self.new_recovery(self.controller)
        self.evals = EvalRetries(min_batch_size, mode, late_recovery, self.new_recovery, classify, self.unrecoverable)
        self.agreement: JobAgreement | None = None  # a job's: this fit's, or an evaluate()'s outside fit()
        self.model: Any = None  # the model of this fit (not the callback's `model` in a step: on JAX it syncs)
        self.runner: TrainRunner | None = None  # the training runner of this fit
        self.last_batch: int | None = None

    def new_recovery(self, controller: SplitController, probe: bool = False) -> Recovery:
        """The retrying of one kind of step, whose events this state records."""
        return Recovery(
            controller,
            on_event=self.on_event,
            memory=lambda: self.backend().device_memory(),
            probe=probe,
            classify=self.classify,
            rebuild=self.rebuild,
            explain=self.explainer,
        )

    def new_agreement(
        self, exchange: Exchange | None, scope: str | None, kind: str, granule: int, timeout_s: float
    ) -> JobAgreement | None:
        """The agreement of a job of several processes (None without the job's ``exchange``); see JobAgreement."""
        if exchange is None:
            return None
        return JobAgreement(
            exchange,
            self.run_name,
            scope,
            kind,
            timeout_s,
            granule,
            classify=self.classify,
            explain=self.explainer,
            warn=self.warn,
            abort=self.abort,
        )

    @property
    def agreements(self) -> int:
        """Rounds of agreement of the current scope (this fit, or the last evaluate()/predict() outside fit)."""
        return self.agreement.rounds if self.agreement is not None else 0

    def on_event(self, event: OOMEvent) -> None:
        """Records ``event``; warns where a split changes what batch statistics see."""
        self.log.record(event, self.explainer.take_artifacts())
        split = event.phase == "train" and self.mode == "accumulate" and (event.next_split or 1) > 1
        if split and checks.uses_batch_statistics(self.model):
            self.warn("batchnorm", checks.BATCH_STATISTICS_WARNING)

    def unrecoverable(self, error: BaseException, signature, phase: str, step: int | None = None) -> None:
        """An out-of-memory error that is not retried is recorded (and explained) like the others."""
        try:
            explanation = self.explainer(error, {"phase": phase})
        except Exception:
            explanation = None
        step = self.step() if step is None else step
        self.on_event(unrecoverable_event(error, signature, phase, step, self.classify(error), explanation))

    def start_fit(self, model, every: Callable[..., Job] | None = None) -> None:
        """A fit of ``model`` starts: whether it predicts (``probe``); its events to TensorBoard, where logged.

        With ``every`` (``FitSession.every``), the epochs' figures handed over to the writer are written on
        the session's thread every ``WRITE_LATER_S``, and the rest when the fit ends.
        """
        self.model = model
        predict = checks.resolve_probe(self.probe, self.backend(), self.warn)
        self.recovery.probe = predict
        if self.agreement is not None:  # a job's rehearsals predict too, so a split that cannot fit is not run
            self.agreement.predict = predict
        run_dir = self.run_dir()
        self.log.writer = EventWriter(run_dir) if run_dir is not None else None
        self._write_job = None
        if every is not None and self.log.writer is not None:
            self._write_job = every(WRITE_LATER_S, self.log.writer.write_later, self._write_failed)
        self.log.noticed = False
        self.explainer.files = self.log.writer is not None

    def end_fit(self, step: int) -> None:
        """The fit ends: its headroom for the report (never failing the teardown), the writer closed."""
        self.evals.detach_all()  # validation that raised never reached on_test_end
        job, self._write_job = self._write_job, None
        if job is not None:
            job.stop()  # (a write under way finishes first; the log's close writes the rest)
        try:
            headroom = self.headroom_rows()
        except Exception:
            logger.debug("keras_gpu_tools: headroom failed", exc_info=True)
            headroom = []
        self.log.close(headroom, step)
        self.explainer.files = False
        self.runner = None

    def _write_failed(self, error: BaseException) -> None:
        self.warn("write", f"OOMBatchSizeReducer: writing its TensorBoard run failed ({error!r}); training goes on.")

    def headroom_rows(self) -> list[dict[str, Any]]:
        """Per device: the allocator's peak, the capacity and the batch that would fit (see Headroom)."""
        self.headroom.record(lambda: self.backend().device_peaks())
        state_bytes = self.runner.state_bytes if self.runner is not None else None
        return self.headroom.rows(self.controller.micro_size or self.last_batch, float(state_bytes or 0))


__all__ = ["ReducerState"]
