"""Profiler windows: each window's trace, its mean step, its input wait beside xprof's conclusion; and
the job's windows (shown in the job's section): every process's trace and mean step, the slowest.

From `ProfilerWindow` (``captures``, waited for xprof's analyses) or its runs: JSON
``profile/steps_<first>_<last>/data`` and ``.../input_pipeline/data``, of process 0's job run too.
"""

from __future__ import annotations

import json
import os
from typing import Any

from keras_gpu_tools.input.categories import UNKNOWN
from keras_gpu_tools.input.span import SpanFigure
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.profiling.capture import steps_name
from keras_gpu_tools.reporting.logs import JOB, Logs
from keras_gpu_tools.reporting.markup import bullets, e, prose, table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sources import name_of, profiler, set_processes
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_bytes, format_milliseconds

HEADING = "Profiler windows"
NO_XPROF = "none (no xprof analysis)"


def conclusion(analysis: dict[str, Any] | None) -> str:
    """What xprof concluded of a window, worded as `ProfilerWindow` writes it ("" before any analysis)."""
    if not analysis:
        return ""
    return analysis.get("conclusion") or f"xprof gave no conclusion ({analysis.get('error') or 'no steps found'})"


def profile_row(rec: dict[str, Any]) -> dict[str, Any]:
    """A profiler window of the report from a `WindowCapture` record."""
    start, n = int(rec["start_step"]), int(rec["num_steps"])
    files = rec.get("files") or []
    size = finite(rec.get("size_bytes"))
    return {
        "steps": f"{start + 1}-{start + n}",  # the first and last step, counted from 1 (as steps_name)
        "start": start,
        "num_steps": n,
        "reason": str(rec.get("reason", "")),
        "trace_dir": os.path.dirname(files[0]) if files else "",
        "size_mib": None if size is None else size / 2**20,
        "mean_step_ms": finite(rec.get("mean_step_ms")),
        "conclusion": conclusion(rec.get("analysis")),
        **window_input(rec.get("input"), start, n),
    }


def window_input(rec: dict[str, Any] | None, start: int, n: int) -> dict[str, Any]:
    """A profiled window's input wait as the detector measures it, beside xprof's, from a `WindowInput` record.

    ``span`` ("steps 21-25"), ``input`` (``"9.3% (moderately input-bound)"``, "" before any),
    ``input_wait_fraction``, ``input_category``, ``xprof`` (its word and share) and ``xprof_reason``
    (why xprof says otherwise; "" where it agrees).
    """
    rec = rec or {}
    fig = SpanFigure(
        str(rec.get("span") or steps_name(start, n)),
        finite(rec.get("wait_fraction")),
        str(rec.get("category") or UNKNOWN),
    )
    return {
        "span": fig.span,
        "input": fig.short() if rec else "",
        "input_wait_fraction": fig.wait_fraction,
        "input_category": fig.category,
        "xprof": str(rec.get("xprof") or ""),
        "xprof_reason": str(rec.get("reason") or ""),
    }


def job_profile_row(rec: dict[str, Any], analysis: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A profiler window of the job from process 0's `WindowCapture` record (None: not a job's window).

    ``analysis``: xprof's analysis over every trace, where it comes apart (its own tag); else the
    record's ``job_analysis``.
    """
    means = [finite(ms) for ms in rec.get("job_mean_step_ms") or []]
    if not means:
        return None
    start, n = int(rec["start_step"]), int(rec["num_steps"])
    files = [str(f) for f in rec.get("job_files") or []]
    known = [(ms, i) for i, ms in enumerate(means) if ms is not None]
    return {
        "steps": f"{start + 1}-{start + n}",  # the first and last step, counted from 1 (as steps_name)
        "start": start,
        "num_steps": n,
        "processes": len(means),
        "files": files,
        "trace_dir": os.path.dirname(files[0]) if files else "",
        "mean_step_ms": means,  # by process index; None: that process measured none
        "slowest": max(known)[1] if len(known) > 1 else None,
        "conclusion": conclusion(analysis if analysis is not None else rec.get("job_analysis")),
    }


def job_profile_lines(p: dict[str, Any]) -> list[str]:
    """A job's profiler window in lines: its traces, each process's mean step, the slowest, xprof's conclusion."""
    n, files = p["processes"], p["files"]
    where = p["trace_dir"] or "no trace file"
    lines = [f"steps {p['steps']}: {len(files)} trace file{'' if len(files) == 1 else 's'} of {n} processes in {where}"]
    lines += [f"  trace: {os.path.basename(f)}" for f in files]
    if len(files) < n:  # a process's trace is not where process 0 looked
        lines.append(f"  only {len(files)} of {n} processes' traces are there (is log_dir shared by every host?)")
    for i, ms in enumerate(p["mean_step_ms"]):
        mean = "not measured" if ms is None else format_milliseconds(ms)
        lines.append(f"  process {i}: mean step {mean}" + (" (slowest)" if i == p["slowest"] else ""))
    lines.append(f"  xprof over every trace: {p['conclusion'] or NO_XPROF}")
    return lines


def job_profile_html(p: dict[str, Any]) -> list[str]:
    """A job's profiler window in HTML, as `job_profile_lines` words it."""
    where = p["trace_dir"] or "no trace file"
    parts = [
        f'<p class="kgt-job-profile">steps {e(p["steps"])}: {len(p["files"])} trace files of '
        f"{p['processes']} processes in <code>{e(where)}</code></p>"
    ]
    rows = [
        (f"{i} (slowest)" if i == p["slowest"] else str(i), "not measured" if ms is None else format_milliseconds(ms))
        for i, ms in enumerate(p["mean_step_ms"])
    ]
    parts.append(table(["process", "mean step in the window"], rows))
    if p["files"]:
        parts.append(bullets(f"trace: {os.path.basename(f)}" for f in p["files"]))
    if len(p["files"]) < p["processes"]:
        parts.append(
            f"<p>Only {len(p['files'])} of {p['processes']} processes' traces are there "
            "(is log_dir shared by every host?)</p>"
        )
    parts.append(f"<p>xprof over every trace: {prose(p['conclusion'] or NO_XPROF)}</p>")
    return parts


def window_input_lines(p: dict[str, Any], verdict: dict[str, Any] | None) -> list[str]:
    """A profiled window's input wait (this window only, beside the run's verdict), xprof's conclusion, why they differ."""
    lines = []
    if p.get("input"):
        run = f"the run's verdict: {verdict['category']} ({verdict.get('span') or verdict['scope']})" if verdict else ""
        lines.append(f"  input wait: {p['input']}, this window only" + (f"; {run}" if run else ""))
    lines.append(f"  xprof: {p['conclusion'] or NO_XPROF}")
    if p.get("xprof_reason"):
        lines.append(f"  why xprof differs: {p['xprof_reason']}")
    return lines


def _windows(tag: str) -> bool:
    """A window's record (``profile/steps_<first>_<last>/data``), not its xprof analysis or layer table."""
    return tag.startswith(schema.PROFILE_PREFIX) and not tag.endswith(
        (schema.INPUT_PIPELINE_DATA_SUFFIX, schema.LAYERS_DATA_SUFFIX)
    )


class ProfilerWindows(BaseSection):
    name = "profiler"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        prof = profiler(source)
        if prof is None:
            return None
        prof.wait_for_analysis(timeout=60.0)  # xprof's conclusions, converted in the background
        records = [to_plain(c) for c in list(prof.captures)]
        data.profiles = [profile_row(r) for r in records]
        # Process 0 of a job: the job's windows (the other processes hold no job_* figures).
        data.job_profiles = [row for r in records if (row := job_profile_row(r)) is not None]
        if data.job_profiles:
            set_processes(data, prof)
        return name_of(prof)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        profiles: dict[str, dict[str, Any]] = {}
        for tag in [t for t in logs.records if _windows(t)]:
            window = tag[: -len(schema.DATA_SUFFIX)]  # xprof's analysis comes in a tag of its own
            analysis = (
                logs.records[window + schema.INPUT_PIPELINE_DATA_SUFFIX][-1][1]
                if (window + schema.INPUT_PIPELINE_DATA_SUFFIX in logs.records)
                else None
            )

            def window_row(v: dict[str, Any], a: Any = analysis) -> dict[str, Any]:
                return profile_row(v if a is None else {**v, "analysis": a})

            row = logs.convert(data, tag, window_row)
            if row is not None:
                profiles[window] = row
        data.profiles = sorted(profiles.values(), key=lambda p: p["start"])
        data.job_profiles = _job_profiles_of(data, logs)
        if data.job_profiles and max(p["processes"] for p in data.job_profiles) > data.process_count:
            data.process_count = max(p["processes"] for p in data.job_profiles)

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.profiles:
            data.profiles = other.profiles
        if not data.job_profiles:
            data.job_profiles = other.job_profiles

    def text(self, data: ReportData) -> TextSection | None:
        if not data.profiles:
            return None
        body = []
        for p in data.profiles:
            size = "?" if p["size_mib"] is None else format_bytes(p["size_mib"] * 2**20)
            mean = "" if p["mean_step_ms"] is None else f", mean step {format_milliseconds(p['mean_step_ms'])}"
            where = p["trace_dir"] or "no trace file"
            body.append(f"{p.get('span') or 'steps ' + p['steps']} ({p['reason'] or '?'}): {where} ({size}{mean})")
            body += window_input_lines(p, data.verdict)
        return HEADING, body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if not data.profiles:
            return []
        rows = [
            (
                p.get("span") or p["steps"],
                p["reason"],
                "" if p["mean_step_ms"] is None else format_milliseconds(p["mean_step_ms"]),
                p["trace_dir"],
                "" if p["size_mib"] is None else format_bytes(p["size_mib"] * 2**20),
                p.get("input") or "-",
                (p["conclusion"] or "-")
                + (f" Why xprof differs: {p['xprof_reason']}" if p.get("xprof_reason") else ""),
            )
            for p in data.profiles
        ]
        head = ["steps", "reason", "mean step", "trace", "size", "input wait (this window)", "xprof conclusion"]
        return [f"<h3>{HEADING}</h3>", table(head, rows)]

    def badges(self, data: ReportData) -> list[Badge]:
        return [(f"{len(data.profiles)} profiler window(s)", "info")] if data.profiles else []

    def not_measured(self, data: ReportData) -> list[str]:
        return [] if data.profiles else ["profiler windows (ProfilerWindow)"]


def _job_profiles_of(data: ReportData, logs: Logs) -> list[dict[str, Any]]:
    """The job's profiler windows from the JSON texts of the profiler's job run (process 0's), by tag."""
    last: dict[str, tuple[float, int, str]] = {}  # the last JSON of each tag
    for run in logs.runs:
        if run.kind != JOB:
            continue
        for tag, texts in run.values.texts.items():
            if tag.startswith(schema.PROFILE_PREFIX) and tag.endswith(schema.DATA_SUFFIX):
                for t in texts:
                    if tag not in last or (t.wall_time, t.step) >= last[tag][:2]:
                        last[tag] = (t.wall_time, t.step, t.text)
    texts_ = {tag: text for tag, (_, _, text) in last.items()}
    out = []
    for tag in sorted(t for t in texts_ if not t.endswith(schema.INPUT_PIPELINE_DATA_SUFFIX)):
        window = tag[: -len(schema.DATA_SUFFIX)]
        try:
            rec = json.loads(texts_[tag])
            pipeline = window + schema.INPUT_PIPELINE_DATA_SUFFIX
            analysis = json.loads(texts_[pipeline]) if pipeline in texts_ else None
            row = job_profile_row(rec, analysis)
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            data.notes.append(
                f"The JSON of tag {tag!r} of the job run is not as expected ({type(err).__name__}: {err}); it is left out."
            )
            continue
        if row is not None:
            out.append(row)
    return sorted(out, key=lambda p: p["start"])


SECTION = ProfilerWindows()
