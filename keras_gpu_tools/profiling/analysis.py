"""xprof's conclusion on a captured window, converted in a background thread and written next to the trace."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling.capture import WindowCapture
from keras_gpu_tools.profiling.trace import TraceAnalysis, analyze_input_pipeline


def analyze_window(
    capture: WindowCapture,
    paths: Sequence[str],
    writer: EventWriter | None,
    say: Callable[[str], None],
    job: bool = False,
    isolated: bool = False,
) -> None:
    """xprof's input-pipeline analysis of the window's trace into ``capture`` (``job``: every process's traces).

    Its conclusion's first sentence is said (``say(line)``), the whole written as text and JSON under
    ``profile/steps_<a>_<b>/input_pipeline``. ``isolated``: one process's
    trace of a job session, analyzed apart (see :func:`analyze_input_pipeline`).
    """
    try:
        a = analyze_input_pipeline(paths, isolated=isolated)
    except Exception as e:  # pragma: no cover - analyze_input_pipeline catches
        a = TraceAnalysis(error=str(e))
    if job:
        capture.job_analysis = a
    else:
        capture.analysis = a
    text = a.conclusion or f"xprof gave no conclusion ({a.error or 'no steps found'})"
    start, stop = capture.start_step, capture.start_step + capture.num_steps
    who = f"job of {len(paths)} processes, " if job else ""
    say(f"ProfilerWindow: {who}steps [{start}, {stop}): {text.split('. ')[0].rstrip('.')}.")  # the whole: TensorBoard
    if writer is not None:
        tag = schema.profile_window(start, stop) + "/" + schema.INPUT_PIPELINE
        writer.text(tag, text, step=start)
        writer.json(tag + schema.DATA_SUFFIX, a, step=start)  # the same, for report()


def in_background(threads: list[threading.Thread], *args, name: str, **kwargs) -> None:
    """Runs :func:`analyze_window` on a daemon thread, appended to ``threads`` (to be joined)."""
    t = threading.Thread(target=analyze_window, args=args, kwargs=kwargs, name=name, daemon=True)
    threads.append(t)
    t.start()
