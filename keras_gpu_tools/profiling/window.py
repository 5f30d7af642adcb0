"""One profiled window: starting the profiler, stopping it, and collecting its trace into a WindowCapture.

A profiler error never stops training: it is warned about (``warn(key,
message)``, once per key) and the window is skipped or marked failed. The
native log lines the profiler writes as it starts and stops go to the
``keras_gpu_tools`` logger, not the terminal (``runtime/native_logs.py``),
unless ``quiet`` is False.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import is_write_error, writes_failed
from keras_gpu_tools.profiling import trace as prof
from keras_gpu_tools.profiling.capture import WindowCapture, steps_name
from keras_gpu_tools.profiling.job_session import JobSessions
from keras_gpu_tools.profiling.progress import WindowSteps
from keras_gpu_tools.runtime.native_logs import quiet_native_logs

logger = logging.getLogger("keras_gpu_tools")

Warn = Callable[[Any, str], None]


def start(
    profiler: Any,
    run_dir: str,
    options: prof.TracerOptions,
    window: prof.Window,
    bytes_per_step: float | None,
    warn: Warn,
    quiet: bool = True,
) -> tuple[str | None, str]:
    """Starts ``profiler`` for ``window``: the folder it writes to (this process's own), or None and why not.

    ``quiet``: the profiler's native log lines go to the logger, not the terminal.
    """
    if bytes_per_step and bytes_per_step * window.steps > prof.LARGE_TRACE_BYTES:
        warn(
            ("size", window.steps),
            f"ProfilerWindow: a {window.steps}-step window will write about "
            f"{bytes_per_step * window.steps / 2**30:.1f} GiB, judging by the last trace; TensorBoard is "
            "known to crash loading traces over 1 GB. Profile fewer steps.",
        )
    staging = ""
    try:
        staging = prof.staging_dir(run_dir)
        with quiet_native_logs(quiet):
            profiler.start(staging, options)
        return staging, ""
    except prof.ProfilerBusy as e:
        warn(
            "busy",
            f"ProfilerWindow: another profiler session is already running ({e}); "
            f"{steps_name(window.start, window.steps)} are not captured. Remove `profile_batch` from keras.callbacks.TensorBoard "
            "or stop your own profiler to use ProfilerWindow.",
        )
        shutil.rmtree(staging, ignore_errors=True)
        return None, "its profiler was busy"
    except Exception as e:
        logger.debug("ProfilerWindow: the profiler could not start", exc_info=True)  # said in a warning, once
        warn(
            ("start", type(e).__name__),
            f"ProfilerWindow: the profiler could not start ({type(e).__name__}: {e}); window skipped, training goes on.",
        )
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        return None, "its profiler could not start"


def stop(
    profiler: Any,
    run_dir: str,
    window: prof.Window,
    steps: WindowSteps,
    reason: str,
    outputs: Any,
    job: JobSessions | None,
    warn: Warn,
    quiet: bool = True,
) -> tuple[WindowCapture, str | None]:
    """Stops ``profiler`` after ``window``'s calls (``steps``: their tally); the capture and its job session.

    The trace, written under this process's ``steps.staging`` folder, is moved into
    ``run_dir`` under its own session name, or, in a job, into the job's
    session for the window (returned; else None).
    """
    failed = False
    try:
        with quiet_native_logs(quiet):
            profiler.stop(outputs)
    except Exception as e:
        failed = True
        logger.debug("ProfilerWindow: stopping the profiler failed", exc_info=True)  # said in a warning, once
        if is_write_error(e):  # the trace could not be written: a full disk is said once for the run
            writes_failed(run_dir, e)
        else:
            warn(
                ("stop", type(e).__name__),
                f"ProfilerWindow: stopping the profiler failed ({type(e).__name__}: {e}); training goes on.",
            )
    done, wall, staging = steps.done, steps.wall, steps.staging
    label = schema.window_label(window.start, window.start + done)
    session = None
    if job is None:
        try:
            files = prof.claim_session(run_dir, staging, profiler.pattern, label)
        except OSError as e:  # the trace stays where it was written; training goes on
            warn(("claim", type(e).__name__), f"ProfilerWindow: moving the trace into {run_dir} failed ({e}).")
            files = []
    else:
        session = job.session(label)
        try:
            files = job.move_in(staging, profiler.pattern, label)
        except OSError as e:  # the trace stays in this process's own run; training goes on
            warn(("move", type(e).__name__), f"ProfilerWindow: moving the trace to {session} failed ({e}).")
            files = []
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    capture = WindowCapture(
        start_step=window.start,
        num_steps=done,
        files=files,
        size_bytes=sum(os.path.getsize(f) for f in files),
        mean_step_ms=1000 * wall / done if done else None,
        reason="failed" if failed else reason,
        steps_per_execution=steps.spe,
        calls=steps.calls,
        asked=steps_name(steps.asked.start, steps.asked.steps) if steps.asked is not None else "",
    )
    if capture.size_bytes > prof.LARGE_TRACE_BYTES:
        warn(
            ("big", window.start),
            f"ProfilerWindow: the trace of {steps_name(window.start, window.steps)} is {capture.size_bytes / 2**30:.1f} GiB; TensorBoard may fail to load it.",
        )
    return capture, session


def sync_quietly(backend: Any, outputs: Any) -> None:
    """Waits for the device to finish ``outputs`` (a window's last call: its time ends when its steps have run)."""
    try:
        backend.sync(outputs)
    except Exception as e:  # the window's time is then the host's; the profiler's stop syncs again
        logger.debug("ProfilerWindow: the window's last sync failed (%s)", e)
