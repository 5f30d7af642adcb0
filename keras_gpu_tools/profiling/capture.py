"""What a profiled window produced (its trace files, size, mean step time, xprof's conclusion), and how every view names it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling.trace import TraceAnalysis


def steps_name(start: int, num_steps: int) -> str:
    """The name of ``num_steps`` steps from 0-based global step ``start``, counted from 1 as Keras counts batches.

    ``steps_name(20, 5)`` is ``"steps 21-25"``; one step is ``"step 21"``. Every view names its steps so.
    """
    first, last = start + 1, start + max(num_steps, 1)
    return f"step {first}" if first == last else f"steps {first}-{last}"


def copies_sentence(ms_per_step: float) -> str:
    """What the table says of the window's copies between host and device (every view says it so)."""
    return (
        f"Copies between host and device: {ms_per_step:.3f} ms per step, not in the rows or their total "
        "(they move the batches in and results out on the GPU's copy engines: no layer's work)."
    )


@dataclass
class WindowCapture:
    """What one profiled window produced."""

    start_step: int
    num_steps: int  # steps actually captured (batches: N per call with steps_per_execution=N)
    files: list[str] = field(default_factory=list)
    size_bytes: int = 0
    mean_step_ms: float | None = None  # per step: the window's wall time over its steps
    reason: str = "scheduled"  # scheduled, triggered, cut short, failed
    analysis: TraceAnalysis | None = None
    #: process 0 of a job of several: every process's trace file of the window's session
    job_files: list[str] = field(default_factory=list)
    #: process 0 of a job: each process's mean step time in the window (by process index)
    job_mean_step_ms: list[float | None] = field(default_factory=list)
    #: process 0 of a job: xprof's conclusion over every process's trace
    job_analysis: TraceAnalysis | None = None
    #: the window's input wait as the detector measures it, beside xprof's (a WindowInput, once known)
    input: Any = None
    #: steps per call of the train function; each call is one step marker in the trace
    steps_per_execution: int = 1
    #: calls of the train function the window ran (0: not counted)
    calls: int = 0
    #: the steps as scheduled, where the window ran others (it starts and ends where a call does)
    asked: str = ""

    @property
    def trace_dir(self) -> str | None:
        return os.path.dirname(self.files[0]) if self.files else None

    def line(self) -> str:
        where = self.trace_dir or "no trace file"
        mean = f", mean step {self.mean_step_ms:.2f} ms" if self.mean_step_ms is not None else ""
        return (
            f"ProfilerWindow: {steps_name(self.start_step, self.num_steps)} ({self.reason}) -> {where} "
            f"({self.size_bytes / 2**20:.1f} MiB{mean}){self.execution_note()}"
        )

    def execution_note(self) -> str:
        """What a step marker of the trace is, with ``steps_per_execution=N`` ("" where it is one step)."""
        n = self.steps_per_execution
        if n <= 1:
            return ""
        calls = f"{self.calls} call{'s' if self.calls != 1 else ''}" if self.calls else "calls"
        asked = f"; scheduled as {self.asked}" if self.asked else ""
        return (
            f"; steps_per_execution={n}: {calls} of {n} steps, each one step marker in the trace "
            f"(xprof's steps are executions of {n} steps; the mean step and the layer table are per step){asked}"
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
            f"ProfilerWindow: job of {n} processes, {steps_name(self.start_step, self.num_steps)} -> "
            f"{where} ({len(self.job_files)} trace files; mean step per process: {steps} ms{slowest}{missing})"
        )


def write_capture(writer: EventWriter | None, capture: WindowCapture, line: str) -> None:
    """A window's ``line`` as text under ``profile/steps_<first>_<last>``, and the capture as JSON for the report."""
    if writer is not None:
        tag = schema.profile_window(capture.start_step, capture.start_step + capture.num_steps)
        writer.text(tag, line, step=capture.start_step)
        writer.json(tag + schema.DATA_SUFFIX, capture, step=capture.start_step)


def write_input(writer: EventWriter | None, capture: WindowCapture, text: str) -> None:
    """A window's input wait (``capture.input``) beside xprof's as text, and the capture again as JSON with it."""
    if writer is not None:
        tag = schema.profile_window(capture.start_step, capture.start_step + capture.num_steps)
        writer.text(tag + "/" + schema.INPUT_PIPELINE, text, step=capture.start_step)
        writer.json(tag + schema.DATA_SUFFIX, capture, step=capture.start_step)
