"""InputBoundDetector: a measured verdict on whether the input pipeline starves the GPU."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import InputPipelineWarning, KerasInternalsError
from keras_gpu_tools.input import flops as step_flops
from keras_gpu_tools.input import schedule
from keras_gpu_tools.input.breakdown_run import BreakdownRun
from keras_gpu_tools.input.brief import epoch_lines, fit_lines
from keras_gpu_tools.input.categories import UNKNOWN
from keras_gpu_tools.input.fit import FitViews, InputFit
from keras_gpu_tools.input.job import JobExchange
from keras_gpu_tools.input.summary import run_summary, write_epoch_later, write_fit
from keras_gpu_tools.input.timing import BatchSizes, StepStats
from keras_gpu_tools.input.verdict import Judge, validate_thresholds
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import roles
from keras_gpu_tools.runtime import validation as check
from keras_gpu_tools.runtime.step_hook import Attachment, StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.typing_compat import override
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry.cpu_meter import CpuMeter

logger = logging.getLogger("keras_gpu_tools")


class InputBoundDetector(FitViews, FitCallback, roles.InputVerdicts, roles.InputThresholds):
    """Measures, while training runs, whether the input pipeline starves the device.

    For every training step it splits the time into waiting for the next batch
    (the iterator's `next()`), computing the step on the device, and the rest
    (callbacks, Python), through a hook on `model.train_function` for the
    duration of `fit()`. Only every `sample_every`-th step is synced to time
    its compute (a sync removes the overlap of input and compute); the others
    run untouched and give the real step rate. The wait that counts is the
    part of the fetch the device could not hide, `min(fetch, step - compute)`.
    What is trained never changes: the same batches, in the same order.

    The verdict uses the thresholds of TensorBoard's input-pipeline analyzer
    (xprof): waiting for input at least 20% of step time is "highly input-bound",
    at least 5% "moderately", else "not input-bound", per window of `window` steps, per epoch
    and for the run (`verdict`, `summary()`), each naming its span (`verdict.span`: "steps 21-25").

    The run's verdict describes its steady state: leading epochs (or, in a
    fit of one epoch, windows) unlike the ones after them (warm-up, a
    `.cache()` that fills, workers that start) are left out and named.
    `verdict.scope` says what the figures cover, `verdict.phases` lists every
    epoch, `detector.measurement` holds the steady state's figures and
    `fit_measurement` the whole fit's; `verdict.speedup_bound` is what
    removing the wait is worth at most. Spans are time-weighted sums of
    their windows (`input/steps` is the weight), so all the figures add up.

    `detector.breakdown` names the largest part and what fits it (in `summary()`).

    The verdict, `summary()`, the breakdown, the report and TensorBoard read one step time, rate
    and wait share for the same steps; the host's fetch time is in `summary()`'s table. Each tip
    of the advice says which part of the wait it addresses. FLOPs are counted by the backend once per fit (`flops_source` says how) or given as
    `flops_per_step`, the peak from a table of NVIDIA GPUs or `peak_flops` (times the step's devices).

    In a job of several processes each writes its own run,
    ``log_dir/<run_name>/process_<i>``; at each epoch end they exchange their
    figures once, and every process's epoch logs get the same job-wide keys.
    Process 0 also writes them, with the job verdict (`detector.job_verdict`: a straggler
    and, with a `GPUUtilizationLogger` in each process, its GPU's cause), to the run `log_dir/<run_name>/job`.

    On TensorFlow the fetch is timed on sampled steps only (steps under ~3 ms
    may read a few percent high), per execution with `steps_per_execution`.

    Logged keys (History, CSVLogger, TensorBoard): docs/keys.md.

    Args:
        window: steps per window verdict and TensorBoard point; a window
            ends with its epoch, and holds at least one synced step.
            Defaults to `100`.
        sample_every: sync and time in full every `sample_every`-th step
            (and steps 2 to 4 of each fit, and the last step of each epoch).
            A sync costs about a millisecond of lost overlap on a GPU.
            Defaults to `400`.
        moderate_threshold: wait fraction from which a run is moderately
            input-bound. Defaults to `0.05`.
        high_threshold: wait fraction from which a run is highly
            input-bound. Defaults to `0.2`.
        log_dir: directory of the TensorBoard logs, or None for no
            TensorBoard output. Defaults to `"logs"`.
        run_name: name of the TensorBoard run under `log_dir`. Defaults to `"input"`.
        verbose: 0 prints nothing; 1 the verdict and where the details are,
            at the end of `fit()`; 2 also a line per epoch. Defaults to `1`.
        gpu_logger: the `GPUUtilizationLogger` whose figures to quote;
            `"auto"` finds one among the callbacks of the same `fit()` call;
            None uses none. Defaults to `"auto"`.
        epoch_logs: whether to add the epoch figures to `logs`. Defaults to
            `True`.
        progress_bar: which of them Keras's progress bar shows: `"brief"`
            (`input/wait_fraction`), `"all"` or `"none"`. Defaults to `"none"`.
        flops_per_step: FLOPs of one training step over its global batch
            (None: counted by the backend). Defaults to `None`.
        peak_flops: ONE device's peak FLOP/s (None: from the table, for
            NVIDIA GPUs). MFU divides by it times the number of devices that
            run the step. Defaults to `None`.

    Example:

    ```python
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector

    detector = InputBoundDetector(log_dir="logs")
    model.fit(dataset, epochs=3, callbacks=[detector])
    print(detector.verdict.category)   # "highly input-bound", ...
    print(detector.verdict.scope)      # "epochs 2-3": the steady state
    print(detector.summary())          # figures, phases and what to change
    ```
    """

    def __init__(
        self,
        window: int = 100,
        sample_every: int = 400,
        moderate_threshold: float = 0.05,
        high_threshold: float = 0.2,
        log_dir: str | os.PathLike | None = "logs",
        run_name: str = "input",
        verbose: int = 1,
        gpu_logger: Any = "auto",
        epoch_logs: bool = True,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        progress_bar: str = "none",
    ):
        super().__init__()
        self.window = check.check_int("window", window, low=1)
        self.sample_every = check.check_int("sample_every", sample_every, low=1)
        validate_thresholds(moderate_threshold, high_threshold)
        self.moderate_threshold, self.high_threshold = float(moderate_threshold), float(high_threshold)
        self.flops_per_step = check.check_number(
            "flops_per_step", flops_per_step, low=0, exclusive_low=True, allow_none=True
        )
        self.peak_flops = check.check_number("peak_flops", peak_flops, low=0, exclusive_low=True, allow_none=True)
        self.run_name = check.check_run_name("run_name", run_name)
        self.verbose = check.check_verbose("verbose", verbose, max_level=2)
        self.progress_bar = progress_bar  # checked by the base class
        if not (gpu_logger is None or gpu_logger == "auto" or isinstance(gpu_logger, roles.GPUTimeline)):
            raise TypeError(
                "Invalid value for argument `gpu_logger`. "
                f"Received: gpu_logger={gpu_logger!r}. Expected a GPUUtilizationLogger, 'auto' or None."
            )
        self.gpu_logger = gpu_logger
        self.epoch_logs = check.check_bool("epoch_logs", epoch_logs)
        self.log_dir = check.check_log_dir("log_dir", log_dir)
        check.check_run_dir(self.log_dir, self.run_name)
        self.warnings = WarnOnce(InputPipelineWarning)
        self.epoch_history: list[dict[str, float]] = []
        self.pipeline: dict[str, Any] = {}
        self.notes: list[str] = []
        self.flops_source: str | None = "flops_per_step" if flops_per_step else None
        self._fit = InputFit()  # the last fit's analysis
        self._steps: BreakdownRun | None = None  # the last fit's step breakdown
        self._running = False
        self._attachment: Attachment | None = None
        self._batches = BatchSizes()  # the fit's, shared by its windows
        self._window = StepStats(self._batches)
        self._window_t0 = self._epoch_t0 = time.time()
        self._gpu_logger = self._step_specs = None
        self._cpu = CpuMeter()  # made again for each fit
        self._epoch_first_call = self._epoch_last_call = -1

    @property
    def breakdown(self):
        """The last fit's step breakdown (:class:`~keras_gpu_tools.input.breakdown_advice.FitBreakdown`), or None."""
        return self._steps.result(self._fit.steady_epochs()) if self._steps is not None else None

    def summary(self) -> str:
        """A report of the last fit(): verdict, figures, phases, evidence, advice, and the step breakdown."""
        return run_summary(self._fit, self.notes, self.breakdown)

    # -- step observer (called by the step hook, on the training thread) ------------------
    def sample(self, index: int) -> bool:  # see input/schedule.py
        return schedule.sampled(index, self.sample_every, self._epoch_last_call)

    def next_sample(self, index: int) -> int:
        return schedule.next_sampled(index, self.sample_every, self._epoch_first_call, self._epoch_last_call)

    def next_fetch(self, index: int) -> int:
        return schedule.next_fetched(index)

    def on_step(self, rec: StepRecord) -> None:
        self._global_step += rec.steps + rec.covers
        self._window.add(rec)
        self._steps.add(rec)  # type: ignore[union-attr]  # (set before the hook is attached)
        if self._step_specs is None and "step_args" in rec.extra:
            self._step_specs = self.backend.shape_specs(rec.extra["step_args"])
            if self._attachment is not None:
                self._attachment.hook.capture_args = False
        # A window needs a synced step: without one its compute (and on TensorFlow its fetch) is unknown.
        if self._window.steps >= self.window and self._window.sampled_steps:
            self._close_window()

    def on_detach(self, stale: bool) -> None:
        if stale:
            logger.debug("InputBoundDetector: hook of an earlier fit() removed")

    # -- Keras hooks -----------------------------------------------------------------------
    @override
    def _start_fit(self, session) -> None:
        self.notes, self._step_specs = [], None
        self._batches = BatchSizes()
        self._window, self._window_t0 = StepStats(self._batches), time.time()
        self._cpu = CpuMeter(session.every)  # its looks for worker processes: on the session's thread
        self.pipeline = ki.describe_pipeline(self.model)
        self._gpu_logger = self._find_gpu_logger()
        gpu = step_flops.trains_on_gpu(self.backend)  # advice about the GPU is left out where none trains
        context = {"gpu": gpu, "cores": os.cpu_count() or 1, "epochs": (self.params or {}).get("epochs")}
        judge = Judge(self.moderate_threshold, self.high_threshold, self.pipeline, context, self._gpu_logger)
        devices = max(int(self.topology.devices_in_step or 1), 1)
        dtype = self.model.dtype_policy.compute_dtype
        peak, gather = self.peak_flops or step_flops.table_peak(self.backend, dtype, self.warnings), self._job_gather()
        exchange = JobExchange(gather, devices, self._job_events, session.shared) if gather.active else None
        self._fit = InputFit(judge, self.flops_per_step, peak, devices, exchange, self._job_failed)
        self._steps = BreakdownRun(self.backend, self.model, devices, self.warnings)
        spe = ki.steps_per_execution(self.model)
        note = self.backend.execution_note(spe) if spe > 1 else None
        if note:
            self.notes.append(note)
        self._open_writers(job=gather.active, session=session)  # its events written off the training thread
        self._running = True
        try:  # last: nothing can fail after the hook is in place
            self._attachment = StepHook.attach(self.model, self, self.backend, session)
            self._attachment.hook.capture_args = self.backend.traced_flops and self._fit.flops is None
        except KerasInternalsError as e:
            self.warnings("internals", f"InputBoundDetector is off for this fit(): {e}")
            self._attachment = None

    @override
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._fit.spans.windows = []
        self._window = StepStats(self._batches)  # (empty: the last epoch closed its windows)
        self._epoch_t0 = self._window_t0 = time.time()
        self._cpu.restart()  # the epoch's CPU use
        att, steps = self._attachment, (self.params or {}).get("steps")
        if att is None or not att.active:
            self._epoch_first_call = self._epoch_last_call = -1
            return
        self._epoch_first_call, self._epoch_last_call = schedule.epoch_calls(
            att.hook.next_index, steps, att.hook.steps_per_execution
        )
        att.hook.reschedule()

    @override
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._running:
            return
        self._flush_hook()
        window = self._close_window(write=False)  # the epoch's last window, however short; written below
        fit = self._fit
        fit.judge.host = self._cpu.read()
        if fit.flops is None and self._step_specs is not None and self._attachment is not None:
            specs, self._step_specs, original = self._step_specs, None, self._attachment.hook.original  # once a fit
            fit.flops, source = step_flops.step_flops(self.backend, original, specs, self.warnings)
            self.flops_source = source or self.flops_source
        end = fit.end_epoch(epoch, self._epoch_t0, self._global_step)
        steps = self._steps.end_epoch(end.measurement, end.logs) if self._steps is not None else {}
        self.epoch_history.append(end.logs)
        if self.epoch_logs:
            self._epoch_figures(end.logs, logs, brief=schema.INPUT_WAIT_FRACTION)
        if self._writer is not None:  # the last window and the step breakdown (one event), the verdict
            scalars, scope = {**window, **steps}, f"epoch {epoch + 1}"
            write_epoch_later(self._writer, scalars, scope, end, fit.job_verdict, self._global_step)
        if self.verbose > 1:  # under the epoch's progress bar line
            self._print(*epoch_lines(end.verdict, end.measurement, fit.job_verdict))

    @override
    def on_train_end(self, logs: dict | None = None) -> None:
        if not self._running:
            return
        self._flush_hook()
        self._close_window()
        self._fit.update(final=True)
        fb = self.breakdown
        if self._writer is not None and self.verdict is not None:
            write_fit(self._writer, self._fit, self.notes, self._global_step, fb)
        if self.verbose and self.verdict is not None:  # two lines: the whole report is summary()'s
            self._print(*fit_lines(self.verdict, self.measurement, self.run_dir, self.log_dir, fb))
        super().on_train_end(logs)

    def _flush_hook(self) -> None:
        att = self._attachment
        if att is not None and att.active:
            att.hook.flush()

    def _close_window(self, write: bool = True) -> dict[str, float]:
        w, self._window = self._window, StepStats(self._batches)
        t0, self._window_t0 = self._window_t0, time.time()
        m = self._fit.close_window(w, t0, self._global_step) if w.steps else None
        if write and m is not None and self._writer is not None:
            self._writer.scalars_later(m.logs(), step=self._global_step)
        return m.logs() if m is not None and not write else {}

    def _find_gpu_logger(self):
        if self.gpu_logger != "auto":
            return self.gpu_logger
        from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger

        return next((cb for cb in ki.find_callback_list(self.model) if isinstance(cb, GPUUtilizationLogger)), None)

    @override
    def _stop_fit(self, aborted: bool) -> None:
        self._running = False
        att, self._attachment = self._attachment, None
        if att is not None:
            att.detach()
        self._close_writers()

    def __repr__(self) -> str:
        cat = self.verdict.category if self.verdict else UNKNOWN
        return f"InputBoundDetector(window={self.window}, sample_every={self.sample_every}, verdict={cat!r})"
