"""ProfilerWindow: a profiler trace of chosen training steps, with step markers."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.backends.protocols import ProfilerSession
from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import ProfilerWarning
from keras_gpu_tools.input.profiled import ProfiledWindows
from keras_gpu_tools.input.xprof import WindowJoin, report_input
from keras_gpu_tools.profiling import trace as prof
from keras_gpu_tools.profiling import window as profiled
from keras_gpu_tools.profiling.analysis import in_background, report_job, run_in_background
from keras_gpu_tools.profiling.capture import WindowCapture, write_capture
from keras_gpu_tools.profiling.job_session import JobSessions
from keras_gpu_tools.profiling.layer_table import LayerTable
from keras_gpu_tools.profiling.layer_window import LayerTables
from keras_gpu_tools.profiling.progress import WindowSteps
from keras_gpu_tools.profiling.schedule import WindowSchedule
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import roles
from keras_gpu_tools.runtime import validation as check
from keras_gpu_tools.runtime.step_hook import Attachment, StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.typing_compat import override
from keras_gpu_tools.runtime.warn_once import WarnOnce

logger = logging.getLogger("keras_gpu_tools")

_END_OF_DATA = ("StopIteration", "OutOfRangeError")
_WINDOW_STEP = "profiler_window_step"  # a window's call's first global step, in its record's extra


class ProfilerWindow(FitCallback, roles.ProfileCaptures):
    """Captures a profiler trace of chosen training steps, with step markers.

    Each profiled step is marked for the profiler (TensorFlow's `Trace("train", step_num=...)`, JAX's
    `StepTraceAnnotation`, torch's `ProfilerStep#N`), so TensorBoard's Profile tab gets the per-step breakdown that
    Keras's own `TensorBoard(profile_batch=...)` trace lacks ("No step time measured").

    Steps are batches, counted globally (across epochs and `fit()` calls, from 0) and named from 1 as Keras counts
    them (`start_step=20, num_steps=5` is "steps 21-25"). With `steps_per_execution=N` a window runs whole calls of N
    steps from the first call at or past `start_step`; its figures stay per step.

    Traces go to `log_dir/<run_name>/plugins/profile/<timestamp>/`, which TensorBoard's Profile tab shows
    (`tensorboard-plugin-profile`): `.xplane.pb` on TensorFlow and JAX (JAX needs Python 3.12 or newer); torch
    writes a Chrome trace `.pt.trace.json`: open it at https://ui.perfetto.dev. After each window a line gives the
    trace's path, size and mean step time, and one its input wait as `InputBoundDetector` measures it (its first and
    last steps synced for it) beside, with `analyze=True` (TensorFlow and JAX, with xprof), xprof's conclusion on the
    same steps and why they differ where they do (`captures[i].input`, also as text under
    `profile/steps_<first>_<last>/input_pipeline`); the run's verdict is the detector's.

    In a job of several processes (JAX, `keras.distribution.initialize`) every process traces the same steps, and a
    window's traces form one multi-host session of the run `log_dir/<run_name>/job`. Each process writes its own
    line and conclusion to `log_dir/<run_name>/process_<i>`; process 0 also writes the job's (every process's mean
    step time, xprof's conclusion over all traces) to the job's run and `captures[i].job_*`. Without the job's
    key-value store each process keeps its sessions in its own run. Call `trigger()` on every process.

    A profiler session started by someone else (Keras's `profile_batch`) is left alone: the window is skipped with a
    warning. A profiler error never stops training; the profiler is always stopped, also when fit() raises. After
    each window (with `layers=True`) its time and FLOPs per Keras layer, forward and backward together, are worked
    out off the training thread on every backend: `layer_table()`, a line, a table and chart under `.../layers`.

    Args:
        log_dir: directory of the TensorBoard logs. Defaults to `"logs"`.
        start_step: first step of the (first) window, past compilation and warm-up. Defaults to `10`.
        num_steps: steps per window. Defaults to `5`.
        windows: `(start_step, num_steps)` pairs to capture instead of one window, not overlapping. Defaults to `None`.
        every_n_steps: repeat the window every N steps from `start_step` (N >= `num_steps`). Defaults to `None`.
        every_n_epochs: capture a window in every N-th epoch (epochs 0, N, 2N, ... of each fit), starting
            `start_step` steps into the epoch. Defaults to `None`.
        host_tracer_level: 1 (your annotations), 2 (the runtime's events too), 3 (verbose); TF and JAX. Defaults to `2`.
        python_tracer: also trace Python function calls (slower, bigger traces). Defaults to `False`.
        device_tracer: trace GPU activity. Defaults to `True`.
        analyze: convert each TensorFlow/JAX trace with xprof and report its input-pipeline verdict. Defaults to `True`.
        layers: after each window, its time per Keras layer (`layer_table()`). Defaults to `True`.
        run_name: TensorBoard run for the traces and the text. Defaults to `"profile"`.
        verbose: print a line per captured window, under its epoch's progress bar; `2` also lets the profiler's and
            xprof's native log lines (`I0000 ...`) through to the terminal (else kept in the logger). Defaults to `1`.

    Example:

    ```python
    from keras_gpu_tools import ProfilerWindow

    profiler = ProfilerWindow(log_dir="logs", start_step=20, num_steps=5)
    model.fit(dataset, epochs=3, callbacks=[profiler])
    print(profiler.captures[0].analysis.conclusion)
    # tensorboard --logdir logs   -> Profile tab
    profiler.trigger()  # e.g. from your own callback: profile the next steps
    ```
    """

    def __init__(
        self,
        log_dir: str | os.PathLike = "logs",
        start_step: int = 10,
        num_steps: int = 5,
        windows: Sequence[tuple[int, int]] | None = None,
        every_n_steps: int | None = None,
        every_n_epochs: int | None = None,
        host_tracer_level: int = 2,
        python_tracer: bool = False,
        device_tracer: bool = True,
        analyze: bool = True,
        layers: bool = True,
        run_name: str = "profile",
        verbose: int = 1,
    ):
        super().__init__()
        self.log_dir = check.check_log_dir("log_dir", log_dir, allow_none=False)
        self._schedule = WindowSchedule.checked(start_step, num_steps, windows, every_n_steps, every_n_epochs)
        self.start_step, self.num_steps = self._schedule.start_step, self._schedule.num_steps
        self.windows, self.every_n_steps = self._schedule.windows, self._schedule.every_n_steps
        self.every_n_epochs = self._schedule.every_n_epochs
        host_tracer_level = check.check_int("host_tracer_level", host_tracer_level, low=1, high=3)
        self.run_name = check.check_run_name("run_name", run_name)
        check.check_run_dir(self.log_dir, self.run_name)
        python_tracer = check.check_bool("python_tracer", python_tracer)
        device_tracer_level = int(check.check_bool("device_tracer", device_tracer))
        self.options = prof.TracerOptions(host_tracer_level, python_tracer, device_tracer_level)
        self.analyze = check.check_bool("analyze", analyze)
        self.layers = check.check_bool("layers", layers)
        self._layers = LayerTables()
        self.verbose = check.check_verbose("verbose", verbose)

        self.captures: list[WindowCapture] = []
        self.warnings = WarnOnce(ProfilerWarning)
        self._steps = WindowSteps(self._schedule)  # each call's global step; the running window and its tally
        self._profiler: ProfilerSession | None = None  # this fit's profiler session (the backend's)
        self._fit_start_step = self._fit_captures = 0  # this fit's first step, and captures before it
        self._attachment: Attachment | None = None
        self._analyses: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._bytes_per_step: float | None = None
        self._job: JobSessions | None = None  # this fit's, in a job whose processes agreed on the session names
        self._inputs = ProfiledWindows()  # each window's input wait, until it is reported

    def trigger(self, num_steps: int | None = None) -> None:
        """Profiles the next `num_steps` steps (defaults to `num_steps`), unless a window is running."""
        n = self.num_steps if num_steps is None else check.check_int("num_steps", num_steps, low=1)
        self._schedule.triggered = n
        self._reschedule()

    def wait_for_analysis(self, timeout: float = 120.0) -> None:
        """Waits for the windows' analyses still running (xprof's conversions, the layer tables)."""
        deadline = time.monotonic() + timeout
        for t in list(self._analyses):
            t.join(max(0.0, deadline - time.monotonic()))

    def layer_table(self, window: int = -1) -> LayerTable | None:
        """Time per Keras layer in a profiled window (the last by default; `window` indexes them by start step).

        `rows` (`LayerRow`: `path`, `calls`, `ms_per_step`, `share`, `forward_ms`, `backward_ms`, `flops_per_step`,
        `peak_activation_bytes` (torch only)) come heaviest first; loss and optimizer are `"(outside layers)"`;
        host-device copies are in no row (`copy_ms_per_step`). Waits for the analysis; None before any window.
        """
        self.wait_for_analysis()
        return self._layers.table(window)

    @override
    def _start_fit(self, session) -> None:
        self._fit_start_step = self._global_step
        self._fit_captures = len(self.captures)
        profiler = self.backend.profiler()
        ok, why = profiler.available()
        if not ok:
            self.warnings("unavailable", f"ProfilerWindow: {why}. No trace will be captured in this run.")
            return
        self._profiler = profiler
        if self.layers:
            self._layers.start_fit(self.model, self.backend)
        os.makedirs(self._required_run_dir, exist_ok=True)
        self._job = None
        if self.topology.multi_process:  # one session name for every process, from process 0's clock
            job_dir = self.topology.job_run_dir(self.log_dir, self.run_name)
            self._job = JobSessions.join(self._job_gather(), job_dir, self._fit_serial)
        self._open_writers(job=self._job is not None)
        self._job_events()  # process 0 of a job: the job's run at once
        det = next((c for c in ki.find_callback_list(self.model) if isinstance(c, roles.InputThresholds)), None)
        self._inputs = ProfiledWindows(*((det.moderate_threshold, det.high_threshold) if det else ()))
        self._attachment = att = StepHook.attach(self.model, self, self.backend, session)  # last
        self._steps.start_fit(att.hook.next_index, self._global_step, att.hook.steps_per_execution)
        self._reschedule()

    @override
    def _stop_on_training_thread(self) -> bool:
        # torch's profiler can only be stopped from the thread that started it: after a failed fit
        # the hook stays in place while such a window runs, and the next fit()'s first step stops it.
        return self._steps.window is not None and self._profiler is not None and self._profiler.owner_thread_only

    @override
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.every_n_epochs:
            self._sync_step()
            if self._schedule.epoch_begins(epoch, self._global_step):
                self._reschedule()

    @override
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        hook = self._hook
        if hook is not None and self._inputs.waiting():
            hook.flush()  # a window's last step: its interval ends with the epoch's steps
        if hook is not None:  # the next epoch counts on from where Keras says this one ended
            self._global_step = self._steps.end_epoch(hook.next_index, (self.params or {}).get("steps"))

    def sample(self, index: int) -> bool:
        """A window's first and last calls are synced, for its input wait; markers need no sync."""
        return self._steps.wants(index, self._layers.wants_call(self._steps.calls))

    def on_step(self, record: StepRecord) -> None:
        self._layers.on_step(record)  # a window's step's shapes, for its FLOPs per layer
        step = record.extra.get(_WINDOW_STEP)
        if step is not None:  # a call of a window
            self._inputs.on_step(record, step)

    def on_detach(self, stale: bool) -> None:
        if stale:
            self._stop_window("cut short", meet=False)

    def next_sample(self, index: int) -> int | None:
        """The next hook call this callback needs: every call of a window, else the next window's start."""
        # (no attachment yet: attach() asks before the step count is set)
        return index if self._attachment is None else self._steps.next_call(index)

    @property
    def _hook(self) -> StepHook | None:
        return self._attachment.hook if self._attachment is not None and self._attachment.active else None

    def _reschedule(self) -> None:
        if self._hook is not None:
            self._hook.reschedule()

    def _sync_step(self) -> None:  # the global step, up to date with the calls the hook made on its fast path
        if self._hook is not None:
            self._global_step = self._steps.step_of(self._hook.next_index)

    def around(self, record: StepRecord, call: Callable[[], Any]) -> Any:
        steps = self._steps
        step = self._global_step = steps.step_of(record.index)
        if steps.window is None:
            window, asked, reason = steps.starting(step)
            if window is not None and asked is not None:
                self._start_window(window, asked, reason)
        if steps.window is None:
            out = call()
            self._global_step += steps.spe
            return out
        record.extra[_WINDOW_STEP] = step
        steps.first = time.perf_counter() if steps.first is None else steps.first  # the fit's time, input and hooks in
        try:
            with self._profiler.step(step):  # type: ignore[union-attr]  # set in any window; no assert per step
                out = call()
        except BaseException as e:
            if type(e).__name__ not in _END_OF_DATA:
                self._stop_window("cut short", meet=False)  # this step failed here: the others may not stop now
            raise
        self._global_step += steps.spe
        last = steps.add(record.steps)  # the steps the call ran (set by the backend's caller)
        if last:  # the window's time ends when its last step has run, not when it was dispatched
            profiled.sync_quietly(self.backend, out)
        steps.wall = time.perf_counter() - steps.first
        if last:
            self._stop_window(steps.reason, outputs=out)
        return out

    def _say(self, line: str) -> None:
        logger.info(line)
        if self.verbose:
            self._print(line)

    def _start_window(self, window: prof.Window, asked: prof.Window, reason: str) -> None:
        """Starts ``window``, the one ``asked`` for, from the call where it starts (at its start, or after it)."""
        opts, bps, warn, quiet = self.options, self._bytes_per_step, self.warnings, self.verbose < 2
        staging, why = profiled.start(self._profiler, self._required_run_dir, opts, window, bps, warn, quiet)
        if staging is None:
            self._schedule.skip_until = window.end - 1
            if self._job is not None:  # the others would wait at the window's end: told at once instead
                self._job.gather.give_up(f"process {self.topology.process_index} skipped a window: {why}")
            return
        self._steps.begin(window, asked, reason, staging)
        if self.layers:
            self._layers.start_window(self._profiler, window.start, self._attachment)  # never self.model in a step
        self._inputs.start(window.start, window.steps)
        if self._stop_on_training_thread() and self._session is not None:
            self._session.watch_unwind(True)  # stop it on the training thread the moment fit() raises

    def _stop_window(self, reason: str, outputs=None, meet: bool = True) -> None:
        """Stops the window's profiler and reports it; ``meet``: the job's processes meet here (not on an abort)."""
        with self._lock:
            steps = self._steps
            window = steps.end()
            if window is None:
                return
            if self._session is not None:
                self._session.watch_unwind(False)
            job = self._job if self._job is not None and self._job.active else None
            quiet, run_dir, warn = self.verbose < 2, self._required_run_dir, self.warnings
            capture, session = profiled.stop(self._profiler, run_dir, window, steps, reason, outputs, job, warn, quiet)
            self._layers.stop_window()
            self.captures.append(capture)
            if capture.num_steps and capture.size_bytes:
                self._bytes_per_step = capture.size_bytes / capture.num_steps
            self._say(capture.line())
            write_capture(self._writer, capture, capture.line())
            if job is not None and session is not None and meet and job.meet(window, capture, session):
                report_job(self._analyses, capture, self._job_writer, self._say, self.analyze, quiet)
            xplanes = [f for f in capture.files if f.endswith(".xplane.pb")]
            analyze = bool(self.analyze and xplanes and prof.xprof_available())
            report = lambda lines, fig: report_input(capture, lines, fig, self._say, self._writer)  # noqa: E731
            join = WindowJoin(analyze, report, steps_per_marker=steps.spe)
            self._inputs.stop(window.start, capture.num_steps, join, complete=reason != "cut short")
            after = (lambda: self._layers.analyze(capture, self._writer, self._say)) if self.layers else None
            if analyze:
                name, isolated, done_ = "keras_gpu_tools-ProfilerWindow-xprof", job is not None, join.xprof
                in_background(self._analyses, capture, xplanes, self._writer, self._say, name=name,
                              isolated=isolated, done=done_, after=after, quiet=quiet)  # fmt: skip
            elif after is not None:
                run_in_background(self._analyses, after, "keras_gpu_tools-ProfilerWindow-layers")

    @override
    def _stop_fit(self, aborted: bool) -> None:
        self._sync_step()
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            if not aborted and attachment.active:
                attachment.hook.flush()  # the last step's record, for a window that ended with the fit
            attachment.detach()  # the train function is Keras's own again
        with self._lock:
            if self._steps.window is not None:
                # After a failure the other processes may be gone: no meeting (it would wait for them).
                self._stop_window("cut short", meet=not aborted)
        self._inputs.finish_all()
        if not aborted and self._profiler is not None:  # a schedule past the end is never silent
            captured = len(self.captures) > self._fit_captures
            lines, warning = self._schedule.unreached_report(self._fit_start_step, self._global_step, captured)
            for line in lines:
                self._say(line)
            if warning:
                self.warnings(("unreached", self._fit_start_step), warning)
        self._profiler = self._job = None
        self.wait_for_analysis()
        self._layers.draw_charts(self._writer)  # after the steps: matplotlib is slow to import
        self._close_writers()
