"""ProfilerWindow: a profiler trace of chosen training steps, with step markers."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import ProfilerWarning
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling import trace as prof
from keras_gpu_tools.runtime.step_hook import StepHook
from keras_gpu_tools.runtime.step_record import StepRecord
from keras_gpu_tools.runtime.validation import (
    check_bool,
    check_int,
    check_log_dir,
    check_pairs,
    check_run_dir,
    check_run_name,
    check_verbose,
)
from keras_gpu_tools.runtime.warn_once import WarnOnce

logger = logging.getLogger("keras_gpu_tools")

_END_OF_DATA = ("StopIteration", "OutOfRangeError")


@dataclass
class WindowCapture:
    """What one profiled window produced."""

    start_step: int
    num_steps: int  # steps actually captured
    files: list[str] = field(default_factory=list)
    size_bytes: int = 0
    mean_step_ms: float | None = None
    reason: str = "scheduled"  # scheduled, triggered, cut short, failed
    analysis: prof.TraceAnalysis | None = None
    #: process 0 of a job of several: every process's trace file of the window's session
    job_files: list[str] = field(default_factory=list)
    #: process 0 of a job: each process's mean step time in the window (by process index)
    job_mean_step_ms: list[float | None] = field(default_factory=list)
    #: process 0 of a job: xprof's conclusion over every process's trace
    job_analysis: prof.TraceAnalysis | None = None

    @property
    def trace_dir(self) -> str | None:
        return os.path.dirname(self.files[0]) if self.files else None

    def line(self) -> str:
        where = self.trace_dir or "no trace file"
        mean = f", mean step {self.mean_step_ms:.2f} ms" if self.mean_step_ms is not None else ""
        return (
            f"ProfilerWindow: steps [{self.start_step}, {self.start_step + self.num_steps}) "
            f"({self.reason}) -> {where} ({self.size_bytes / 2**20:.1f} MiB{mean})"
        )

    def job_line(self) -> str:
        """Process 0's line for the whole job's window (empty outside a job)."""
        if not self.job_mean_step_ms:
            return ""
        n = len(self.job_mean_step_ms)
        where = os.path.dirname(self.job_files[0]) if self.job_files else "no trace file"
        known = [(ms, i) for i, ms in enumerate(self.job_mean_step_ms) if ms is not None]
        steps = ", ".join("?" if ms is None else f"{ms:.2f}" for ms in self.job_mean_step_ms)
        slowest = f"; slowest: process {max(known)[1]}" if len(known) > 1 else ""
        missing = (
            f"; only {len(self.job_files)} of {n} processes' traces are there (is log_dir shared by every host?)"
            if len(self.job_files) < n
            else ""
        )
        return (
            f"ProfilerWindow: job of {n} processes, steps [{self.start_step}, {self.start_step + self.num_steps}) -> "
            f"{where} ({len(self.job_files)} trace files; mean step per process: {steps} ms{slowest}{missing})"
        )


def _check_int(name, value, low):
    return check_int(name, value, low=low)


class ProfilerWindow(FitCallback):
    """Captures a profiler trace of chosen training steps, with step markers.

    Each profiled step is marked for the profiler (TensorFlow:
    `tf.profiler.experimental.Trace("train", step_num=..., _r=1)`; JAX:
    `jax.profiler.StepTraceAnnotation`; torch: a `ProfilerStep#N` range), so
    TensorBoard's Profile tab gets a per-step breakdown in its Overview and
    Input-pipeline pages, which Keras's own `TensorBoard(profile_batch=...)`
    trace lacks ("No step time measured").

    Steps are counted globally: across epochs and across `fit()` calls on the
    same instance, from 0. A "step" is one call of Keras's train function: with
    `steps_per_execution=N` (TensorFlow, JAX) one profiled step covers N
    batches.

    Where traces go: `log_dir/<run_name>/plugins/profile/<timestamp>/`, which
    `tensorboard --logdir log_dir` shows in its Profile tab (install
    `tensorboard-plugin-profile`). TensorFlow and JAX write `.xplane.pb`;
    torch writes a Chrome trace `.pt.trace.json`, which TensorBoard does not
    read: open it at https://ui.perfetto.dev or in chrome://tracing. JAX
    profiling needs Python 3.12 or newer (Keras disables it below; a warning
    says so and nothing is captured).

    After each window a line gives the trace's path and size and the window's
    mean step time; with `analyze=True` (TensorFlow and JAX, with xprof
    installed) the trace is converted with xprof's input-pipeline analyzer in
    a background thread and its conclusion ("Your program is HIGHLY
    input-bound because ...") is logged and written to TensorBoard as text
    (tag `profile/steps_<a>_<b>`, run `log_dir/<run_name>`).

    In a job of several processes (JAX, `keras.distribution.initialize`),
    steps are the job's: every process traces the same steps, and all of a
    window's traces form one session of the run `log_dir/<run_name>/job`
    (`plugins/profile/<session>/<host>_p<i>.xplane.pb`, one host per
    process), which the Profile tab shows as one multi-host session. Each
    process writes its own line and conclusion to `log_dir/<run_name>/process_<i>`;
    process 0 also writes the job's (every process's mean step time, the
    slowest process, xprof's conclusion over all traces) to
    `log_dir/<run_name>/job` and `captures[i].job_*`. The processes agree on
    the session's name at the start of each fit() and meet once at the end of
    each window, over the JAX distributed client's key-value store; without
    it (a process started by a launcher but training alone) each process
    keeps its sessions in its own run. Call `trigger()` on every process.

    A profiler session started by someone else (Keras's `profile_batch`, a
    `tf.profiler.experimental.start` of yours) is left alone: the window is
    skipped with a warning. A profiler error never stops training. The
    profiler is always stopped: at the window's end, at the end of training
    (a window cut short), and when fit() raises.

    Args:
        log_dir: directory of the TensorBoard logs. Defaults to `"logs"`.
        start_step: first step of the (first) window. The default skips the
            first steps, where compilation and warm-up happen. Defaults to
            `10`.
        num_steps: steps per window. Defaults to `5`.
        windows: a list of `(start_step, num_steps)` pairs to capture instead
            of one window; they may not overlap. Defaults to `None`.
        every_n_steps: repeat the window every N steps from `start_step`
            (N >= `num_steps`). Defaults to `None`.
        every_n_epochs: capture a window in every N-th epoch (epochs 0, N,
            2N, ... of each fit), starting `start_step` steps into the epoch.
            Defaults to `None`.
        host_tracer_level: 1 (your annotations only), 2 (also the runtime's
            high-level events) or 3 (verbose). TensorFlow and JAX. Defaults
            to `2`.
        python_tracer: also trace Python function calls (slower, bigger
            traces). Defaults to `False`.
        device_tracer: trace GPU activity. Defaults to `True`.
        analyze: convert each TensorFlow/JAX trace with xprof and report its
            input-pipeline conclusion. Defaults to `True`.
        run_name: TensorBoard run for the traces and the text. Defaults to
            `"profile"`.
        verbose: print one line per captured window. Defaults to `1`.

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
        run_name: str = "profile",
        verbose: int = 1,
    ):
        super().__init__()
        self.log_dir = check_log_dir("log_dir", log_dir, allow_none=False)
        self.start_step = check_int("start_step", start_step, low=0)
        self.num_steps = check_int("num_steps", num_steps, low=1)
        given = [
            n
            for n, v in (("windows", windows), ("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs))
            if v is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"Invalid arguments: {' and '.join(f'`{g}`' for g in given)} were both given. "
                "Expected at most one of `windows`, `every_n_steps` and `every_n_epochs`."
            )
        self.windows = None
        if windows is not None:
            self.windows = prof.validate_windows(check_pairs("windows", windows, non_empty=True))
        self.every_n_steps = check_int("every_n_steps", every_n_steps, low=1, allow_none=True)
        if self.every_n_steps is not None and self.every_n_steps < self.num_steps:
            raise ValueError(
                f"Invalid value for argument `every_n_steps`. Received: every_n_steps={every_n_steps} with "
                f"num_steps={num_steps}: the windows would overlap. Expected every_n_steps >= num_steps."
            )
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, low=1, allow_none=True)
        host_tracer_level = check_int("host_tracer_level", host_tracer_level, low=1, high=3)
        self.run_name = check_run_name("run_name", run_name)
        check_run_dir(self.log_dir, self.run_name)
        self.options = prof.TracerOptions(
            host_tracer_level,
            check_bool("python_tracer", python_tracer),
            int(check_bool("device_tracer", device_tracer)),
        )
        self.analyze = check_bool("analyze", analyze)
        self.verbose = check_verbose("verbose", verbose)
        if self.num_steps > 500:
            WarnOnce(ProfilerWarning)(
                "big",
                f"ProfilerWindow: num_steps={num_steps} may produce a trace of over 1 GB, which TensorBoard "
                "is known to crash loading. Profile a few steps instead.",
            )

        self.captures: list[WindowCapture] = []
        self.warnings = WarnOnce(ProfilerWarning)
        self._epoch_windows: list[prof.Window] = []
        self._triggered: int | None = None
        self._active: prof.Window | None = None
        self._active_reason = ""
        self._active_started = 0.0
        self._active_done = 0
        self._active_wall = 0.0
        self._skip_until = -1
        self._profiler = None  # this fit's profiler session (the backend's)
        self._index0 = 0
        self._step0 = 0
        self._fit_start_step = 0
        self._fit_captures = 0
        self._writer: EventWriter | None = None
        self._attachment = None
        self._analyses: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._bytes_per_step: float | None = None
        self._sessions_before: set = set()
        self._job = None  # this fit's JobGather, in a job whose processes agreed on the session names
        self._job_prefix = ""  # process 0's session stamp: every process names a window's session the same
        self._job_writer: EventWriter | None = None

    # -- public ---------------------------------------------------------------
    def trigger(self, num_steps: int | None = None) -> None:
        """Profiles the next `num_steps` steps (defaults to `num_steps`), unless a window is running."""
        n = self.num_steps if num_steps is None else _check_int("num_steps", num_steps, 1)
        self._triggered = n
        self._reschedule()

    def wait_for_analysis(self, timeout: float = 120.0) -> None:
        """Waits for the xprof conversions still running."""
        deadline = time.monotonic() + timeout
        for t in list(self._analyses):
            t.join(max(0.0, deadline - time.monotonic()))

    # -- Keras hooks ------------------------------------------------------------
    def _start_fit(self, session) -> None:
        self._fit_start_step = self._global_step
        self._fit_captures = len(self.captures)
        profiler = self.backend.profiler()
        ok, why = profiler.available()
        if not ok:
            self.warnings("unavailable", f"ProfilerWindow: {why}. No trace will be captured in this run.")
            return
        self._profiler = profiler
        os.makedirs(self.run_dir, exist_ok=True)
        self._writer = EventWriter(self.run_dir)
        self._join_job()
        self._attachment = StepHook.attach(self.model, self, self.backend, session)  # last
        self._index0 = self._attachment.hook.next_index  # hook call index of global step `_step0`
        self._step0 = self._global_step
        self._reschedule()

    def _join_job(self) -> None:
        """In a job of several processes: one session name for every process, from process 0's clock."""
        self._job, self._job_prefix = None, ""
        if not self.topology.multi_process:
            return
        job = self._job_gather(lambda text: self.warnings("job", f"ProfilerWindow: {text}"))
        stamps = job.gather("session", prof.session_stamp())
        if stamps is None:
            return  # no channel: each process keeps its sessions in its own run
        # Process 0's clock, to the second; a later fit() of this process in the same
        # second gets its own session (moving a trace would replace the first's).
        serial = f"_{self._fit_serial}" if self._fit_serial > 1 else ""
        self._job, self._job_prefix = job, f"{stamps[0]}{serial}"
        if self.topology.is_chief:
            job_dir = self.topology.job_run_dir(self.log_dir, self.run_name)
            os.makedirs(job_dir, exist_ok=True)
            self._job_writer = EventWriter(job_dir)

    def _stop_on_training_thread(self) -> bool:
        # torch's profiler can only be stopped from the thread that started it. While
        # such a window runs, the hook stays in place after a failed fit: the next
        # fit()'s first step (plain or not) is then the first chance to stop it.
        return self._active is not None and self._profiler is not None and self._profiler.owner_thread_only

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.every_n_epochs and epoch % self.every_n_epochs == 0:
            self._sync_step()
            self._epoch_windows.append(prof.Window(self._global_step + self.start_step, self.num_steps))
            self._reschedule()

    # -- step hook observer -----------------------------------------------------
    def sample(self, index: int) -> bool:
        return False  # no device sync needed: markers only

    def on_step(self, record: StepRecord) -> None:
        pass

    def on_detach(self, stale: bool) -> None:
        if stale:
            self._stop_window("cut short", meet=False)

    def next_sample(self, index: int) -> int | None:
        """The next hook call this callback needs: every call of a window, else the next window's start."""
        if self._active is not None or self._triggered is not None or self._attachment is None:
            return index  # (no attachment yet: attach() asks before the step count is set)
        step = self._step0 + index - self._index0
        start = self._next_window_start(step)
        return None if start is None else index + start - step

    def _leave_job(self, reason: str) -> None:
        """A window skipped here would leave the others waiting at its end: they are told at once instead."""
        if self._job is not None:
            self._job.give_up(f"process {self.topology.process_index} skipped a window: {reason}")

    def _next_window_start(self, step: int) -> int | None:
        low = max(step, self._skip_until + 1)
        if self.windows is not None:
            return min((w.start for w in self.windows if w.start >= low), default=None)
        if self.every_n_epochs:
            return min((w.start for w in self._epoch_windows if w.start >= low), default=None)
        if self.every_n_steps:
            if low <= self.start_step:
                return self.start_step
            k = -(-(low - self.start_step) // self.every_n_steps)
            return self.start_step + k * self.every_n_steps
        return self.start_step if self.start_step >= low else None

    def _reschedule(self) -> None:
        att = self._attachment
        if att is not None and att.active:
            att.hook.reschedule()

    def _sync_step(self) -> None:
        """Brings the global step up to date with the calls the hook made on its fast path."""
        att = self._attachment
        if att is not None and att.active:
            self._global_step = self._step0 + att.hook.next_index - self._index0

    def around(self, record: StepRecord, call: Callable[[], Any]) -> Any:
        step = self._step0 + record.index - self._index0
        self._global_step = step
        if self._active is None:
            window, reason = self._window_starting_at(step)
            if window is not None:
                self._start_window(window, reason)
        if self._active is None:
            out = call()
            self._global_step += 1
            return out
        t0 = time.perf_counter()
        try:
            with self._profiler.step(step):
                out = call()
        except BaseException as e:
            if type(e).__name__ not in _END_OF_DATA:
                self._stop_window("cut short", meet=False)  # this step failed here: the others may not stop now
            raise
        self._active_wall += time.perf_counter() - t0
        self._active_done += 1
        self._global_step += 1
        if self._global_step >= self._active.end:
            self._stop_window(self._active_reason, outputs=out)
        return out

    # -- internals ------------------------------------------------------------------
    def _window_starting_at(self, step: int):
        if self._triggered is not None:
            n, self._triggered = self._triggered, None
            return prof.Window(step, n), "triggered"
        if step <= self._skip_until:
            return None, ""
        if self.windows is not None:
            for w in self.windows:
                if w.start == step:
                    return w, "scheduled"
            return None, ""
        if self.every_n_epochs:
            for w in self._epoch_windows:
                if w.start == step:
                    self._epoch_windows.remove(w)
                    return w, f"every {self.every_n_epochs} epoch(s)"
            return None, ""
        if self.every_n_steps:
            if step >= self.start_step and (step - self.start_step) % self.every_n_steps == 0:
                return prof.Window(step, self.num_steps), f"every {self.every_n_steps} steps"
            return None, ""
        if step == self.start_step:
            return prof.Window(step, self.num_steps), "scheduled"
        return None, ""

    def _start_window(self, window: prof.Window, reason: str) -> None:
        if self._bytes_per_step and self._bytes_per_step * window.steps > prof.LARGE_TRACE_BYTES:
            self.warnings(
                ("size", window.steps),
                (
                    f"ProfilerWindow: a {window.steps}-step window will write about "
                    f"{self._bytes_per_step * window.steps / 2**30:.1f} GiB, judging by the last trace; TensorBoard is "
                    "known to crash loading traces over 1 GB. Profile fewer steps."
                ),
            )
        try:
            self._sessions_before = prof.session_dirs(self.run_dir)
            self._profiler.start(self.run_dir, self.options)
        except prof.ProfilerBusy as e:
            self.warnings(
                "busy",
                (
                    f"ProfilerWindow: another profiler session is already running ({e}); steps "
                    f"[{window.start}, {window.end}) are not captured. Remove `profile_batch` from keras.callbacks.TensorBoard "
                    "or stop your own profiler to use ProfilerWindow."
                ),
            )
            self._skip_until = window.end - 1
            self._leave_job("its profiler was busy")
            return
        except Exception as e:
            logger.exception("ProfilerWindow: the profiler could not start")
            self.warnings(
                ("start", type(e).__name__),
                f"ProfilerWindow: the profiler could not start ({type(e).__name__}: {e}); window skipped, training goes on.",
            )
            self._skip_until = window.end - 1
            self._leave_job("its profiler could not start")
            return
        self._active = window
        if self._profiler.owner_thread_only and self._session is not None:
            self._session.watch_unwind(True)  # stop it on the training thread the moment fit() raises
        self._active_reason = reason
        self._active_started = time.time()
        self._active_done = 0
        self._active_wall = 0.0

    def _stop_window(self, reason: str, outputs=None, meet: bool = True) -> None:
        """Stops the window's profiler and reports it; ``meet``: the job's processes meet here (not on an abort)."""
        with self._lock:
            window, self._active = self._active, None
            if window is None:
                return
            if self._session is not None:
                self._session.watch_unwind(False)
            failed = False
            try:
                self._profiler.stop(outputs)
            except Exception as e:
                failed = True
                logger.exception("ProfilerWindow: stopping the profiler failed")
                self.warnings(
                    ("stop", type(e).__name__),
                    f"ProfilerWindow: stopping the profiler failed ({type(e).__name__}: {e}); training goes on.",
                )
            label = f"steps_{window.start}_{window.start + self._active_done}"
            job = self._job if self._job is not None and self._job.active else None
            if job is not None:
                session = os.path.join(
                    self.topology.job_run_dir(self.log_dir, self.run_name),
                    "plugins",
                    "profile",
                    f"{self._job_prefix}_{label}",
                )
                try:
                    files = prof.move_to_job_session(
                        self.run_dir,
                        self._sessions_before,
                        self._profiler.pattern,
                        session,
                        self.topology.process_index,
                    )
                except OSError as e:  # the trace stays in this process's own run; training goes on
                    self.warnings(
                        ("move", type(e).__name__), f"ProfilerWindow: moving the trace to {session} failed ({e})."
                    )
                    files = []
            else:
                files = prof.claim_session(self.run_dir, self._sessions_before, self._profiler.pattern, label)
            capture = WindowCapture(
                start_step=window.start,
                num_steps=self._active_done,
                files=files,
                size_bytes=sum(os.path.getsize(f) for f in files),
                mean_step_ms=1000 * self._active_wall / self._active_done if self._active_done else None,
                reason="failed" if failed else reason,
            )
            self.captures.append(capture)
            if capture.num_steps and capture.size_bytes:
                self._bytes_per_step = capture.size_bytes / capture.num_steps
            if capture.size_bytes > prof.LARGE_TRACE_BYTES:
                self.warnings(
                    ("big", window.start),
                    f"ProfilerWindow: the trace of steps [{window.start}, {window.end}) is {capture.size_bytes / 2**30:.1f} GiB; TensorBoard may fail to load it.",
                )
            logger.info(capture.line())
            if self.verbose:
                print(capture.line())
            if self._writer is not None:
                self._writer.text(
                    schema.profile_window(window.start, window.start + capture.num_steps),
                    capture.line(),
                    step=window.start,
                )
                tag = schema.profile_window(window.start, window.start + capture.num_steps) + schema.DATA_SUFFIX
                self._writer.json(tag, capture, step=window.start)  # the same, for report()
            if job is not None and meet:
                self._meet(job, window, capture, session)
            xplanes = [f for f in files if f.endswith(".xplane.pb")]
            if self.analyze and xplanes and prof.xprof_available():
                t = threading.Thread(
                    target=self._analyze,
                    args=(capture, xplanes, self._writer, job is not None),
                    name="keras_gpu_tools-ProfilerWindow-xprof",
                    daemon=True,
                )
                self._analyses.append(t)
                t.start()

    def _meet(self, job, window: prof.Window, capture: WindowCapture, session: str) -> None:
        """Once per window: every process has moved its trace in; process 0 writes the job's line.

        The processes send the names of their files (not paths: hosts may
        mount ``log_dir`` elsewhere) and their mean step time.
        """
        mine = {"files": [os.path.basename(f) for f in capture.files], "mean_step_ms": capture.mean_step_ms}
        everyone = job.gather(f"window{window.start}", mine)
        if everyone is None or not self.topology.is_chief:
            return
        paths = [os.path.join(session, n) for p in everyone for n in p.get("files", [])]
        capture.job_files = [f for f in paths if os.path.exists(f)]  # missing: log_dir not shared by the hosts
        capture.job_mean_step_ms = [p.get("mean_step_ms") for p in everyone]
        line = capture.job_line()
        logger.info(line)
        if self.verbose:
            print(line)
        if self._job_writer is not None:
            tag = schema.profile_window(window.start, window.start + capture.num_steps)
            self._job_writer.text(tag, line, step=window.start)
            self._job_writer.json(tag + schema.DATA_SUFFIX, capture, step=window.start)
        if self.analyze and len(capture.job_files) > 1 and prof.xprof_available():
            t = threading.Thread(
                target=self._analyze_job,
                args=(capture, list(capture.job_files), self._job_writer),
                name="keras_gpu_tools-ProfilerWindow-xprof-job",
                daemon=True,
            )
            self._analyses.append(t)
            t.start()

    def _analyze_job(self, capture: WindowCapture, paths, writer) -> None:
        # In the session's folder: xprof's cache there is then the whole job's, which TensorBoard serves.
        capture.job_analysis = a = prof.analyze_input_pipeline(paths)
        text = a.conclusion or f"xprof gave no conclusion ({a.error or 'no steps found'})"
        steps = f"steps [{capture.start_step}, {capture.start_step + capture.num_steps})"
        line = f"ProfilerWindow: job of {len(paths)} processes, {steps}: {text}"
        logger.info(line)
        if self.verbose:
            print(line)
        if writer is not None:
            tag = (
                schema.profile_window(capture.start_step, capture.start_step + capture.num_steps)
                + "/"
                + schema.INPUT_PIPELINE
            )
            writer.text(tag, text, step=capture.start_step)
            writer.json(tag + schema.DATA_SUFFIX, a, step=capture.start_step)

    def _analyze(self, capture: WindowCapture, paths, writer, isolated: bool = False) -> None:
        try:
            capture.analysis = prof.analyze_input_pipeline(paths, isolated=isolated)
        except Exception as e:  # pragma: no cover - analyze_input_pipeline catches
            capture.analysis = prof.TraceAnalysis(error=str(e))
        a = capture.analysis
        text = a.conclusion or f"xprof gave no conclusion ({a.error or 'no steps found'})"
        line = f"ProfilerWindow: steps [{capture.start_step}, {capture.start_step + capture.num_steps}): {text}"
        logger.info(line)
        if self.verbose:
            print(line)
        if writer is not None:
            writer.text(
                schema.profile_window(capture.start_step, capture.start_step + capture.num_steps)
                + "/"
                + schema.INPUT_PIPELINE,
                text,
                step=capture.start_step,
            )
            tag = (
                schema.profile_window(capture.start_step, capture.start_step + capture.num_steps)
                + schema.INPUT_PIPELINE_DATA_SUFFIX
            )
            writer.json(tag, a, step=capture.start_step)  # the same, for report()

    def _stop_fit(self, aborted: bool) -> None:
        self._sync_step()
        attachment, self._attachment = self._attachment, None
        if attachment is not None:
            attachment.detach()  # the train function is Keras's own again
        with self._lock:
            if self._active is not None:
                # After a failure the other processes may be gone: no meeting (it would wait for them).
                self._stop_window("cut short", meet=not aborted)
        if not aborted and self._profiler is not None:
            self._say_what_was_not_reached()
        self._profiler = None
        self._job = None
        self.wait_for_analysis()
        for name in ("_writer", "_job_writer"):
            writer = getattr(self, name)
            setattr(self, name, None)
            if writer is not None:
                writer.close()

    def _say_what_was_not_reached(self) -> None:
        """At the end of a fit(): the windows it did not reach, so a schedule past the end is never silent."""
        step = self._global_step
        pending = [w for w in (self.windows or []) if w.start >= step]
        pending += [w for w in self._epoch_windows if w.start >= step]
        self._epoch_windows = []
        if self.windows is None and not self.every_n_epochs and len(self.captures) == self._fit_captures:
            first = max(self.start_step, step)
            if self.start_step >= step or self.every_n_steps:
                if self.every_n_steps and self.start_step < step:
                    k = -(-(step - self.start_step) // self.every_n_steps)
                    first = self.start_step + k * self.every_n_steps
                pending.append(prof.Window(first, self.num_steps))
        lines = [
            f"ProfilerWindow: steps [{w.start}, {w.end}) were not captured: training ended at step {step}. "
            "A later fit() with this callback continues the count."
            for w in pending
        ]
        for line in lines:
            logger.info(line)
            if self.verbose:
                print(line)
        if len(self.captures) == self._fit_captures and pending:
            self.warnings(
                ("unreached", self._fit_start_step),
                f"ProfilerWindow: no window was reached in this fit() (steps {self._fit_start_step} to {step}); "
                "lower `start_step` (or `every_n_steps`) to profile it.",
            )
