"""OOMBatchSizeReducer: a Keras adapter over ``keras_gpu_tools/memory/`` (``memory/reducer.py`` wires it)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from keras_gpu_tools import backends
from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import OOMWarning, UnrecoverableOOM
from keras_gpu_tools.memory import checks
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.reducer import ReducerState
from keras_gpu_tools.memory.search import plan_limit
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import roles
from keras_gpu_tools.runtime import validation as check
from keras_gpu_tools.runtime.batches import batch_signature, leading_dim
from keras_gpu_tools.runtime.step_hook import Attachment, StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.topology import single as topology_single
from keras_gpu_tools.runtime.typing_compat import override
from keras_gpu_tools.runtime.warn_once import WarnOnce

logger = logging.getLogger("keras_gpu_tools")


class OOMBatchSizeReducer(FitCallback, roles.MicroBatching):
    """Recovers from out-of-memory errors by retrying the batch as micro-batches.

    When a training step runs out of device memory, the same batch is run again
    as 2, then 4, 8, ... micro-batches until it fits (none below `min_batch_size`);
    later batches start at the micro-batch size that worked. Validation steps,
    `evaluate()` and `predict()` (given the callback) are retried the same way,
    with the results of the unsplit step. Out-of-memory errors are recognised by
    type: TensorFlow `ResourceExhaustedError`, JAX/XLA `RESOURCE_EXHAUSTED`
    runtime errors, torch `OutOfMemoryError` (and its CPU allocator's error).
    Every other exception passes through unchanged.

    Modes:

    - `"accumulate"` (default): the model's own `train_step` runs on each
      micro-batch with each compiled loss weighted by what it averages over
      in the whole batch; the gradients are accumulated and the optimizer
      applies once. The update, the learning-rate schedule, the loss and the
      metrics are those of the unsplit batch, up to floating-point rounding,
      for every built-in reduction, masks, sample and class weights, several
      outputs, Keras's regularizers and loss scaling. What cannot be made
      exact raises `InexactAccumulationError` before anything is applied: a
      second optimizer, a loss with a custom reduction or `reduction=None`,
      an overridden `compute_loss`, a `train_step` that computes its own
      loss, a layer's own `add_loss`.
    - `"split"`: the micro-batches run as separate training steps: k
      optimizer updates per original batch (`optimizer.iterations` and
      learning-rate schedules advance k times as fast), noisier gradients;
      the batch-end callbacks still fire once per original batch.

    Either way, `BatchNormalization` normalises each micro-batch by its own
    statistics and updates its moving averages once per micro-batch (a
    warning says so), and random layers (`Dropout`) draw other numbers.

    Each out-of-memory error is explained (`OOMEvent.explanation`, `why()`):
    what the failing allocation asked for and what was free, the allocator's
    current and peak memory and the largest buffers, as far as the backend
    tells. It goes to the log, `summary()`, the report and, with `log_dir`, to
    TensorBoard (`oom/explanation`) and a file per event in
    `log_dir/<run_name>/oom_events`. On JAX on a GPU (`probe="auto"`) each
    new batch shape and split is compiled first, never run, and XLA's memory
    analysis says whether it fits: a split that cannot fit never runs. A fit
    that never runs out of memory pays for it one compile without autotuning
    per new batch shape (none on a CPU, whose call reuses that compile).

    Nothing is lost or repeated: the failed batch is retried (on TensorFlow
    it is fetched in Python first, so the error cannot consume it), and the
    weights, the optimizer state, the non-trainable variables and the
    metrics are put back as they were before the failed attempt. A batch
    shape that already ran whole runs Keras's own step inside a `try`, with
    no copy of the state, at next to no cost: an out-of-memory error there
    raises `UnrecoverableOOM` with the reason (see `late_recovery`); on JAX
    Keras's step donated the state, so it cannot be retried either way.

    Data parallelism (`keras.distribution.DataParallel` on JAX,
    `tf.distribute.MirroredStrategy`): each device's share of the batch is
    split where it lies, so every micro-batch spans all devices, and
    gradients are accumulated per device and applied once. On JAX a batch
    must hold a multiple of the process's data-parallel devices (checked in
    `on_train_begin`). In a job of several processes
    (`keras.distribution.initialize`) each new batch shape and split is first
    rehearsed by every process on one of its own devices and agreed through
    the job's coordination service: a split that runs out of memory on any
    process runs on none. `evaluate()` and `predict()` steps of the job are
    agreed the same way (every process must call them with the callback).
    An out-of-memory error in the job's step after the rehearsals fitted
    cannot be retried (the others may wait in its collective) and raises `UnrecoverableOOM`.

    When the split reaches `min_batch_size` and still does not fit, the out-of-memory
    error is raised (same type) with the batch sizes tried, the memory figures
    where known, and what to do next.

    Logged keys (History, CSVLogger, TensorBoard): docs/keys.md.

    Args:
        min_batch_size: the smallest micro-batch to try. Defaults to `1`.
        regrow_after: after this many good steps at a split, try half as many
            micro-batches again, so one spike does not slow a whole run (a
            failed trial doubles the wait); `None` keeps the split. Defaults to `None`.
        mode: `"accumulate"` or `"split"` (see above). Defaults to `"accumulate"`.
        probe: `"auto"`: before a batch shape or split first runs, predict whether it fits from XLA's memory
            analysis of the compiled step against the device's memory limit, where that can be told (JAX on a
            GPU); `True`: the same, warning once where it cannot; `False`: run the first attempt and retry after
            its error. Defaults to `"auto"`.
        log_dir: TensorBoard log directory, or `None` for none. Defaults to `None`.
        run_name: TensorBoard run of the scalars. Defaults to `"oom"`.
        verbose: print each recovery under its epoch's progress bar line (0: one short line a fit)
            (it is always logged to the `keras_gpu_tools` logger). Defaults to `0`.
        progress_bar: `"all"` shows its keys on Keras's progress bar, `"brief"` and `"none"` leave them to
            `History`. Defaults to `"none"`.
        late_recovery: keep a copy of the small state (non-trainable and metric variables, the optimizer's
            counters) before every step at a batch shape that already ran whole too, so that an out-of-memory
            error there can be retried exactly (TensorFlow, torch). Defaults to `False`.
        record_memory_history: record the allocator's history (torch on CUDA)
            and write with each event the snapshot file that PyTorch's memory
            visualizer (https://pytorch.org/memory_viz) opens (needs `log_dir`).
            Other backends warn once. Defaults to `False`.
        plan: a `BatchPlan` from `keras_gpu_tools.plan_batch_size` (or the largest micro-batch size as an int):
            batches above it start split at it, and regrowing never goes past it. Defaults to `None`.

    Example:

    ```python
    reducer = OOMBatchSizeReducer(regrow_after=500, log_dir="logs")
    model.fit(x, y, batch_size=1024, epochs=3, callbacks=[reducer])
    print(reducer.micro_batches)  # e.g. 4: each batch of 1024 ran as 4 x 256
    print(reducer.summary())  # each recovery, why memory ran out, the headroom
    ```
    """

    agreement_timeout_s = 600.0  # a job's wait for the others' rehearsals (their first compile included)
    _needs_every_process = True  # every process of a job agrees on each batch's split

    def __init__(
        self,
        min_batch_size: int = 1,
        regrow_after: int | None = None,
        mode: str = "accumulate",
        probe: bool | str = "auto",
        log_dir: str | os.PathLike | None = None,
        run_name: str = "oom",
        verbose: int = 0,
        late_recovery: bool = False,
        record_memory_history: bool = False,
        plan: Any = None,
        progress_bar: str = "none",
    ):
        # Before the base class sets `_global_step`: this callback keeps its step count there.
        self._idle = IdlePath(self._idle_failed)
        super().__init__()
        self.min_batch_size = check.check_int("min_batch_size", min_batch_size, low=1)
        self.regrow_after = check.check_int("regrow_after", regrow_after, low=1, allow_none=True)
        self.mode = check.check_choice("mode", mode, ("accumulate", "split"))
        self.probe = check.check_choice("probe", probe, checks.PROBE_CHOICES)
        self.log_dir = check.check_log_dir("log_dir", log_dir)
        self.run_name = check.check_run_name("run_name", run_name)
        check.check_run_dir(self.log_dir, self.run_name)
        self.verbose, self.progress_bar = check.check_verbose("verbose", verbose), progress_bar  # (checked on setting)
        self.late_recovery = check.check_bool("late_recovery", late_recovery)
        self.record_memory_history = check.check_bool("record_memory_history", record_memory_history)
        self.plan = plan
        self.max_micro_batch_size = plan_limit(plan)
        self.warnings = WarnOnce(OOMWarning)
        self._state = ReducerState(
            min_batch_size=self.min_batch_size,
            regrow_after=self.regrow_after,
            plan_size=self.max_micro_batch_size,
            mode=self.mode,
            probe=self.probe,
            late_recovery=self.late_recovery,
            verbose=self.verbose,
            say=self._print,
            run_name=self.run_name,
            backend=lambda: self.backend,
            run_dir=lambda: self.run_dir,
            step=lambda: self._global_step,
            classify=backends.oom_kind,
            rebuild=backends.oom_error,
            warn=self.warnings,
            abort=lambda: self._end_fit(aborted=True),
        )
        self.controller = self._state.controller
        self.events: list[OOMEvent] = self._state.log.events  # every out-of-memory error met, in order
        self._attachment: Attachment | None = None  # the step hook's place, while a fit runs
        # micro-batches of the last step; steps per execution; data-parallel devices (replicas) of a step
        self._micro_batches = self._spe = self._replicas = 1

    @property
    def _global_step(self) -> int:
        return self._idle.steps  # counted by the idle path (the backend's train function): one increment per step

    @_global_step.setter
    def _global_step(self, value: int) -> None:
        self._idle.steps = value

    @property
    def recovery_seconds(self) -> float:
        """Seconds spent in failed attempts."""
        return self._state.log.recovery_seconds

    @property
    def micro_batches(self) -> int:
        """Micro-batches per batch in the last step (1 = unsplit)."""
        return self._micro_batches

    @property
    def micro_batch_size(self) -> int | None:
        """The micro-batch size in use, or None while batches run whole."""
        return (self.controller.micro_size or self.controller.max_micro_size) if self._micro_batches > 1 else None

    def headroom(self) -> list[dict[str, Any]]:
        """Per device: the allocator's peak in this run, the capacity, and the batch that would fit (`Headroom`)."""
        return self._state.headroom_rows()

    def summary(self) -> str:
        """One line per recovery (and why, where known), the split in use, and the headroom."""
        return self._state.log.summary(self.headroom(), self.micro_batch_size)

    # -- Keras hooks ------------------------------------------------------------
    @override
    def _start_fit(self, session) -> None:
        model, backend, st = self.model, self.backend, self._state
        checks.refuse_fit(model, backend, self.mode)
        self._spe = ki.steps_per_execution(model)
        # Each device's (replica's) share of a batch is split: a micro-batch holds a sample per device at least.
        self._replicas = self.controller.granule = max(1, int(backend.replicas(model) or 1))
        checks.refuse_uneven(model, backend, self._replicas, self.topology.process_count)
        scope, timeout = f"fit{self._fit_serial}", self.agreement_timeout_s
        st.recovery.agree = st.agreement = st.new_agreement(
            self.topology.exchange, scope, "test", self._replicas, timeout
        )
        if self.record_memory_history:
            checks.start_memory_history(backend, self.warnings)
        # Array inputs: an epoch's full batches need no check once their shape ran whole (IdlePath.free).
        self._idle.reset(ki.array_epoch_batches(model) if backend.counts_idle_batches else None)
        st.start_fit(model, session.every)
        self._attachment = StepHook.attach(model, self, backend, session)  # last; calls self.inner(fn)

    @override
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._state.log.epoch_events = 0
        self._idle.new_epoch()

    @override
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        error = self.backend.check_late_error(self.model)  # JAX: an error can surface when outputs are read
        if error is not None and backends.is_oom(error):
            self._end_fit(aborted=True)
            raise UnrecoverableOOM(checks.ASYNC_OOM_REFUSAL) from error
        if error is not None:
            raise error
        self._epoch_figures(self._state.log.end_epoch(self._micro_batches, self._global_step), logs)

    @override
    def on_test_begin(self, logs: dict | None = None) -> None:
        self._attach_eval("test")

    @override
    def on_test_end(self, logs: dict | None = None) -> None:
        self._state.evals.detach("test")

    @override
    def on_predict_begin(self, logs: dict | None = None) -> None:
        self._attach_eval("predict")

    @override
    def on_predict_end(self, logs: dict | None = None) -> None:
        self._state.evals.detach("predict")

    def _attach_eval(self, kind: str) -> None:
        """Runs each test (validation, evaluate()) or predict step through the same retrying as training."""
        model, st = self.model, self._state
        if ki.eval_function(model, kind) is None:
            return
        if not self.fit_running:  # evaluate() or predict() outside fit(): whose job, and keys of their own
            try:
                self.topology = self.backend.topology(model)
            except Exception as e:  # monitoring never stops the work: one process it is
                logger.warning("keras_gpu_tools: reading the distribution failed (%s); taken as one process", e)
                self.topology = topology_single()
            timeout = self.agreement_timeout_s  # keys numbered at its first agreement (none on one process alone)
            st.agreement = st.new_agreement(self.topology.exchange, None, kind, self._replicas, timeout)
        st.evals.attach(kind, model, self.backend, st.agreement)  # a job's steps are agreed as training's are

    # -- step hook observer: the retrying runs in `inner`, on the hook's fast path too --------------
    def sample(self, index: int) -> bool:
        return False

    def on_step(self, record: StepRecord) -> None:
        pass

    def next_sample(self, index: int) -> None:
        return None

    def inner(self, fn: Callable) -> Callable:
        """Step-hook extension: each train-function call runs our retrying function instead of `fn`."""
        st = self._state
        if st.runner is None:
            st.runner = self.backend.accumulation_runner(self.model, fn, self.mode)
        else:
            st.runner.original = fn
        return self.backend.reducer_call(self._one, self._idle, st.runner, self._spe, self._replicas)

    def _one(self, batch, state=None):
        """A batch off the idle path (the backend's train function runs the idle one): guarded, maybe split."""
        st = self._state
        sig = batch_signature(batch)
        n = st.last_batch = leading_dim(batch) or 1
        try:
            result, k = st.recovery.run(st.runner, batch, n, sig, state, step=self._global_step)
        except BaseException:
            # An error inside the step ends fit(): clean up now, not when the fit session notices; re-raise it.
            if st.recovery.restored_state is not None:
                self.backend.hand_back_state(self.model, st.recovery.restored_state)
            self._end_fit(aborted=True)
            raise
        self._micro_batches = k
        # Whole: the next batches of this shape take the idle path, with no copy of the state.
        self._idle.ran(sig, whole=k == 1 and not self.controller.in_trial and not self.late_recovery)
        self._global_step += 1
        return result

    def _idle_failed(self, error: BaseException, signature) -> None:
        """An error on the idle path (see IdlePath): refuses an out-of-memory error; else ends the fit and returns."""
        if backends.is_oom(error):
            self._idle.reset(None)
            self._state.unrecoverable(error, signature, "train")
            self._end_fit(aborted=True)
            raise UnrecoverableOOM(checks.late_oom_refusal(signature)) from error
        self._end_fit(aborted=True)

    @override
    def _stop_fit(self, aborted: bool) -> None:
        if self.record_memory_history:
            self.backend.stop_memory_history()
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            attachment.detach()
        self._state.end_fit(self._global_step)
        self._idle.reset(None)
