"""InputBoundDetector: a measured verdict on whether the input pipeline starves the GPU."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import InputPipelineWarning, KerasInternalsError
from keras_gpu_tools.input import stragglers
from keras_gpu_tools.input.timing import (
    UNKNOWN,
    Measurement,
    Phase,
    StepStats,
    Verdict,
    aggregate,
    span_label,
    steady_start,
    summary_text,
    validate_thresholds,
    verdict_for,
    warmup_reason,
)
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter, to_plain
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.step_hook import Attachment, StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.validation import (
    check_bool,
    check_int,
    check_log_dir,
    check_number,
    check_run_dir,
    check_run_name,
    check_verbose,
)
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry import peaks as gpu_peaks
from keras_gpu_tools.telemetry.cpu_meter import CpuMeter

logger = logging.getLogger("keras_gpu_tools")

FETCH_EVERY = 25  # an unsynced call in this many has its fetch timed (JAX, torch)


class _Span:
    """An epoch (or a window) of the fit: its figures, when it began, and the windows it is made of."""

    __slots__ = ("label", "measurement", "t0", "parts")

    def __init__(self, label: str, measurement: Measurement, t0: float, parts: list[_Span] | None = None):
        self.label, self.measurement, self.t0, self.parts = label, measurement, t0, parts or []


class InputBoundDetector(FitCallback):
    """Measures, while training runs, whether the input pipeline starves the device.

    For every training step it splits the time into waiting for the next batch
    (host side, the iterator's `next()`), computing the step on the device, and
    the rest (callbacks, Python). It hooks `model.train_function` for the
    duration of `fit()` (one shared hook, restored afterwards, also after a
    fit that raised). Computing time needs a device sync, which would remove
    the overlap of input and compute that fast pipelines rely on, so only
    every `sample_every`-th step is synced; the others run untouched and give
    the real step rate.

    The verdict uses the thresholds of TensorBoard's input-pipeline analyzer
    (xprof): at least 20% of step time waiting for input is "highly
    input-bound", at least 5% "moderately input-bound", else "not
    input-bound". It is given per window of `window` steps (TensorBoard), per
    epoch (printed when `verbose`, and in TensorBoard's text tab) and for the
    run (`detector.verdict`, `detector.summary()`, printed at the end).

    The run's verdict describes its steady state: leading epochs unlike the
    epochs after them (warm-up, a `.cache()` that fills, workers that start)
    are left out of it and named, with their own figures ("Left out: epoch 1,
    which waited 30.5% while the cache filled; since then 6.9-14.5% per
    epoch."). Unlike means steps more than 50% slower than the median of the
    epochs after it and a wait share 10 points or more apart from theirs, or
    steps more than twice as slow (less is the noise of a busy host). A fit
    of one epoch is split the same way into its windows. `verdict.scope` says
    what the figures cover, `verdict.phases` lists every epoch (or window)
    and whether it is in the verdict, `detector.measurement` holds the steady
    state's figures and `detector.fit_measurement` the whole fit's. The
    verdict says what removing the wait is worth: at most
    `1 / (1 - wait_fraction)` times faster (`verdict.speedup_bound`).

    One set of figures, aggregated one way: only windows are measured from
    the steps; an epoch is its windows, the steady state and the whole fit
    are their epochs, each part weighing the time of its steps
    (`steps x step time`): `wait_fraction = sum(steps * wait_ms) /
    sum(steps * step_ms)`, with `input/steps` as each one's weight. Per-step
    times are means over steps, rates are counts over seconds, and a part
    where a figure is unknown is left out of that figure (never counted as
    0). So the epoch logs, the TensorBoard points and the report add up to
    the headline. Compute is at most the real step less its wait (a synced
    step can take longer than an unsynced one), so
    `wait + compute + other = step`.

    The advice fits the pipeline as it runs (tf.data transformations and
    which of them run once a `.cache()` serves, PyDataset workers, DataLoader
    workers, arrays, the host CPU this process uses, whether a GPU trains),
    and each tip says which part of the measured wait it addresses. When a
    `GPUUtilizationLogger` runs in the same fit, its GPU utilization over the
    same period is quoted as evidence.

    Logged keys (per epoch into `logs`; per window to TensorBoard in the run
    `log_dir/<run_name>` on the global step axis). A figure that cannot be
    measured is left out, never logged as 0:

    | key | unit | meaning |
    |---|---|---|
    | `input/steps` | steps | training steps the figures cover (their weight when adding up) |
    | `input/wait_fraction` | 0..1 | share of the step time spent waiting for input |
    | `input/wait_ms` | ms | waiting for input per step (the part compute did not hide) |
    | `input/fetch_ms` | ms | host time in the iterator's `next()` per step |
    | `input/compute_ms` | ms | step compute on the device (median of synced steps) |
    | `input/other_ms` | ms | the rest: callbacks, Python, dispatch |
    | `input/step_ms` | ms | time per training step |
    | `throughput/steps_per_sec` | 1/s | training steps per second |
    | `throughput/samples_per_sec` | 1/s | examples per second |
    | `throughput/flops_per_sec` | FLOP/s | achieved by the step, every device of it together, where the FLOPs are known |
    | `throughput/flops_per_sec_per_device` | FLOP/s | the same per device that runs the step |
    | `throughput/mfu` | 0..1 | model FLOPs utilization: against the summed dense peaks of the step's devices |

    FLOPs come from XLA's cost analysis of the step on JAX (its HLO, computed
    once per fit at the first epoch end; where the installed JAX offers no
    such analysis, the matmul and convolution FLOPs of the step's jaxpr;
    `flops_source` says which), or from `flops_per_step`; the peak from a
    table of NVIDIA GPUs by NVML name and compute dtype (or from
    `peak_flops`). MFU is left out where either is unknown (TensorFlow and
    torch report no FLOPs by themselves).

    Several devices: the FLOPs are the whole step's (XLA counts the global,
    un-partitioned step, every device's share of it; in a job of several
    processes the same count as one process with the same global batch), and
    MFU divides the achieved FLOP/s by the peaks of all the devices that run
    the step (``topology.devices_in_step``): one device's peak times their
    number, or, where the processes of a job report different peaks, the sum
    of each process's share, gathered once at the first epoch end.

    A job of several processes (``keras.distribution.initialize``): each
    process writes its own run, ``log_dir/<run_name>/process_<i>``. At each
    epoch end the processes exchange their figures once over the job's
    channel, and every process's epoch logs get the same job-wide keys:

    | key | unit | meaning |
    |---|---|---|
    | `job/step_ms_max` | ms | the slowest process's step time |
    | `job/step_ms_slowest_process` | index | which process that is |
    | `job/input_wait_fraction_max` | 0..1 | the highest input wait share |
    | `job/input_wait_process` | index | which process that is |
    | `job/samples_per_sec` | 1/s | the job's examples per second (every process's summed) |

    Process 0 also writes them, with the job verdict as text, to the run
    `log_dir/<run_name>/job`. `detector.job_verdict` (and the end of
    `summary()`) gives every process's steady-state figures and names a
    straggler: a process whose input wait share is 10 points or more above
    the median of the others' and at least twice it, or whose step is over
    1.25x the others' median and 1 ms or more longer; with advice for that
    process (its own pipeline's tips). Under synchronous data parallelism the
    others wait for it in the all-reduce, so their steps are slow too, but
    their wait is not in their input. A failing channel leaves the job's
    figures out (a warning, once); training goes on.

    How the step is split: the wait that counts is the part of the fetch the
    device could not hide, `min(fetch, step - compute)`, where `step` is the
    real rate of the unsynced steps; where input and compute run one after
    the other this is the whole fetch. On TensorFlow the Python fetch of a
    sampled step costs ~0.1 ms more than Keras's in-graph fetch (a fixed part
    is measured and subtracted), so steps under ~3 ms may read a few percent
    high there.

    Per backend: the fetch is timed on sampled steps and, unsynced, on one
    step in 25 on JAX and torch, and on sampled steps only on TensorFlow,
    where a sampled step pulls its batch in Python and runs Keras's per-batch
    step function (traced once more, the first time). With `steps_per_execution=N` on TensorFlow, a sampled
    execution pulls its N batches and runs them one call each, so it is
    measured per execution and its compute includes the per-step dispatch that
    the compiled N-step loop avoids; the summary says so. The detector never
    changes what is trained: the same batches, in the same order, the same
    number of steps.

    Args:
        window: steps per window verdict and TensorBoard point. A window
            ends at the end of each epoch, and holds at least one step timed
            with a sync (with `window` < `sample_every`, points come every
            `sample_every` steps). Defaults to `100`.
        sample_every: sync and time in full every `sample_every`-th step
            (and steps 2 to 4 of each fit, and the last step of each
            epoch, whose sync closes the epoch's timing). A synced step
            empties the device's queue, which costs about a millisecond of
            lost overlap on a GPU; at the default that is under 0.5% of a
            1 ms step (measured on an H200). Of the other steps, one in 25
            has its fetch timed without a sync (JAX, torch); the rest run
            Keras's step untouched, with a counter. Defaults to `400`.
        moderate_threshold: wait fraction from which a run is moderately
            input-bound. Defaults to `0.05`.
        high_threshold: wait fraction from which a run is highly
            input-bound. Defaults to `0.2`.
        log_dir: directory of the TensorBoard logs (the same as Keras's
            `TensorBoard` callback), or None for no TensorBoard output.
            Defaults to `"logs"`.
        run_name: name of the TensorBoard run under `log_dir`. Defaults to
            `"input"`.
        verbose: 1 prints a line per epoch and the report at the end of
            training; 0 prints nothing. Defaults to `1`.
        gpu_logger: the `GPUUtilizationLogger` whose figures to quote;
            `"auto"` finds one among the callbacks of the same `fit()` call
            (by reading fit()'s callback list); None uses none. Defaults to
            `"auto"`.
        epoch_logs: whether to add the epoch figures to `logs`. Defaults to
            `True`.
        flops_per_step: FLOPs of one training step over its whole (global)
            batch, every device's share together, if you know them better
            than the backend (None: XLA cost analysis on JAX). Defaults to
            `None`.
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
    ):
        super().__init__()
        self.window = check_int("window", window, low=1)
        self.sample_every = check_int("sample_every", sample_every, low=1)
        validate_thresholds(moderate_threshold, high_threshold)
        self.moderate_threshold = float(moderate_threshold)
        self.high_threshold = float(high_threshold)
        self.flops_per_step = check_number("flops_per_step", flops_per_step, low=0, exclusive_low=True, allow_none=True)
        self.peak_flops = check_number("peak_flops", peak_flops, low=0, exclusive_low=True, allow_none=True)
        self.run_name = check_run_name("run_name", run_name)
        # 0 or 1: what it prints has one level of detail.
        self.verbose = check_verbose("verbose", verbose, max_level=1)
        if not (gpu_logger is None or gpu_logger == "auto" or hasattr(gpu_logger, "timeline")):
            raise TypeError(
                "Invalid value for argument `gpu_logger`. "
                f"Received: gpu_logger={gpu_logger!r}. Expected a GPUUtilizationLogger, 'auto' or None."
            )
        self.gpu_logger = gpu_logger
        self.epoch_logs = check_bool("epoch_logs", epoch_logs)
        self.log_dir = check_log_dir("log_dir", log_dir)
        check_run_dir(self.log_dir, self.run_name)

        self.warnings = WarnOnce(InputPipelineWarning)
        self.verdict: Verdict | None = None
        self.measurement: Measurement | None = None  # the steady state's figures (the verdict's scope)
        self.fit_measurement: Measurement | None = None  # the whole fit's, every phase included
        self.epoch_history: list[dict[str, float]] = []
        #: the job's verdict (a job of several processes, after its first epoch end; else None)
        self.job_verdict: stragglers.JobVerdict | None = None
        self.epoch_verdicts: list[Verdict] = []
        self.window_verdicts: list[tuple[int, Verdict]] = []  # (global step, verdict)
        self.pipeline: dict[str, Any] = {}
        self.notes: list[str] = []
        self.flops_source: str | None = "flops_per_step" if flops_per_step else None
        self._running = False
        self._attachment: Attachment | None = None
        self._writer: EventWriter | None = None
        self._window = StepStats()
        self._window_t0 = self._epoch_t0 = time.time()
        self._windows: list[_Span] = []  # the current epoch's
        self._epochs: list[_Span] = []
        self._context: dict[str, Any] = {}
        self._gpu_logger = None
        self._cpu: CpuMeter | None = None
        self._host: dict[str, float] = {}
        self._flops: float | None = None
        self._peak: float | None = None  # the summed peak of the step's devices
        self._peak_device: float | None = None  # one of this process's devices
        self._devices = 1  # devices that run one step
        self._job = None  # the job's channel for this fit (JobGather)
        self._job_writer: EventWriter | None = None
        self._job_run_dir: str | None = None
        self._job_peak_checked = False
        self._job_peak_changed = False
        self._jax_specs = None
        self._epoch_last_call = -1
        self._epoch_first_call = -1

    # -- public -------------------------------------------------------------------------
    def summary(self) -> str:
        """A report of the last fit(): verdict, figures (steady state and whole fit), phases, evidence, advice."""
        if self.verdict is None or self.measurement is None:
            return "InputBoundDetector: no training step measured yet."
        text = summary_text("InputBoundDetector", self.measurement, self.verdict, self.notes, fit=self.fit_measurement)
        if self.job_verdict is not None:
            n = len(self.job_verdict.processes)
            text += f"\n\nThe job ({n} processes; each one's steady state):\n\n" + self.job_verdict.text()
        return text

    # -- step observer (called by the step hook, on the training thread) ------------------
    def sample(self, index: int) -> bool:
        # Steps 2-4 of the fit, every `sample_every`-th, and the last of each
        # epoch: its sync waits for work the framework dispatched ahead, so
        # the measured step intervals add up to the real wall time.
        return index in (1, 2, 3) or (index > 0 and index % self.sample_every == 0) or index == self._epoch_last_call

    def next_sample(self, index: int) -> int:
        """The next call the hook must sync and time in full: a sampled one, or the first or last of an epoch."""
        every = self.sample_every
        nxt = index if index % every == 0 and index > 0 else index + every - index % every
        for k in (1, 2, 3, self._epoch_first_call, self._epoch_last_call):
            if index <= k < nxt:
                nxt = k
        return nxt

    def next_fetch(self, index: int) -> int:
        """The next call whose fetch alone is timed, unsynced (every `FETCH_EVERY`-th; JAX and torch).

        These keep the input wait measured in steady state: the fetch of a
        synced call is flattered by the buffer that refilled while the device
        drained. The hook runs them on its light path (no record of their own).
        """
        f = FETCH_EVERY
        return index if index % f == 0 else index + f - index % f

    def on_step(self, rec: StepRecord) -> None:
        self._global_step += rec.steps + rec.covers
        self._window.add(rec)
        if self._jax_specs is None and rec.sampled and not rec.warmup and "jax_args" in rec.extra:
            self._jax_specs = self._shape_specs(rec.extra["jax_args"])
            if self._attachment is not None:
                self._attachment.hook.capture_args = False
        # A window needs a synced step: without one its compute (and on TensorFlow its fetch) is unknown.
        if self._window.steps >= self.window and self._window.sampled_steps:
            self._close_window()

    def on_detach(self, stale: bool) -> None:
        if stale:
            logger.debug("InputBoundDetector: hook of an earlier fit() removed")

    # -- Keras hooks -----------------------------------------------------------------------
    def _start_fit(self, session) -> None:
        self.verdict = None
        self.measurement = None
        self.fit_measurement = None
        self.epoch_verdicts = []
        self.window_verdicts = []
        self.notes = []
        self.job_verdict = None
        self._window = StepStats()
        self._window_t0 = time.time()
        self._windows = []
        self._epochs = []
        self._jax_specs = None
        self._flops = self.flops_per_step
        self.pipeline = ki.describe_pipeline(self.model)
        self._context = {"gpu": self._trains_on_gpu(), "cores": os.cpu_count() or 1, "epochs": None}
        self._gpu_logger = self._find_gpu_logger()
        self._devices = max(int(self.topology.devices_in_step or 1), 1)
        self._peak_device = self.peak_flops or self._table_peak()
        # Homogeneous devices until the job says otherwise (first epoch end).
        self._peak = self._peak_device * self._devices if self._peak_device else None
        self._job_peak_checked = False
        self._job = self._job_gather(lambda message: self.warnings("job", f"InputBoundDetector: {message}"))
        spe = ki.steps_per_execution(self.model)
        note = self.backend.execution_note(spe) if spe > 1 else None
        if note:
            self.notes.append(note)
        self._writer = EventWriter(self.run_dir) if self.log_dir else None
        self._job_run_dir = self.job_run_dir if self._job.active else None  # opened at its first figures
        self._job_writer = None
        self._running = True
        try:  # last: nothing can fail after the hook is in place
            self._attachment = StepHook.attach(self.model, self, self.backend, session)
            self._attachment.hook.capture_args = self.backend.traced_flops and self._flops is None
        except KerasInternalsError as e:
            self.warnings("internals", f"InputBoundDetector is off for this fit(): {e}")
            self._attachment = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._windows = []
        self._window = StepStats()  # (empty: the last epoch closed its windows)
        self._epoch_t0 = self._window_t0 = time.time()
        self._cpu = CpuMeter()
        steps = (self.params or {}).get("steps")
        att = self._attachment
        self._epoch_first_call = att.hook.next_index if att is not None and att.active else -1
        if steps and att is not None and att.active:
            spe = max(att.hook.steps_per_execution, 1)
            self._epoch_last_call = att.hook.next_index + -(-int(steps) // spe) - 1
        else:
            self._epoch_last_call = -1
        if att is not None and att.active:
            att.hook.reschedule()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._running:
            return
        self._flush_hook()
        self._close_window()  # the epoch's last window, however short: windows never span two epochs
        self._host = self._cpu.read() if self._cpu is not None else {}
        if self._flops is None and self._jax_specs is not None:
            self._flops = self._jax_flops()
        m = aggregate([w.measurement for w in self._windows], self._flops, self._peak, self._devices)
        self._epochs.append(_Span(f"epoch {epoch + 1}", m, self._epoch_t0, self._windows))
        self._windows = []
        scope = f"epoch {epoch + 1}"
        # From this fit's second epoch on, a cache is filled (with `initial_epoch`, Keras's index is no guide).
        v = self._verdict(m, self._epoch_t0, scope=scope, cache_serves=len(self._epochs) > 1)
        self.epoch_verdicts.append(v)
        self._update_overall()
        try:
            job = self._job_figures(epoch, m)  # once per epoch, every process at the same point
        except Exception as e:  # another process's row of another shape: the job's figures, never the training
            self._job.give_up(f"its job figures failed ({type(e).__name__}: {e})")
            self.warnings("job", f"InputBoundDetector: job-wide figures are left out for the rest of this fit(): {e}")
            job = {}
        if self._job_peak_changed:  # MFU against the job's summed peak
            m = self._epochs[-1].measurement = aggregate(
                [w.measurement for w in self._epochs[-1].parts], self._flops, self._peak, self._devices
            )
            self._update_overall()
        values = dict(m.logs(), **job)
        self.epoch_history.append(values)
        if self.epoch_logs and logs is not None:
            logs.update(values)
        if self._writer is not None:
            self._writer.text(schema.INPUT_VERDICT, summary_text(f"Epoch {epoch + 1}", m, v), step=self._global_step)
            record = {"scope": scope, "verdict": v, "measurement": m, "figures": values}
            if self.job_verdict is not None:
                record[schema.JOB] = self.job_verdict
            self._writer.json(schema.INPUT_VERDICT_DATA, record, step=self._global_step)  # for report()
        if self.verbose:
            print(f"InputBoundDetector epoch {epoch + 1}: {v.message}")
            if self.job_verdict is not None and self.job_verdict.stragglers:
                print(f"InputBoundDetector job: {self.job_verdict.message}")

    def on_train_end(self, logs: dict | None = None) -> None:
        if not self._running:
            return
        self._flush_hook()
        self._close_window()
        self._update_overall(final=True)
        if self._writer is not None and self.verdict is not None:
            self._writer.text(schema.INPUT_VERDICT, self.summary(), step=self._global_step)
            m, fit = self.measurement, self.fit_measurement
            data = {
                "scope": "fit",
                "verdict": self.verdict,  # with its scope, phases and speedup bound
                "measurement": m,  # the steady state's figures
                "figures": m.logs(),
                "fit_figures": fit.logs() if fit is not None else {},
                "notes": self.notes,
            }
            if self.job_verdict is not None:
                data[schema.JOB] = self.job_verdict  # as of the last epoch end (no exchange at the end of fit)
            self._writer.json(schema.INPUT_VERDICT_DATA, data, step=self._global_step)  # for report()
        if self.verbose and self.verdict is not None:
            print(self.summary())
        super().on_train_end(logs)

    # -- internals -------------------------------------------------------------------------
    def _flush_hook(self) -> None:
        att = self._attachment
        if att is not None and att.active:
            att.hook.flush()

    def _update_overall(self, final: bool = False) -> None:
        """The run's verdict: its steady state, the phases left out, the whole fit's figures."""
        spans = list(self._epochs)
        if final and self._windows:  # fit() ended inside an epoch: its windows so far
            m = aggregate([w.measurement for w in self._windows], self._flops, self._peak, self._devices)
            spans.append(_Span(f"epoch {len(spans) + 1} (part)", m, self._windows[0].t0, list(self._windows)))
        if not spans:
            return
        # Epochs are the phases; a fit of one epoch is split into its windows.
        units, by_epoch = spans, True
        if len(spans) == 1 and len(spans[0].parts) > 1:
            units, by_epoch = spans[0].parts, False
        k = steady_start([u.measurement for u in units])
        steady = units[k:]
        m = aggregate([u.measurement for u in steady], self._flops, self._peak, self._devices)
        fit = aggregate([s.measurement for s in spans], self._flops, self._peak, self._devices)
        phases = [
            Phase(
                u.label,
                u.measurement.steps,
                u.measurement.wait_fraction,
                u.measurement.step,
                steady=i >= k,
                reason=None if i >= k else warmup_reason(i, by_epoch, self.pipeline),
            )
            for i, u in enumerate(units)
        ]
        scope = span_label([u.label for u in steady]) if k else "the whole fit"
        self.measurement, self.fit_measurement = m, fit
        self.verdict = self._verdict(
            m, steady[0].t0, scope=scope, phases=phases, fit=fit, cache_serves=by_epoch and k > 0
        )

    def _verdict(
        self,
        m: Measurement,
        since: float | None,
        scope: str = "",
        phases: list[Phase] | None = None,
        fit: Measurement | None = None,
        cache_serves: bool = False,
        with_advice: bool = True,
    ) -> Verdict:
        context = dict(self._context, epochs=(self.params or {}).get("epochs"), cache_serves=cache_serves)
        return verdict_for(
            m,
            self.moderate_threshold,
            self.high_threshold,
            gpu_means=self._gpu_means(since),
            pipeline=self.pipeline if with_advice else {"kind": "none"},
            host=self._host if with_advice else {},
            scope=scope,
            phases=phases or (),
            fit=fit,
            context=context,
        )

    def _close_window(self) -> None:
        w, self._window = self._window, StepStats()
        t0, self._window_t0 = self._window_t0, time.time()
        if not w.steps:
            return
        m = w.measurement(self._flops, self._peak, self._devices)
        self._windows.append(_Span(f"steps {self._global_step - w.steps + 1}-{self._global_step}", m, t0))
        if m.wait_fraction is None and m.steps_per_sec is None:
            return
        v = self._verdict(m, t0, with_advice=False)
        v.advice = []
        self.window_verdicts.append((self._global_step, v))
        if self._writer is not None:
            self._writer.scalars(m.logs(), step=self._global_step)

    def _job_figures(self, epoch: int, m: Measurement) -> dict[str, float]:
        """This epoch's job-wide keys, gathered once from every process; the job verdict; {} for one process.

        Every process gets the same list and computes the same keys and
        verdict. At the first epoch end the per-device peaks are compared:
        where processes drive different GPUs, MFU's denominator is their sum.
        """
        self._job_peak_changed = False
        job = self._job
        if job is None or not job.active:
            return {}
        steady, v = self.measurement, self.verdict
        row = stragglers.process_row(
            self.topology.process_index,
            self.topology.host,
            m.logs(),
            steady.logs() if steady is not None else {},
            scope=v.scope if v is not None else "",
            category=v.category if v is not None else UNKNOWN,
            advice=v.advice if v is not None else (),
            peak_flops=None if self._job_peak_checked else self._peak_device,
        )
        # Own row as the others see it (JSON), so every process computes from identical values.
        rows = job.gather(f"epoch{epoch}", json.loads(json.dumps(to_plain(row))))
        if rows is None:
            return {}
        if not self._job_peak_checked:
            self._job_peak_checked = True
            peak = stragglers.job_peak(rows, self._devices)
            if peak != self._peak:
                self._peak, self._job_peak_changed = peak, True
        self.job_verdict = stragglers.job_verdict(rows)
        keys = stragglers.job_logs(rows)
        if self._job_run_dir:
            if self._job_writer is None:
                self._job_writer = EventWriter(self._job_run_dir)
            self._job_writer.scalars(keys, step=self._global_step)
            self._job_writer.text(schema.INPUT_JOB_VERDICT, self.job_verdict.text(), step=self._global_step)
        return keys

    def _find_gpu_logger(self):
        if self.gpu_logger is None:
            return None
        if self.gpu_logger != "auto":
            return self.gpu_logger
        try:
            from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
        except Exception:
            return None
        for cb in ki.find_callback_list(self.model):
            if isinstance(cb, GPUUtilizationLogger):
                return cb
        return None

    def _gpu_means(self, since: float | None) -> dict[str, float]:
        lg = self._gpu_logger
        if lg is None:
            return {}
        try:
            points = list(lg.timeline)
        except Exception:
            return {}
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for wall, _step, means in points:
            if since is not None and wall < since:
                continue
            for k, v in means.items():
                if k.startswith(schema.GPU_PREFIX):
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        return {k: sums[k] / counts[k] for k in sums}

    def _trains_on_gpu(self) -> bool | None:
        """Whether the backend computes on a GPU (advice about the GPU is left out where not); None: unknown."""
        try:
            return bool(self.backend.gpu_devices())
        except Exception:
            return None

    def _table_peak(self) -> float | None:
        try:
            if not self.backend.gpu_devices():
                return None
            from keras_gpu_tools.telemetry.devices import visible_gpus
            from keras_gpu_tools.telemetry.nvml import default_nvml

            gpus = visible_gpus(default_nvml())
            if not gpus:
                return None
            dtype = gpu_peaks.matmul_dtype(self.model.dtype_policy.compute_dtype, self.backend.uses_tf32())
            peak = gpu_peaks.peak_flops(gpus[0].name, dtype)
            if peak is None:
                self.warnings(
                    ("peak", gpus[0].name, dtype),
                    f"InputBoundDetector: no peak FLOP/s known for {gpus[0].name} in {dtype}; MFU is left out (pass `peak_flops=` to set it).",
                )
            return peak
        except Exception:
            return None

    def _shape_specs(self, args):
        return self.backend.shape_specs(args)

    def _jax_flops(self) -> float | None:
        att = self._attachment
        if att is None or self._jax_specs is None:
            return None
        try:
            flops, source = self.backend.step_flops(att.hook.original, self._jax_specs)
            if flops:
                self.flops_source = source
            else:
                self.warnings(
                    "flops",
                    "InputBoundDetector: XLA's cost analysis reported no FLOP count; FLOP/s and MFU are left out.",
                )
            return flops
        except Exception as e:
            self.warnings(
                "flops",
                f"InputBoundDetector: XLA cost analysis failed ({type(e).__name__}: {e}); FLOP/s and MFU are left out.",
            )
            return None
        finally:
            self._jax_specs = None  # one attempt per fit()

    def _stop_fit(self, aborted: bool) -> None:
        self._running = False
        att, self._attachment = self._attachment, None
        if att is not None:
            att.detach()
        for name in ("_writer", "_job_writer"):
            writer = getattr(self, name)
            setattr(self, name, None)
            if writer is not None:
                writer.close()

    def __repr__(self) -> str:
        cat = self.verdict.category if self.verdict else UNKNOWN
        return f"InputBoundDetector(window={self.window}, sample_every={self.sample_every}, verdict={cat!r})"
