"""OOMBatchSizeReducer: a training step that runs out of memory is retried as micro-batches."""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools import backends
from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import OOMWarning, UnrecoverableOOM
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter, to_plain
from keras_gpu_tools.memory.accumulate import accumulation_problem, refusal
from keras_gpu_tools.memory.agreement import Agreement
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.explain import OOMExplanation, explanation_of, headroom_lines
from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.recovery import Recovery
from keras_gpu_tools.memory.split import SplitController, describe_split
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, leading_dim
from keras_gpu_tools.runtime.step_hook import StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.topology import ExchangeError
from keras_gpu_tools.runtime.topology import single as topology_single
from keras_gpu_tools.runtime.units import format_seconds
from keras_gpu_tools.runtime.validation import (
    check_bool,
    check_choice,
    check_int,
    check_log_dir,
    check_run_dir,
    check_run_name,
    check_verbose,
)
from keras_gpu_tools.runtime.warn_once import WarnOnce

logger = logging.getLogger("keras_gpu_tools")

_MODES = ("accumulate", "split")
_EVAL_MARK = "_keras_gpu_tools_eval_original"  # on our test/predict function: Keras's own
_PHASES = {"test": "evaluation", "predict": "prediction"}
# evaluate()/predict() calls outside fit() per (run name, kind) in this process: every process of a
# job counts alike, so the agreement keys of the same call match (the job's store refuses a key twice).
_EVAL_SERIAL: collections.Counter = collections.Counter()


@dataclass
class _Eval:
    """The retrying of one kind of step besides training: ``test`` (validation, evaluate()) or ``predict``."""

    kind: str
    controller: SplitController
    recovery: Recovery
    runner: Any = None
    model: Any = None  # not `self.model` inside a step: on JAX that property syncs fit()'s state
    original: Callable | None = None
    active: bool = False
    idle: set = field(default_factory=set)  # batch shapes that ran whole: Keras's own step, no copy
    step: int = 0


class OOMBatchSizeReducer(FitCallback):
    """Recovers from out-of-memory errors by retrying the batch as micro-batches.

    When a training step runs out of device memory, the same batch is run
    again as 2, then 4, 8, ... micro-batches until it fits (each retry with
    a smaller largest micro-batch, none below `min_batch_size`); later
    batches start at the micro-batch size that worked. Validation steps,
    `evaluate()` and `predict()` (given the callback) are retried the same
    way: split, with the results of the unsplit step. Out-of-memory errors
    are recognised by type: TensorFlow `ResourceExhaustedError`, JAX/XLA
    `RESOURCE_EXHAUSTED` runtime errors, torch `OutOfMemoryError` (and
    torch's CPU allocator error). Every other exception passes through
    unchanged.

    Modes:

    - `"accumulate"` (default): the model's own `train_step` runs on each
      micro-batch with each compiled loss weighted by what it really
      averages over in the whole batch (its samples, its mask's valid
      entries, its sample and class weights, or nothing for `"sum"`); the
      gradients are accumulated and the optimizer applies once, to the
      variables the step handed it. The update, the number of updates and
      the learning-rate schedule, the loss and the metrics of the epoch logs
      are those of the unsplit batch, up to floating-point rounding, for
      every built-in reduction, masked losses, sample and class weights,
      several outputs and Keras's weight and activity regularizers. Loss
      scaling (`mixed_float16`) is applied once. What cannot be made exact
      raises `InexactAccumulationError` before anything is applied (in
      `on_train_begin` where the model tells, else at the first split, with
      the state put back): a second optimizer, a loss with a custom
      reduction or `reduction=None`, an overridden `compute_loss`, a
      `train_step` that computes its own loss, a layer's own `add_loss`.
    - `"split"`: the micro-batches run as separate training steps: a truly
      smaller batch. This changes the optimisation: k optimizer updates per
      original batch (`optimizer.iterations` and learning-rate schedules
      advance k times as fast), noisier gradients, and the batch-end
      callbacks still fire once per original batch.

    Either way, layers with batch statistics (`BatchNormalization`) normalise
    each micro-batch by its own statistics, and their moving averages are
    updated once per micro-batch (k times per original batch, with the
    layer's momentum each time): use `GroupNormalization`/`LayerNormalization`
    where that matters (a warning says so when it happens). Random layers
    (`Dropout`) draw other numbers than the unsplit step would.

    Each out-of-memory error is explained (`OOMEvent.explanation`, `why()`):
    what the failing allocation asked for and what was free of what (from the
    error's message), the allocator's current and peak memory, the largest
    buffers (JAX: live arrays, the failing program's XLA memory analysis and
    the device memory profile; torch: `torch.cuda.memory_snapshot()`;
    TensorFlow: `get_memory_info` and the op the error names). It goes to the
    log, `summary()`, the report and, with `log_dir`, to TensorBoard
    (`oom/explanation`) and a file per event in `log_dir/<run_name>/oom_events`.
    On JAX, after a real out-of-memory error the next splits are chosen from
    XLA's memory analysis of their compiled steps (compiled without
    autotuning, never run), so a split that cannot fit is not run.

    Nothing is lost or repeated: the failed batch is retried (on TensorFlow
    it is fetched in Python before the step, so the error cannot consume it);
    the weights, the optimizer state, the non-trainable variables and the
    metrics are put back to what they were before the failed attempt.
    The first attempt at each batch shape and split keeps a host copy of
    the whole state (when it is at most 4 GiB); later steps at a split keep a
    device copy of the small state (non-trainable and metric variables, the
    optimizer's counters). A batch shape that already ran whole runs on the
    idle path: Keras's own step inside a `try`, with no copy, so the callback
    costs next to nothing while nothing runs out of memory (where fit() is
    given arrays, on JAX and torch, not even a look at the batch's shapes
    for an epoch's full batches). An out-of-memory
    error there cannot be retried exactly and raises `UnrecoverableOOM` with
    the reason (`late_recovery=True` keeps the small copy there too, on
    TensorFlow and torch). On JAX, Keras's step donates the state to the
    call, so such an error cannot be retried either way; `probe=True` avoids
    running steps predicted not to fit.

    Data parallelism: under `keras.distribution.DataParallel` (JAX) and
    `tf.distribute.MirroredStrategy` (TensorFlow) each device's (replica's)
    share of the batch is split where it lies, so every micro-batch is spread
    over all devices as the batch was, holds at least one sample per device,
    and no sample moves; gradients are accumulated per device and applied once
    (the optimizer sums them over the devices as in Keras's own step). On JAX a
    batch must hold a multiple of the process's data-parallel devices: a last
    batch that does not is refused in `on_train_begin` (Keras would fail there
    mid-epoch). In a job of several processes (`keras.distribution.initialize`)
    every new batch shape and split is first rehearsed by each process on one
    of its own devices, without collectives, and the outcomes are gathered
    through the job's coordination service (its key-value store, which needs
    no device memory): a split that runs out of memory on any process runs on
    none, and every process moves to the same next split. Validation steps,
    `evaluate()` and `predict()` are agreed the same way (every process must
    call them with the callback, as it calls fit()). Only steps of the job are
    agreed, those whose batch is spread over several processes' devices: a
    `predict()` on one process's own data (no distribution) is retried there
    alone. (Keras 3.15's own `predict()` cannot return the outputs of a step
    of the job: they span the other processes' devices.) An out-of-memory
    error inside the job's step itself, after the rehearsals fitted, cannot be
    retried (the other processes may wait in the step's collective for good)
    and raises `UnrecoverableOOM`. Under `MirroredStrategy`, `predict()`
    splits each replica's share too and returns the rows in the unsplit order.

    When the split reaches `min_batch_size` and still does not fit, the
    out-of-memory error is raised (same type) with the batch sizes tried,
    the device's memory figures where known, and what to do next.

    Logged keys (per epoch into `logs`; to TensorBoard in the run
    `log_dir/<run_name>` when `log_dir` is given, on the step axis):

    | key | unit | meaning |
    |---|---|---|
    | `oom/events` | count | out-of-memory errors recovered from in the epoch |
    | `oom/micro_batches` | count | micro-batches per batch at the end of the epoch (1 = unsplit) |

    Args:
        min_batch_size: the smallest micro-batch to try. Defaults to `1`.
        regrow_after: after this many good steps at a split, try half as many
            micro-batches again, so one spike does not slow a whole run (a
            failed trial doubles the wait). `None` keeps the split. Defaults
            to `None`.
        mode: `"accumulate"` or `"split"` (see above). Defaults to
            `"accumulate"`.
        probe: before a batch shape first runs, predict whether the step fits
            from the compiled step's memory analysis against the device's
            memory limit, and start at the split that fits (JAX on GPU; other
            backends cannot tell and warn once). Defaults to `False`.
        log_dir: TensorBoard log directory, or `None` for none. Defaults to
            `None`.
        run_name: TensorBoard run of the scalars. Defaults to `"oom"`.
        verbose: print each recovery (it is always logged to the
            `keras_gpu_tools` logger). Defaults to `0`.
        late_recovery: also keep a copy of the small state (non-trainable and
            metric variables, the optimizer's counters) before every step at a
            batch shape that already ran whole, so that an out-of-memory error
            there can still be retried exactly (TensorFlow and torch; JAX's
            donated state cannot be kept cheaply). Without it such a step runs
            as Keras's own step inside a `try`, at no cost, and an
            out-of-memory error there raises `UnrecoverableOOM`. Defaults to
            `False`.
        record_memory_history: record the allocator's history of allocations
            while training (torch on CUDA: `torch.cuda.memory`), and write with
            each event the snapshot file that PyTorch's memory visualizer
            (https://pytorch.org/memory_viz) opens (needs `log_dir`). Other
            backends warn once. Defaults to `False`.
        plan: a `BatchPlan` from `keras_gpu_tools.plan_batch_size` (or the
            largest micro-batch size as an int): batches above it start split
            at it, and regrowing never goes past it. Defaults to `None`.

    Example:

    ```python
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer

    reducer = OOMBatchSizeReducer(regrow_after=500, log_dir="logs")
    model.fit(x, y, batch_size=1024, epochs=3, callbacks=[reducer])
    print(reducer.micro_batches)  # e.g. 4: each batch of 1024 ran as 4 x 256
    print(reducer.summary())  # each recovery, why memory ran out, the headroom
    ```
    """

    #: How long a process waits for the others' rehearsals (their first compile included) in a job.
    agreement_timeout_s = 600.0

    def __init__(
        self,
        min_batch_size: int = 1,
        regrow_after: int | None = None,
        mode: str = "accumulate",
        probe: bool = False,
        log_dir: str | os.PathLike | None = None,
        run_name: str = "oom",
        verbose: int = 0,
        late_recovery: bool = False,
        record_memory_history: bool = False,
        plan: Any = None,
    ):
        # Before the base class sets `_global_step`: this callback keeps its step count there.
        self._idle = IdlePath(self._idle_failed)
        super().__init__()
        self.min_batch_size = check_int("min_batch_size", min_batch_size, low=1)
        self.regrow_after = check_int("regrow_after", regrow_after, low=1, allow_none=True)
        self.mode = check_choice("mode", mode, _MODES)
        self.probe = check_bool("probe", probe)
        self.log_dir = check_log_dir("log_dir", log_dir)
        self.run_name = check_run_name("run_name", run_name)
        check_run_dir(self.log_dir, self.run_name)
        self.verbose = check_verbose("verbose", verbose)
        self.late_recovery = check_bool("late_recovery", late_recovery)
        self.record_memory_history = check_bool("record_memory_history", record_memory_history)
        self.plan = plan
        self.max_micro_batch_size = _planned_size(plan)
        self.warnings = WarnOnce(OOMWarning)
        self.controller = SplitController(self.min_batch_size, self.regrow_after, self.max_micro_batch_size)
        self.events: list[OOMEvent] = []
        self.recovery_seconds = 0.0
        self._recovery = Recovery(
            self.controller,
            on_event=self._on_event,
            memory=self._memory,
            probe=self.probe,
            classify=backends.oom_kind,
            rebuild=backends.oom_error,
            explain=self._explain,
        )
        self._micro_batches = 1
        self._artifacts: dict[str, bytes] = {}  # files of the explanation being recorded
        self._model_ref = None  # the model of this fit (not `self.model` inside a step: on JAX it syncs)
        self._peak: dict[int, tuple[float, float | None]] = {}  # device -> (peak bytes, capacity) of the run
        self._last_batch: int | None = None
        self._epoch_events = 0
        self._runner = None
        self._attachment = None
        self._writer: EventWriter | None = None
        self._spe = 1
        self._replicas = 1  # data-parallel devices (replicas) of a step
        self._agreements = 0  # rounds of agreement in this fit (every process counts the same)
        self._agree_scope: str | None = "fit0"  # the keys' scope: this fit(), or an evaluate()/predict() outside fit
        self._scope_kind = "test"
        self._eval: dict[str, _Eval] = {}  # "test" / "predict": evaluation and prediction steps

    # -- public ---------------------------------------------------------------
    @property
    def _global_step(self) -> int:
        # Kept by the idle path (the backend's train function counts there), so that an idle step
        # costs one attribute increment and no frame of this callback's.
        return self._idle.steps

    @_global_step.setter
    def _global_step(self, value: int) -> None:
        self._idle.steps = value

    @property
    def micro_batches(self) -> int:
        """Micro-batches per batch in the last step (1 = unsplit)."""
        return self._micro_batches

    @property
    def micro_batch_size(self) -> int | None:
        """The micro-batch size in use, or None while batches run whole."""
        if self._micro_batches <= 1:
            return None
        return self.controller.micro_size or self.controller.max_micro_size

    # -- Keras hooks ------------------------------------------------------------
    def _start_fit(self, session) -> None:
        model = self.model
        backend = self.backend
        problem = backend.reducer_problem(model)
        if problem:
            raise ValueError(problem)
        if self.mode == "accumulate":
            inexact = accumulation_problem(model)
            if inexact:
                raise refusal(inexact)
        self._spe = ki.steps_per_execution(model)
        # Data parallelism: each device's (replica's) share of a batch is split, so a
        # micro-batch holds at least one sample per device.
        self._replicas = max(1, int(backend.replicas(model) or 1))
        self.controller.granule = self._replicas
        # A job of several processes: every new batch shape and split is rehearsed on each process
        # and agreed through the job's channel before it runs (see Agreement).
        self._agreements = 0
        self._agree_scope = f"fit{self._fit_serial}"
        self._recovery.agree = self._agree if self.topology.exchange is not None else None
        if self._replicas > 1 and backend.even_shares:
            uneven = _uneven_share(model, self._replicas // max(1, self.topology.process_count))
            if uneven:
                raise ValueError(uneven)
        if self.probe and not backend.predicts_memory:
            self.warnings(
                "probe",
                f"OOMBatchSizeReducer: probe=True needs the JAX backend (XLA's memory analysis); "
                f"{backend.name} cannot tell before running, so the first step is simply retried if it runs out of memory.",
            )
        elif self.probe and not backend.device_memory().get("bytes_limit"):
            self.warnings(
                "probe-device",
                "OOMBatchSizeReducer: probe=True: this device reports no memory limit "
                "(CPU); nothing is predicted, out-of-memory errors are retried.",
            )
        if self.record_memory_history:
            why = backend.start_memory_history()
            if why:
                self.warnings("history", f"OOMBatchSizeReducer: record_memory_history=True: {why}; recording nothing.")
        self._model_ref = model
        # Array inputs: an epoch's full batches need no check once their shape ran whole (IdlePath.free).
        self._idle.reset(ki.array_epoch_batches(model) if backend.counts_idle_batches else None)
        if self.log_dir is not None:
            self._writer = EventWriter(self.run_dir)
        self._attachment = StepHook.attach(model, self, backend, session)  # last; calls self.inner(fn)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch_events = 0
        self._idle.new_epoch()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._check_late_error()
        values = {schema.OOM_EVENTS: float(self._epoch_events), schema.OOM_MICRO_BATCHES: float(self._micro_batches)}
        if logs is not None:
            logs.update(values)
        if self._writer is not None:
            self._writer.scalars(values, step=self._global_step)
            self._writer.flush()

    # -- evaluation and prediction ------------------------------------------------------
    def on_test_begin(self, logs: dict | None = None) -> None:
        self._attach_eval("test")

    def on_test_end(self, logs: dict | None = None) -> None:
        self._detach_eval("test")

    def on_predict_begin(self, logs: dict | None = None) -> None:
        self._attach_eval("predict")

    def on_predict_end(self, logs: dict | None = None) -> None:
        self._detach_eval("predict")

    def _attach_eval(self, kind: str) -> None:
        """Runs each test (validation, evaluate()) or predict step through the same retrying as training."""
        model = self.model
        current = ki.eval_function(model, kind)
        if current is None:
            return
        current = getattr(current, _EVAL_MARK, current)  # a wrapper an evaluate() that raised left behind
        ev = self._eval.get(kind)
        if ev is None:
            controller = SplitController(self.min_batch_size)
            recovery = Recovery(
                controller,
                on_event=self._on_event,
                memory=self._memory,
                classify=backends.oom_kind,
                rebuild=backends.oom_error,
                explain=self._explain,
            )
            recovery.phase = kind
            ev = self._eval[kind] = _Eval(kind, controller, recovery)
        if not self.fit_running:  # evaluate() or predict() outside fit(): whose job, and keys of their own
            try:
                self.topology = self.backend.topology(model)
            except Exception as e:  # monitoring never stops the work: one process it is
                logger.warning("keras_gpu_tools: reading the distribution failed (%s); taken as one process", e)
                self.topology = topology_single()
            self._agree_scope = None  # numbered at its first agreement: a call on one process alone has none
            self._scope_kind = kind
            self._agreements = 0
        # In a job of several processes its steps are agreed as training steps are (see `_agree`).
        ev.recovery.agree = self._agree if self.topology.exchange is not None else None
        ev.runner = self.backend.eval_runner(model, kind, current, self.mode)
        ev.model = model
        ev.original = current
        replicas = max(1, int(self.backend.replicas(model) or 1))
        ev.controller.granule = replicas  # each device's share is split, as in training
        call = self.backend.eval_call(
            kind, lambda batch, state=None: self._one_eval(ev, batch, state), self._spe_of(model), replicas
        )

        def function(*args):
            if not ev.active:  # left by an evaluate() that died: Keras's own function, and unwrap
                ki.set_eval_function(model, kind, current)
                return current(*args)
            return call(*args)

        setattr(function, _EVAL_MARK, current)
        ev.active = True
        ki.set_eval_function(model, kind, function)

    def _detach_eval(self, kind: str) -> None:
        ev = self._eval.get(kind)
        if ev is None or not ev.active:
            return
        ev.active = False
        model = ev.model
        fn = ki.eval_function(model, kind) if model is not None else None
        if fn is not None and getattr(fn, _EVAL_MARK, None) is ev.original:
            ki.set_eval_function(model, kind, ev.original)
        ev.runner = ev.model = None

    @staticmethod
    def _spe_of(model) -> int:
        return ki.steps_per_execution(model)

    def _one_eval(self, ev: _Eval, batch, state=None):
        sig = batch_signature(batch)
        ev.step += 1
        if sig in ev.idle:
            try:
                return ev.runner.run(batch, 0, 1, state, False)
            except Exception as e:
                if not backends.is_oom(e):
                    self._detach_eval(ev.kind)
                    raise
                if not ev.runner.idle_recoverable:
                    self._record_unrecoverable(e, sig, ev.kind, step=ev.step - 1)
                    self._detach_eval(ev.kind)
                    raise UnrecoverableOOM(
                        f"OOMBatchSizeReducer: out of memory in an {_PHASES[ev.kind]} step at a batch shape that had "
                        f"already run whole ({sig!r}); no copy of its state was kept, so it cannot be retried "
                        "exactly. Set `late_recovery=True`, or lower the batch size."
                    ) from e
                ev.idle.discard(sig)  # a predict step has no state: retry it split
        n = leading_dim(batch) or 1
        if self.mode == "accumulate" and ev.kind == "test" and ev.controller.split_for(n) > 1:
            problem = ki.loss_reduction_problem(ev.model)
            if problem:
                self._detach_eval(ev.kind)
                raise refusal(problem)
        try:
            result, k = ev.recovery.run(ev.runner, batch, n, sig, state, step=ev.step - 1)
        except BaseException:
            if ev.recovery.restored_state is not None:
                self.backend.hand_back_eval_state(ev.model, ev.kind, ev.recovery.restored_state)
            self._detach_eval(ev.kind)
            raise
        if k == 1 and not self.late_recovery:
            ev.idle.add(sig)
        return result

    # -- step hook observer -------------------------------------------------------
    def sample(self, index: int) -> bool:
        return False

    def on_step(self, record: StepRecord) -> None:
        pass

    def next_sample(self, index: int) -> None:
        return None  # the retrying runs in `inner`, on the hook's fast path too

    def inner(self, fn: Callable) -> Callable:
        """Step-hook extension: each train-function call runs our retrying function instead of `fn`."""
        if self._runner is None:
            self._runner = self.backend.accumulation_runner(self.model, fn, self.mode)
        else:
            self._runner.original = fn
        return self.backend.reducer_call(self._one, self._idle, self._runner, self._spe, self._replicas)

    def on_detach(self, stale: bool) -> None:
        pass

    def _idle_failed(self, error: BaseException, signature) -> None:
        """An error on the idle path (see IdlePath): refuses an out-of-memory error; else ends the fit and returns."""
        if not backends.is_oom(error):
            self._end_fit(aborted=True)
            return
        self._refuse_late_oom(error, signature)

    def _one(self, batch, state=None):
        """A batch off the idle path (the backend's train function runs the idle one): guarded, maybe split."""
        sig = batch_signature(batch)
        n = leading_dim(batch) or 1
        self._last_batch = n
        try:
            result, k = self._recovery.run(self._runner, batch, n, sig, state, step=self._global_step)
        except BaseException:
            # An error inside the step ends fit() (Keras catches only the end of
            # data, which never comes from here): clean up now rather than when
            # the fit session notices, and re-raise it unchanged.
            if self._recovery.restored_state is not None:
                self.backend.hand_back_state(self.model, self._recovery.restored_state)
            self._end_fit(aborted=True)
            raise
        self._micro_batches = k
        # Whole: the next batches of this shape take the idle path, where no copy of
        # the state is kept (that copy is what cost time on every step).
        self._idle.ran(sig, whole=k == 1 and not self.controller.in_trial and not self.late_recovery)
        self._global_step += 1
        return result

    def _refuse_late_oom(self, error: BaseException, signature) -> None:
        """An OOM on the idle path: at a shape that had run whole before, with no copy of the state."""
        self._idle.reset(None)
        self._record_unrecoverable(error, signature, "train")
        self._end_fit(aborted=True)
        raise UnrecoverableOOM(
            "OOMBatchSizeReducer: out of memory at a batch shape that had already run whole "
            f"({signature!r}). No copy of the state is kept for such steps (it would cost time on every "
            "step), and the failed attempt may already have updated the metrics, the moving statistics "
            "and (JAX) freed the donated state, so the batch cannot be retried exactly. Set "
            "`late_recovery=True` (TensorFlow, torch) to keep that copy before every step, or lower the "
            "batch size."
        ) from error

    # -- a job of several processes ----------------------------------------------------------
    def _agree(self, runner, batch, n: int, k: int, state) -> Agreement:
        """Rehearses ``n`` as ``k`` on this process, then agrees with every other process whether it fits anywhere.

        Called before each guarded attempt (a new batch shape or split, a regrow
        trial), which every process reaches at the same step with the same
        ``n`` and ``k``: one gather through the job's key-value store per such
        attempt, never per step.
        """
        error = None
        rehearse = getattr(runner, "rehearse", None)
        if rehearse is not None:
            try:
                rehearse(batch, n, k, state)
            except Exception as e:
                if not backends.is_oom(e):
                    logger.debug("keras_gpu_tools: the rehearsal failed", exc_info=True)
                    self.warnings(
                        "rehearsal",
                        f"OOMBatchSizeReducer: rehearsing a split on this process failed ({type(e).__name__}: "
                        f"{str(e)[:200]}); such attempts run unrehearsed, so an out-of-memory error on one process "
                        "alone cannot be retried.",
                    )
                else:
                    error = e
        if self._agree_scope is None:
            _EVAL_SERIAL[(self.run_name, self._scope_kind)] += 1
            self._agree_scope = f"{self._scope_kind}{_EVAL_SERIAL[(self.run_name, self._scope_kind)]}"
        self._agreements += 1
        first_line = (str(error).strip().splitlines() or [""])[0][:300] if error is not None else ""
        mine = {"n": n, "k": k, "oom": error is not None, "error": first_line}
        key = f"{self.run_name}/{self._agree_scope}/agree{self._agreements}"
        try:
            votes = self.topology.exchange.gather(key, mine, self.agreement_timeout_s)
        except ExchangeError as e:
            self._end_fit(aborted=True)
            raise RuntimeError(
                f"OOMBatchSizeReducer: the processes of the job could not agree on the split of a batch of {n} ({e}). "
                "Running it without agreement could leave processes waiting in the step's collective for good, so "
                "training stops here."
            ) from error
        if any((v["n"], v["k"]) != (n, k) for v in votes):
            self._end_fit(aborted=True)
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
            f"{describe_split(n, k, self._replicas)} ({votes[failed[0]]['error']}); every process retries the same split"
        )
        explanation = None
        try:
            if error is not None:
                explanation = self._explain(error, {"runner": runner, "batch": batch, "n": n, "k": k, "state": state})
            if explanation is None:
                explanation = explanation_of(None).as_dict()
            explanation["notes"] = [note] + list(explanation.get("notes") or [])
            explanation["lines"] = OOMExplanation.from_dict(explanation).lines()
        except Exception:
            logger.debug("keras_gpu_tools: explaining an agreed out-of-memory error failed", exc_info=True)
            explanation = {"notes": [note], "lines": [note]}
        kind = (backends.oom_kind(error) or "agreed") if error is not None else "agreed"
        return Agreement(fits=False, error=error, kind=kind, note=note, explanation=explanation)

    # -- why memory ran out -------------------------------------------------------------
    def _explain(self, error: BaseException | None, context: dict) -> dict | None:
        """The explanation of one out-of-memory error (or predicted failure), while its memory is still held."""
        context = dict(context, files=self._writer is not None)
        figures, artifacts = self.backend.explain_oom(error, context)
        explanation = explanation_of(error, **figures)
        self._artifacts = artifacts
        return explanation.as_dict()

    def _record_unrecoverable(self, error: BaseException, signature, phase: str, step: int | None = None) -> None:
        """An out-of-memory error that is not retried is recorded (and explained) like the others."""
        batch_size = next((shape[0] for shape, _ in signature if shape), 0) if signature else 0
        try:
            explanation = self._explain(error, {"phase": phase})
        except Exception:
            explanation = None
        self._on_event(
            OOMEvent(
                step=self._global_step if step is None else step,
                batch_size=int(batch_size or 0),
                failed_split=1,
                next_split=None,
                kind=backends.oom_kind(error) or "unknown",
                phase=phase,
                explanation=explanation,
            )
        )

    def _write_event_files(self, event: OOMEvent) -> None:
        """A file per event under ``run_dir/oom_events``: the explanation (text and JSON) and what the backend gave."""
        artifacts, self._artifacts = self._artifacts, {}
        if self.run_dir is None or event.explanation is None:
            return
        folder = os.path.join(self.run_dir, schema.OOM_EVENTS_DIR)
        try:
            os.makedirs(folder, exist_ok=True)
            base = os.path.join(folder, f"{event.phase}_step{event.step}_{len(self.events)}")
            files = []
            for suffix, data in artifacts.items():
                with open(f"{base}_{suffix}", "wb") as f:
                    f.write(data)
                files.append(f"{base}_{suffix}")
            event.explanation["files"] = [f"{base}.txt", f"{base}.json"] + files
            event.explanation["lines"] = OOMExplanation.from_dict(event.explanation).lines()
            with open(f"{base}.txt", "w") as f:
                f.write(event.line() + "\n" + "\n".join(event.why()) + "\n")
            with open(f"{base}.json", "w") as f:
                json.dump(to_plain(event), f, indent=1)
        except OSError as e:
            self.warnings("event-files", f"OOMBatchSizeReducer: could not write {folder}: {e}")

    # -- headroom ----------------------------------------------------------------------------
    def _record_peak(self) -> None:
        """The allocator's peak per device against its capacity (what the report shows as headroom)."""
        try:
            peaks = self.backend.device_peaks()
        except Exception:
            peaks = {}
        for i, (peak, capacity) in peaks.items():
            old = self._peak.get(i, (0.0, None))
            self._peak[i] = (max(old[0], peak), capacity or old[1])

    def headroom(self) -> list[dict[str, Any]]:
        """Per device: the allocator's peak in this run, the capacity, and the batch that would fit.

        ``fits_batch`` is the plan's batch size where a plan was given, else a
        linear estimate from the peak at the micro-batch size in use (the
        memory grows with the batch; the state does not), marked ``estimate``.
        """
        self._record_peak()
        out = []
        size = self.controller.micro_size or self._last_batch
        for i, (peak, capacity) in sorted(self._peak.items()):
            row: dict[str, Any] = {"device": i, "peak_bytes": int(peak), "capacity_bytes": capacity}
            if self.max_micro_batch_size:
                row["fits_batch"], row["fits_from"] = self.max_micro_batch_size, "plan"
            elif capacity and size and peak > 0:
                state = float(getattr(self._runner, "state_bytes", 0) or 0)
                per_sample = max(1.0, (peak - state) / size)
                row["fits_batch"] = max(0, int((0.9 * capacity - state) // per_sample))
                row["fits_from"] = "estimate (linear in the batch, 10% margin)"
            out.append(row)
        return out

    # -- internals ------------------------------------------------------------------------
    def _check_late_error(self) -> None:
        """A JAX out-of-memory error can surface when outputs are read; never let it pass silently."""
        e = self.backend.check_late_error(self.model)
        if e is None:
            return
        if backends.is_oom(e):
            self._end_fit(aborted=True)
            raise UnrecoverableOOM(
                "OOMBatchSizeReducer: an out-of-memory error of a JAX step surfaced only when its results were "
                "read (asynchronous dispatch), after the step's donated state was gone; it cannot be retried. "
                "Use `probe=True`, or lower the batch size."
            ) from e
        raise e

    def _memory(self):
        return self.backend.device_memory()

    def _on_event(self, event: OOMEvent) -> None:
        self._write_event_files(event)
        self.events.append(event)
        self.recovery_seconds += event.seconds
        self._epoch_events += 1
        line = f"OOMBatchSizeReducer: {event.line()}"
        why = event.why()
        if why:
            line += "\n  " + "\n  ".join(why)
        logger.warning(line)
        if self.verbose:
            print(line)
        if event.phase == "train" and self.mode == "accumulate" and (event.next_split or 1) > 1:
            self._warn_batch_statistics()
        if self._writer is not None:
            values = {schema.OOM_EVENTS_TOTAL: float(len(self.events))}
            if event.next_split is not None:
                values[schema.OOM_MICRO_BATCHES] = float(event.next_split)
            self._writer.scalars(values, step=event.step)
            self._writer.json(schema.OOM_EVENTS_DATA, event, step=event.step)  # for report()
            if why:
                self._writer.text(schema.OOM_EXPLANATION, event.line() + "\n\n" + "\n\n".join(why), step=event.step)

    def _warn_batch_statistics(self) -> None:
        model = self._model_ref
        layers = ki.all_layers(model) if model is not None else []
        if any(
            getattr(layer, "_keras_gpu_tools_batch_statistics", False) or _has_batch_statistics(layer)
            for layer in layers
        ):
            self.warnings(
                "batchnorm",
                "OOMBatchSizeReducer: the model normalises by batch statistics (BatchNormalization): each "
                "micro-batch is normalised by its own, and the moving averages update once per micro-batch, so "
                "accumulate mode is not the unsplit batch there. Use GroupNormalization or LayerNormalization "
                "where that matters.",
            )

    def summary(self) -> str:
        """One line per recovery (and why, where known), the split in use, and the headroom."""
        headroom = [f"OOMBatchSizeReducer: headroom: {h}" for h in headroom_lines(self.headroom())]
        if not self.events:
            return "\n".join(["OOMBatchSizeReducer: no out-of-memory error."] + headroom)
        lines = []
        for e in self.events:
            lines.append(f"OOMBatchSizeReducer: {e.line()}")
            lines.extend(f"  {w}" for w in e.why())
        lines += headroom
        size = self.micro_batch_size
        lines.append(
            f"OOMBatchSizeReducer: {len(self.events)} recovery(ies), {format_seconds(self.recovery_seconds)} in failed attempts; "
            f"micro-batches of {size if size else 'the whole batch'} now."
        )
        return "\n".join(lines)

    def _stop_fit(self, aborted: bool) -> None:
        for kind in list(self._eval):
            self._detach_eval(kind)  # validation that raised never reached on_test_end
        if self.record_memory_history:
            self.backend.stop_memory_history()
        try:
            headroom = self.headroom()
        except Exception:  # the teardown never fails for a figure
            logger.debug("keras_gpu_tools: headroom failed", exc_info=True)
            headroom = []
        if self._writer is not None and headroom:
            self._writer.json(schema.OOM_HEADROOM_DATA, headroom, step=self._global_step)  # for report()
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            attachment.detach()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        self._runner = None
        self._idle.reset(None)


def _has_batch_statistics(layer) -> bool:
    import keras

    return isinstance(layer, keras.layers.BatchNormalization)


def _uneven_share(model, devices: int) -> str | None:
    """Why fit()'s batches cannot be spread evenly over this process's ``devices`` data-parallel devices, or None.

    Read from fit()'s arguments before the first step (where fit() was given
    arrays): Keras would fail at that batch otherwise, mid-epoch for the last one.
    """
    if devices <= 1:
        return None
    args = ki.fit_locals(model)
    batch_size = args.get("batch_size")
    if not isinstance(batch_size, int) or batch_size < 1:
        return None
    where = f"the {devices} data-parallel devices of this process"

    def near(n: int) -> str:
        low, high = n - n % devices, n - n % devices + devices
        return f"{low} or {high}" if low else str(high)

    if batch_size % devices:
        return (
            f"OOMBatchSizeReducer: batch_size={batch_size} cannot be spread over {where}: each device takes an "
            f"equal share of every batch (and of every micro-batch), so the batch size must be a multiple of "
            f"{devices} ({near(batch_size)} would work)."
        )
    samples = leading_dim(args.get("x")) if args.get("x") is not None else None
    if samples and not args.get("steps_per_epoch") and samples % batch_size % devices:
        last = samples % batch_size
        return (
            f"OOMBatchSizeReducer: the last batch of each epoch holds {last} samples ({samples} samples in batches of "
            f"{batch_size}), which cannot be spread over {where}: each device takes an equal share, so every batch "
            f"must hold a multiple of {devices} samples. Use a number of samples that leaves a multiple of {devices} "
            f"(such as {samples - last + (last - last % devices)}), or a dataset that drops the remainder."
        )
    return None


def _planned_size(plan) -> int | None:
    """The largest micro-batch a plan allows: a `BatchPlan`'s `batch_size`, or an int."""
    if plan is None:
        return None
    if hasattr(plan, "batch_size"):
        return check_int("plan.batch_size", plan.batch_size, low=1)
    return check_int("plan", plan, low=1)


__all__ = ["OOMBatchSizeReducer"]
