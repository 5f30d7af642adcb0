"""xprof's conclusion on a captured window, converted in a background thread and written next to the trace."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling.capture import WindowCapture, steps_name, write_capture
from keras_gpu_tools.profiling.trace import TraceAnalysis, analyze_input_pipeline, xprof_available


def analyze_window(
    capture: WindowCapture,
    paths: Sequence[str],
    writer: EventWriter | None,
    say: Callable[[str], None],
    job: bool = False,
    isolated: bool = False,
    done: Callable[[TraceAnalysis], None] | None = None,
    quiet: bool = True,
) -> None:
    """xprof's input-pipeline analysis of the window's trace into ``capture`` (``job``: every process's traces).

    It is written as JSON under ``profile/steps_<first>_<last>/input_pipeline/data``.
    ``done(analysis)``, where given, words it (beside the window's own input
    wait); else its conclusion's first sentence is said (``say(line)``) and written as that tag's
    text. ``isolated``: one process's trace of a job session, analyzed apart
    (see :func:`analyze_input_pipeline`). ``quiet``: xprof's native log lines go to the logger, not
    the terminal.
    """
    try:
        a = analyze_input_pipeline(paths, isolated=isolated, quiet=quiet)
    except Exception as e:  # pragma: no cover - analyze_input_pipeline catches
        a = TraceAnalysis(error=str(e))
    if job:
        capture.job_analysis = a
    else:
        capture.analysis = a
    start, stop = capture.start_step, capture.start_step + capture.num_steps
    tag = schema.profile_window(start, stop) + "/" + schema.INPUT_PIPELINE
    if writer is not None:
        writer.json(tag + schema.DATA_SUFFIX, a, step=start)  # for report()
    if done is not None:
        done(a)
        return
    text = a.conclusion or f"xprof gave no conclusion ({a.error or 'no steps found'})"
    who = f"job of {len(paths)} processes, " if job else ""
    say(
        f"ProfilerWindow: {who}{steps_name(start, capture.num_steps)}: xprof: {text.split('. ')[0].rstrip('.')}."
    )  # the whole: TensorBoard
    if writer is not None:
        writer.text(tag, text, step=start)


def in_background(
    threads: list[threading.Thread], *args, name: str, after: Callable[[], None] | None = None, **kwargs
) -> None:
    """Runs :func:`analyze_window`, then ``after()``, on a daemon thread appended to ``threads`` (to be joined)."""

    def run() -> None:
        try:
            analyze_window(*args, **kwargs)
        finally:
            if after is not None:
                after()

    run_in_background(threads, run, name)


def run_in_background(threads: list[threading.Thread], job: Callable[[], None], name: str) -> None:
    """Runs ``job()`` on a daemon thread appended to ``threads`` (to be joined): a window's analyses, one after another."""
    t = threading.Thread(target=job, name=name, daemon=True)
    threads.append(t)
    t.start()


def report_job(
    threads: list[threading.Thread],
    capture: WindowCapture,
    writer: EventWriter | None,
    say: Callable[[str], None],
    analyze: bool,
    quiet: bool = True,
) -> None:
    """Process 0 of a job: the job's line for the window, and xprof's conclusion over every process's trace."""
    line = capture.job_line()
    say(line)
    write_capture(writer, capture, line)
    if analyze and len(capture.job_files) > 1 and xprof_available():
        # In the session's folder: xprof's cache there is then the whole job's, which TensorBoard serves.
        paths = list(capture.job_files)
        name = "keras_gpu_tools-ProfilerWindow-xprof-job"
        in_background(threads, capture, paths, writer, say, name=name, job=True, quiet=quiet)
