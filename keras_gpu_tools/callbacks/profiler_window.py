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
from keras_gpu_tools.profiling.capture import WindowCapture, steps_name, write_capture
from keras_gpu_tools.profiling.job_session import JobSessions
from keras_gpu_tools.profiling.layer_table import LayerTable
from keras_gpu_tools.profiling.layer_window import LayerTables
from keras_gpu_tools.profiling.schedule import WindowSchedule
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import validation as check
from keras_gpu_tools.runtime.step_hook import Attachment, StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.warn_once import WarnOnce

logger = logging.getLogger("keras_gpu_tools")

_END_OF_DATA = ("StopIteration", "OutOfRangeError")
_WINDOW_STEP = "profiler_window_step"  # a window's call's first global step, in its record's extra


class ProfilerWindow(FitCallback):
    """Captures a profiler trace of chosen training steps, with step markers.

    Each profiled step is marked for the profiler (TensorFlow's `Trace("train", step_num=...)`, JAX's
    `StepTraceAnnotation`, torch's `ProfilerStep#N`), so TensorBoard's Profile tab gets the per-step breakdown that
    Keras's own `TensorBoard(profile_batch=...)` trace lacks ("No step time measured").

    Steps are counted globally (across epochs and `fit()` calls, from 0); a step is one batch. With
    `steps_per_execution=N` one call of Keras's train function runs N steps: a window starts at the first call that
    starts at or past its `start_step` and runs whole calls until it has `num_steps` steps (`num_steps=5` at N=8 is
    one call of 8 steps). Its mean step time and layer table are per step; the profiler's step markers are per call
    (xprof's "steps" are executions of N steps), which the window's line says.

    Traces go to `log_dir/<run_name>/plugins/profile/<timestamp>/`, which TensorBoard's Profile tab shows
    (`tensorboard-plugin-profile`): `.xplane.pb` on TensorFlow and JAX (JAX needs Python 3.12 or newer); torch
    writes a Chrome trace `.pt.trace.json`: open it at https://ui.perfetto.dev.

    Steps are named from 1, as Keras counts them (`start_step=20, num_steps=5` is "steps 21-25"). After each window
    a line gives the trace's path, size and mean step time, and one its input wait as `InputBoundDetector` measures
    it (its first and last steps synced for it) beside, with `analyze=True` (TensorFlow and JAX, with xprof),
    xprof's conclusion on the same steps and why they differ where they do (`captures[i].input`, also as text under
    `profile/steps_<first>_<last>/input_pipeline`); the run's verdict is the detector's.

    In a job of several processes (JAX, `keras.distribution.initialize`) every process traces the same steps, and a
    window's traces form one multi-host session of the run `log_dir/<run_name>/job`. Each process writes its own
    line and conclusion to `log_dir/<run_name>/process_<i>`; process 0 also writes the job's (every process's mean
    step time, xprof's conclusion over all traces) to the job's run and `captures[i].job_*`. Without the job's
    key-value store each process keeps its sessions in its own run. Call `trigger()` on every process.

    Each process profiles into a folder of its own and claims only its own sessions; another training that writes
    the same `log_dir` at the same time (no job) writes its runs under `log_dir/<run_name>/<host>_pid<pid>`.

    A profiler session started by someone else (Keras's `profile_batch`) is left alone: the window is skipped with a
    warning. A profiler error never stops training; the profiler is always stopped, also when fit() raises.

    After each window (with `layers=True`) its time and FLOPs per Keras layer, forward and backward together, are
    worked out off the training thread on every backend: `layer_table()`, a line, a table and chart under `.../layers`.

    Args:
        log_dir: directory of the TensorBoard logs. Defaults to `"logs"`.
        start_step: first step of the (first) window, past compilation and warm-up. Defaults to `10`.
        num_steps: steps per window. Defaults to `5`.
        windows: a list of `(start_step, num_steps)` pairs to capture instead of one window; they may not overlap.
            Defaults to `None`.
        every_n_steps: repeat the window every N steps from `start_step` (N >= `num_steps`). Defaults to `None`.
        every_n_epochs: capture a window in every N-th epoch (epochs 0, N, 2N, ... of each fit), starting
            `start_step` steps into the epoch. Defaults to `None`.
        host_tracer_level: 1 (your annotations), 2 (also the runtime's events) or 3 (verbose); TensorFlow and JAX.
            Defaults to `2`.
        python_tracer: also trace Python function calls (slower, bigger traces). Defaults to `False`.
        device_tracer: trace GPU activity. Defaults to `True`.
        analyze: convert each TensorFlow/JAX trace with xprof and report its input-pipeline conclusion. Defaults to
            `True`.
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
        self._active: prof.Window | None = None
        self._active_reason, self._active_done, self._active_wall = "", 0, 0.0  # the active window's
        self._active_calls = 0  # calls of the train function in the active window (N steps each)
        self._asked: prof.Window | None = None  # the active window as scheduled, where it starts or ends elsewhere
        self._spe = 1  # steps per call of the train function (steps_per_execution), this fit's
        self._epoch_index0 = self._epoch_step0 = 0  # the hook's call index and global step of the epoch's start
        self._profiler: ProfilerSession | None = None  # this fit's profiler session (the backend's)
        self._index0 = self._step0 = 0  # the hook's call index of global step `_step0`
        self._fit_start_step = self._fit_captures = 0  # this fit's first step, and captures before it
        self._attachment: Attachment | None = None
        self._analyses: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._bytes_per_step: float | None = None
        self._staging = ""  # the folder this process's profiler writes the active window to
        self._job: JobSessions | None = None  # this fit's, in a job whose processes agreed on the session names
        self._inputs = ProfiledWindows()  # each window's input wait, until it is reported

    def trigger(self, num_steps: int | None = None) -> None:
        """Profiles the next `num_steps` steps (defaults to `num_steps`), unless a window is running."""
        self._schedule.triggered = (
            self.num_steps if num_steps is None else check.check_int("num_steps", num_steps, low=1)
        )
        self._reschedule()

    def wait_for_analysis(self, timeout: float = 120.0) -> None:
        """Waits for the windows' analyses still running (xprof's conversions, the layer tables)."""
        deadline = time.monotonic() + timeout
        for t in list(self._analyses):
            t.join(max(0.0, deadline - time.monotonic()))

    def layer_table(self, window: int = -1) -> LayerTable | None:
        """Time per Keras layer in a profiled window (the last by default; `window` indexes them by start step).

        `rows` (`LayerRow`: `path`, `calls`, `ms_per_step`, `share`, `forward_ms`, `backward_ms`, `flops_per_step`,
        `peak_activation_bytes`: torch only, the allocator's peak inside the layer's forward range; None where the
        trace gives none) come heaviest first; the loss and optimizer are
        `"(outside layers)"`. Waits for the analysis; None before any window or without a profiler (said once).
        """
        self.wait_for_analysis()
        return self._layers.table(window)

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
        det = next((c for c in ki.find_callback_list(self.model) if hasattr(c, "high_threshold")), None)
        self._inputs = ProfiledWindows(*((det.moderate_threshold, det.high_threshold) if det else ()))
        self._attachment = StepHook.attach(self.model, self, self.backend, session)  # last
        self._spe = self._attachment.hook.steps_per_execution
        self._epoch_index0 = self._index0 = self._attachment.hook.next_index  # hook call index of global step `_step0`
        self._epoch_step0 = self._step0 = self._global_step
        self._reschedule()

    def _stop_on_training_thread(self) -> bool:
        # torch's profiler can only be stopped from the thread that started it: after a failed fit
        # the hook stays in place while such a window runs, and the next fit()'s first step stops it.
        return self._active is not None and self._profiler is not None and self._profiler.owner_thread_only

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.every_n_epochs:
            self._sync_step()
            if self._schedule.epoch_begins(epoch, self._global_step):
                self._reschedule()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._inputs.waiting() and self._attachment is not None and self._attachment.active:
            self._attachment.hook.flush()  # a window's last step: its interval ends with the epoch's steps
        self._end_epoch_count()

    def _end_epoch_count(self) -> None:
        """The epoch's steps: N per call, its last call capped by the epoch's steps (Keras's count, where known).

        With ``steps_per_execution=N`` the epoch's last call may run fewer than N steps; the next
        epoch counts on from the epoch's real end, as Keras's batch indexes and the other callbacks do.
        """
        att = self._attachment
        if att is None or not att.active:
            return
        self._sync_step()
        steps = self._global_step - self._epoch_step0
        cap = (self.params or {}).get("steps")
        if cap and 0 < int(cap) < steps:
            self._global_step = self._epoch_step0 + int(cap)
        self._epoch_index0 = self._index0 = att.hook.next_index
        self._epoch_step0 = self._step0 = self._global_step

    def _step_of(self, index: int) -> int:
        """The global step that the hook's call ``index`` starts at (N steps a call)."""
        return self._step0 + (index - self._index0) * self._spe

    def sample(self, index: int) -> bool:
        """A window's first and last calls are synced, for its input wait; markers need no sync."""
        w = self._active
        if w is None:  # a window starting here
            return self._schedule.triggered is not None or self._schedule.fires(self._step_of(index), self._spe)
        last = w.steps - self._active_done <= self._spe
        return last or self._layers.wants_call(self._active_calls)

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
        if self._active is not None or self._schedule.triggered is not None or self._attachment is None:
            return index  # (no attachment yet: attach() asks before the step count is set)
        calls = self._schedule.first_call(self._step_of(index), self._spe)
        return None if calls is None else index + calls

    def _reschedule(self) -> None:
        att = self._attachment
        if att is not None and att.active:
            att.hook.reschedule()

    def _sync_step(self) -> None:
        """Brings the global step up to date with the calls the hook made on its fast path."""
        att = self._attachment
        if att is not None and att.active:
            self._global_step = self._step_of(att.hook.next_index)

    def around(self, record: StepRecord, call: Callable[[], Any]) -> Any:
        step = self._step_of(record.index)
        self._global_step = step
        if self._active is None:
            window, reason = self._schedule.starting_at(step, self._spe)
            if window is not None:
                self._start_window(window, reason, step)
        if self._active is None:
            out = call()
            self._global_step += self._spe
            return out
        record.extra[_WINDOW_STEP] = step
        t0 = time.perf_counter()
        try:
            with self._profiler.step(step):  # type: ignore[union-attr]  # set in any window; no assert per step
                out = call()
        except BaseException as e:
            if type(e).__name__ not in _END_OF_DATA:
                self._stop_window("cut short", meet=False)  # this step failed here: the others may not stop now
            raise
        self._active_done += max(int(record.steps), 1)  # the steps the call ran (set by the backend's caller)
        self._active_calls += 1
        self._global_step += self._spe
        last = self._active_done >= self._active.steps
        if last:  # the window's time ends when its last step has run, not when it was dispatched
            self._sync_quietly(out)
        self._active_wall += time.perf_counter() - t0
        if last:
            self._stop_window(self._active_reason, outputs=out)
        return out

    def _sync_quietly(self, outputs: Any) -> None:
        """Waits for the device to finish ``outputs`` (the sampled call's own sync then finds them done)."""
        try:
            self.backend.sync(outputs)
        except Exception as e:  # the window's time is then the host's; the profiler's stop syncs again
            logger.debug("ProfilerWindow: the window's last sync failed (%s)", e)

    def _say(self, line: str) -> None:
        logger.info(line)
        if self.verbose:
            self._print(line)

    def _start_window(self, asked: prof.Window, reason: str, step: int) -> None:
        """Starts the window ``asked`` for in the call that begins at global ``step`` (its start, or after it)."""
        window = prof.Window(step, asked.steps)
        opts, bps, warn, quiet = self.options, self._bytes_per_step, self.warnings, self.verbose < 2
        staging, why = profiled.start(self._profiler, self._required_run_dir, opts, window, bps, warn, quiet)
        if staging is None:
            self._schedule.skip_until = window.end - 1
            if self._job is not None:  # the others would wait at the window's end: told at once instead
                self._job.gather.give_up(f"process {self.topology.process_index} skipped a window: {why}")
            return
        self._staging, self._active = staging, window
        if self.layers:
            self._layers.start_window(self._profiler, window.start, self._attachment)  # never self.model in a step
        self._inputs.start(window.start, window.steps)
        if self._stop_on_training_thread() and self._session is not None:
            self._session.watch_unwind(True)  # stop it on the training thread the moment fit() raises
        self._active_reason, self._active_done, self._active_wall, self._active_calls = reason, 0, 0.0, 0
        self._asked = asked if asked.start != step or asked.steps % self._spe else None

    def _stop_window(self, reason: str, outputs=None, meet: bool = True) -> None:
        """Stops the window's profiler and reports it; ``meet``: the job's processes meet here (not on an abort)."""
        with self._lock:
            window, self._active = self._active, None
            if window is None:
                return
            if self._session is not None:
                self._session.watch_unwind(False)
            job = self._job if self._job is not None and self._job.active else None
            done, wall, staging = self._active_done, self._active_wall, self._staging
            quiet, run_dir = self.verbose < 2, self._required_run_dir
            capture, session = profiled.stop(
                self._profiler, run_dir, staging, window, done, wall, reason, outputs, job, self.warnings, quiet
            )
            capture.steps_per_execution, capture.calls = self._spe, self._active_calls
            if self._asked is not None:
                capture.asked = steps_name(self._asked.start, self._asked.steps)
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
            join = WindowJoin(analyze, report, steps_per_marker=self._spe)
            self._inputs.stop(window.start, done, join, complete=reason != "cut short")
            after = (lambda: self._layers.analyze(capture, self._writer, self._say)) if self.layers else None
            if analyze:
                name, isolated, done_ = "keras_gpu_tools-ProfilerWindow-xprof", job is not None, join.xprof
                in_background(self._analyses, capture, xplanes, self._writer, self._say, name=name,
                              isolated=isolated, done=done_, after=after, quiet=quiet)  # fmt: skip
            elif after is not None:
                run_in_background(self._analyses, after, "keras_gpu_tools-ProfilerWindow-layers")

    def _stop_fit(self, aborted: bool) -> None:
        self._sync_step()
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            if not aborted and attachment.active:
                attachment.hook.flush()  # the last step's record, for a window that ended with the fit
            attachment.detach()  # the train function is Keras's own again
        with self._lock:
            if self._active is not None:
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
        self._profiler = None
        self._job = None
        self.wait_for_analysis()
        self._layers.draw_charts(self._writer)  # after the steps: matplotlib is slow to import
        self._close_writers()
