"""The report as plain text (and the findings as Markdown), from a `ReportData`.

One function per section; `sections()` lists those the run has data for. The HTML page
(`keras_gpu_tools.reporting.html`) shares the wording defined here: headings, what was not
measured, the job's tables.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.input.breakdown_advice import collective_note
from keras_gpu_tools.input.span import WHOLE_FIT
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting import health
from keras_gpu_tools.reporting.model import SPLIT_AND_STEP_KEYS, SPLIT_KEYS, ReportData
from keras_gpu_tools.runtime.units import (
    format_bytes,
    format_metric,
    format_milliseconds,
    format_number,
    format_percent,
)

NO_FINDING = "No mixed-precision finding."
UNREADABLE = "Event files that could not be read"
JOB_VERDICT_HEADER = ("process", "host", "scope", "steps", "wait for input", "step", "samples/s", "verdict")
NO_XPROF = "none (no xprof analysis)"

Section = tuple[str, list[str]]  # heading, lines


def render(data: ReportData) -> str:
    """The whole report as text: title, sources, each section, what was not measured, notes."""
    out = [data.title, "=" * len(data.title)]
    if data.sources:
        out.append(f"From: {', '.join(data.sources)}")
    for heading, body in sections(data):
        out += ["", heading, "-" * len(heading)] + body
    missing = not_measured(data)
    if missing:
        out += ["", "Not measured in this run: " + "; ".join(missing) + "."]
    for n in data.notes:
        out += ["", f"Note: {n}"]
    return "\n".join(out)


def sections(data: ReportData) -> list[Section]:
    """The sections the run has data for, in the report's order."""
    out: list[Section | None] = [
        (UNREADABLE, [f"- {path} {why}" for path, why in data.unreadable]) if data.unreadable else None,
        _gpus_and_host(data),
        _gpu_health(data),
        (job_heading(data), _job(data)) if data.is_job() else None,
        _step_time(data),
        _input_pipeline(data),
        _step_breakdown(data),
        _batch_plan(data),
        _speedups(data),
        _out_of_memory(data),
        _memory_over_time(data),
        _profiler_windows(data),
        _layer_table(data),
        _mixed_precision(data),
        _training_curves(data),
    ]
    return [s for s in out if s is not None]


def not_measured(data: ReportData) -> list[str]:
    """What this run's report has no data for, and which callback measures it."""
    out = []
    if not data.series and not data.gpus:
        out.append("GPU and host metrics (GPUUtilizationLogger)")
    if not data.split_x and not data.verdict:
        out.append("step time and the input-bound verdict (InputBoundDetector)")
    if not data.profiles:
        out.append("profiler windows (ProfilerWindow)")
    if data.findings is None:
        out.append("mixed-precision findings (MixedPrecisionCheck, or pass the model)")
    return out


def findings_markdown(findings: Sequence[dict[str, str | None]]) -> str:
    """The mixed-precision findings as a Markdown list."""
    if not findings:
        return NO_FINDING
    return "\n".join(
        f"- [{f['kind']}]" + (f" `{f['layer']}`" if f["layer"] else "") + f": {f['message']}" for f in findings
    )


def job_heading(data: ReportData) -> str:
    return f"Job of {data.process_count} processes" if data.process_count > 1 else "Job"


def job_intro(data: ReportData) -> str | None:
    """Whose runs the report read, in a job (None: one process)."""
    if len(data.processes) > 1:
        return (
            f"Runs of processes {', '.join(map(str, data.processes))}: the GPUs of every process; "
            f"the other sections are process {data.processes[0]}'s."
        )
    if data.processes:
        return f"The figures of process {data.processes[0]}; the job-wide ones below are every process's."
    return None


def own_verdict_note(data: ReportData) -> str:
    """In a job: whose verdict the input-pipeline section is, and where the job's is."""
    if data.job_verdict is None or not data.processes:
        return ""
    return (
        f"Process {data.processes[0]}'s own verdict; every process's figures and the stragglers are under "
        f'"{job_heading(data)}".'
    )


def phase_line(p: dict[str, Any]) -> str:
    """A phase as a line: ``epoch 1: 12 steps, 30.5% waiting, 34.72 ms a step; left out while the cache filled``."""
    wait = format_percent(p["wait_fraction"])
    step = format_milliseconds(p["step_ms"])
    where = "in the verdict" if p["steady"] else f"left out {p['reason'] or ''}".rstrip()
    return f"{p['label']}: {p['steps']} steps, {wait} waiting, {step} a step; {where}"


def job_process_rows(jv: dict[str, Any]) -> list[tuple[str, ...]]:
    """The per-process table of a job verdict: process (marked when a straggler), host, scope, steps, wait, step, samples/s, verdict."""
    slow = {p: kind for p, kind in jv["stragglers"]}
    return [
        (
            f"{p['process']}" + (f" (straggler: {slow[p['process']]})" if p["process"] in slow else ""),
            p["host"],
            p["scope"],
            format_number(p["steps"], decimals=0),
            format_percent(p["wait_fraction"]),
            format_milliseconds(p["step_ms"]),
            format_number(p["samples_per_sec"], decimals=0),
            p["category"],
        )
        for p in jv["processes"]
    ]


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


def _gpus_and_host(data: ReportData) -> Section | None:
    body = []
    for g in data.gpus:
        where = f", process {g['process']}" if g.get("process") else ""
        body.append(
            f"GPU {g['index']}: {g['name']}, {g['memory']}, compute capability {g['compute capability']}{where}"
        )
    rows = [(k, s) for k, s in data.series.items() if s.values]
    if rows:
        body.append(f"{'metric':42s} {'min':>9s} {'mean':>9s} {'max':>9s} {'last':>9s}")
        for k, s in sorted(rows):
            body.append(f"{k:42s} " + " ".join(f"{format_number(v, decimals=1):>9s}" for v in s.stats()))
    if not data.gpu_indices() and rows:
        body.insert(0, "No GPU was monitored (host metrics only).")
    return ("GPUs and host", body) if body else None


def _gpu_health(data: ReportData) -> Section | None:
    """Only what deserves attention, per GPU (one line where nothing does); the energy; the fields not reported."""
    if not health.has_health(data):
        return None
    gpus = health.gpu_health(data)
    flagged = [g for g in gpus if g.attention]
    body = [] if flagged else [health.summary_line(gpus)]
    for g in flagged:
        body += [f"GPU {g.label}:"] + [f"- {a}" for a in g.attention]
    energy, unsupported = health.energy_lines(data, gpus), health.unsupported_lines(gpus)
    if energy:
        body += [health.ENERGY] + [f"- {line}" for line in energy]
    if unsupported:
        body += [health.UNSUPPORTED] + [f"- {line}" for line in unsupported]
    return health.HEADING, body


def _job(data: ReportData) -> list[str]:
    intro = job_intro(data)
    body = [] if intro is None else [intro]
    rows, single = data.job_rows()
    if rows or single:
        body.append("Job-wide figures at the last epoch:")
    if rows:
        body.append(f"{'figure':42s} {'min':>9s} {'mean':>9s} {'max':>9s}")
        for name, *stats in rows:
            body.append(f"{name:42s} " + " ".join(f"{format_number(v, decimals=1):>9s}" for v in stats))
    body += [f"{name}: {format_metric(name, value)}" for name, value in single]
    if not rows and not single and not data.job_profiles:  # (ProfilerWindow alone writes no job/ figure)
        body.append("No job-wide figures were written (one process, or its channel failed).")
    jv = data.job_verdict
    if jv is not None:
        body += ["", "Input pipeline of each process (its steady state):"]
        if jv["processes"]:
            table = [JOB_VERDICT_HEADER, *job_process_rows(jv)]
            widths = [max(len(r[i]) for r in table) for i in range(len(JOB_VERDICT_HEADER))]
            body += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
            body.append(jv["message"])
            if jv["advice"]:
                body += ["What to change:"] + [f"- {a}" for a in jv["advice"]]
        else:  # only the job run's text (no JSON): as process 0 wrote it
            body += jv["text"].splitlines()
    if data.job_profiles:
        body += ["", "Profiler windows of the job (one session, one trace per process):"]
        for p in data.job_profiles:
            body += job_profile_lines(p)
    return body


def _step_time(data: ReportData) -> Section | None:
    body = []
    if data.split_x:
        body.append(f"{data.split_axis:>8s} " + " ".join(f"{label:>11s}" for _, label in SPLIT_KEYS) + f" {'step':>9s}")
        for i, x in enumerate(data.split_x):
            vals = [data.split.get(k, [None] * len(data.split_x))[i] for k, _ in SPLIT_AND_STEP_KEYS]
            body.append(
                f"{format_number(x):>8s} "
                + " ".join(f"{format_milliseconds(v):>11s}" for v in vals[:3])
                + f" {format_milliseconds(vals[3]):>9s}"
            )
    for k in (schema.SAMPLES_PER_SEC, schema.STEPS_PER_SEC, schema.MFU):
        if k in data.throughput:
            body.append(f"{k}: {format_metric(k, data.throughput[k])}")
    return ("Step time", body) if body else None


def _input_pipeline(data: ReportData) -> Section | None:
    v = data.verdict
    if not v:
        return None
    scope = f" ({v.get('span') or v['scope']})" if v.get("scope") else ""
    body = [f"Verdict: {v['category']}{scope}", v["message"]]
    note = own_verdict_note(data)
    if note:
        body.insert(0, note)
    if v.get("fit_wait_fraction") is not None and v.get("scope") not in ("", "the whole fit", WHOLE_FIT):
        body.append(f"Whole fit, every phase included: {format_percent(v['fit_wait_fraction'])} waiting for input.")
    if len(v.get("phases") or []) > 1:
        body += ["Phases:"] + [f"- {phase_line(p)}" for p in v["phases"]]
    body += list(v["evidence"])
    if v["advice"]:
        body += ["What to change:"] + [f"- {a}" for a in v["advice"]]
    return "Input pipeline", body


BREAKDOWN_HEADING = "Step breakdown"


def compile_line(b: dict[str, Any]) -> str:
    """``Compile/trace: 0.91 s over the fit, 1 retrace (shapes: ...).``"""
    n = b["retraces"]
    shapes = f" (shapes: {'; '.join(b['shapes'][:4])})" if n and b["shapes"] else ""
    return f"Compile/trace: {b['compile_seconds']:.2f} s over the fit, {n} retrace{'' if n == 1 else 's'}{shapes}."


def _step_breakdown(data: ReportData) -> Section | None:
    """The steady step's parts (compilation apart), the compilation, the largest part and its advice."""
    b = data.breakdown
    if not b:
        return None
    step = b["step"]
    body = [
        f"{label}: {format_milliseconds(v * 1e3)} ({format_percent(v / step if step else None)})"
        for label, v in b["parts"].items()
    ]
    body += [f"step: {format_milliseconds(step * 1e3 if step is not None else None)}", compile_line(b)]
    if b.get("collective_reason"):
        body.append(f"Collectives left out: {b['collective_reason']}.")
    elif b.get("collective_how"):
        body.append(f"Collectives: {collective_note(b['collective_how'])}")
    if b["largest"]:
        body.append(f"Largest part: {b['largest']}.")
    body += [f"- {a}" for a in b["advice"]]
    return BREAKDOWN_HEADING, body


def recoveries(data: ReportData) -> str:
    """``3 recoveries from out-of-memory errors.``"""
    n = data.oom_count() or 0
    return f"{n} recover{'y' if n == 1 else 'ies'} from out-of-memory errors."


PLAN_HEADING = "Batch size plan"


def plan_heading(plan: dict[str, Any]) -> str:
    """``Batch size plan (throughput)``."""
    return f"{PLAN_HEADING} ({plan['objective']})"


SPEEDUPS_HEADING = "Speed-ups (find_speedups)"


def _speedups(data: ReportData) -> Section | None:
    """The speed-ups as `print(report)` shows them: the summary, a row per change, the code of those that paid."""
    if data.speedups is None:
        return None
    return SPEEDUPS_HEADING, str(data.speedups).splitlines()


def _batch_plan(data: ReportData) -> Section | None:
    """The plan as `print(plan)` shows it: the batch, why, and by throughput the candidates' table."""
    if data.plan is None:
        return None
    return plan_heading(data.plan), data.plan["text"].splitlines()


def _out_of_memory(data: ReportData) -> Section | None:
    if not data.oom_seen:
        return None
    body = [recoveries(data)]
    body += [f"{k}: {v if isinstance(v, str) else format_number(v)}" for k, v in data.oom_summary.items()]
    for i, line in enumerate(data.oom_events):
        body.append(f"- {line}")
        body += [f"    {w}" for w in (data.oom_details[i] if i < len(data.oom_details) else [])]
    if data.oom_headroom:
        body += ["Headroom:"] + [f"- {h}" for h in data.oom_headroom]
    if data.oom_count() and not data.oom_events:
        body.append("(The log directory holds the counts; the callback's `summary()` has each recovery.)")
    return "Out of memory", body


MEMORY_HEADING = "Memory over time"
MEMORY_FITS_HEADER = ("fit", "model", "epochs", "host RSS at its end", "device in use")


def memory_fit_rows(m: dict[str, Any]) -> list[tuple[str, ...]]:
    """The process's fits as table rows (MiB at each fit's end)."""
    return [
        (
            str(f.get("fit", "")),
            str(f.get("model", "")),
            str(f.get("epochs", "")),
            format_bytes(f["host_rss_mib"] * 2**20) if f.get("host_rss_mib") is not None else "-",
            format_bytes(f["device_in_use_mib"] * 2**20) if f.get("device_in_use_mib") is not None else "-",
        )
        for f in m["fits"]
    ]


def _memory_over_time(data: ReportData) -> Section | None:
    m = data.memory_verdict
    if not m:
        return None
    scope = f" ({m['scope']})" if m["scope"] else ""
    body = [f"Verdict: memory {m['category']}{scope}", m["message"]]
    body += list(m["exhaustion"][1:]) + list(m["evidence"])
    if m["advice"]:
        body += ["What to change:"] + [f"- {a}" for a in m["advice"]]
    if len(m["fits"]) > 1:
        table = [MEMORY_FITS_HEADER, *memory_fit_rows(m)]
        widths = [max(len(r[i]) for r in table) for i in range(len(MEMORY_FITS_HEADER))]
        body += ["Fits of this process:"] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    return MEMORY_HEADING, body


def _profiler_windows(data: ReportData) -> Section | None:
    if not data.profiles:
        return None
    body = []
    for p in data.profiles:
        size = "?" if p["size_mib"] is None else format_bytes(p["size_mib"] * 2**20)
        mean = "" if p["mean_step_ms"] is None else f", mean step {format_milliseconds(p['mean_step_ms'])}"
        where = p["trace_dir"] or "no trace file"
        body.append(f"{p.get('span') or 'steps ' + p['steps']} ({p['reason'] or '?'}): {where} ({size}{mean})")
        body += window_input_lines(p, data.verdict)
    return "Profiler windows", body


LAYER_ROWS = 10  # rows of the layer table the report shows (the heaviest)


def layer_table_lines(t: dict[str, Any]) -> tuple[str, list[str]]:
    """A window's time per layer: its heading and the heaviest rows as text (or why there is none)."""
    head = f"Time per layer ({t['span']})"
    if t["error"]:
        return head, [f"none: {t['error']}"]
    total = "" if t["total_ms"] is None else f", {format_milliseconds(t['total_ms'])} per step in all"
    body = [f"{t['source']}{total}; forward and backward together:"]
    width = max([len(r["path"]) for r in t["rows"][:LAYER_ROWS]] + [5])
    for r in t["rows"][:LAYER_ROWS]:
        calls = f"  x{r['calls']}" if r["calls"] > 1 else ""
        body.append(
            f"  {r['path'].ljust(width)}  {format_milliseconds(r['ms_per_step']):>9}  {100 * r['share']:5.1f}%{calls}"
        )
    if len(t["rows"]) > LAYER_ROWS:
        body.append(f"  ... {len(t['rows']) - LAYER_ROWS} more rows (ProfilerWindow.layer_table())")
    if t["note"]:
        body.append(t["note"])
    return head, body


def _layer_table(data: ReportData) -> Section | None:
    return layer_table_lines(data.layer_table) if data.layer_table is not None else None


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


def _mixed_precision(data: ReportData) -> Section | None:
    if data.findings is None:
        return None
    if not data.findings:
        return "Mixed precision", [NO_FINDING]
    return "Mixed precision", [
        f"- [{f['kind']}]" + (f" {f['layer']}" if f["layer"] else "") + f": {f['message']}" for f in data.findings
    ]


def _training_curves(data: ReportData) -> Section | None:
    if not data.training:
        return None
    return "Training curves", [
        f"{k}: " + ", ".join(format_number(v) for v in s.values) for k, s in sorted(data.training.items())
    ]
