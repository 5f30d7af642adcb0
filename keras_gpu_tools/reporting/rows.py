"""The report's rows (plain dicts) from the callbacks' records.

Each record is the JSON-ready form a callback writes to its ``.../data`` tag
(`keras_gpu_tools.logdir.writer.to_plain` of its dataclasses), so that the
callbacks and the log directory make the same report. Both gatherers convert
through these functions; the renderers read the rows they return.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from keras_gpu_tools.input.breakdown_advice import LABELS
from keras_gpu_tools.input.categories import UNKNOWN
from keras_gpu_tools.input.span import SpanFigure, span_name
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.memory.search import BatchPlan
from keras_gpu_tools.profiling.capture import steps_name


def finite(v: Any) -> float | None:
    """`v` as a float; None when it is not a number or not finite."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def floats(figures: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of `figures`, as floats."""
    return {str(k): float(v) for k, v in figures.items() if finite(v) is not None}


def gpu_row(rec: dict[str, Any]) -> dict[str, str]:
    """A row of the GPU table from a `GPUUtilizationLogger.device_records()` entry."""
    mem, cc = rec.get("memory_total_bytes"), rec.get("compute_capability")
    row = {
        # the GPU's name in the tags (gpu/<label>/...): its job-wide label in a job of several processes
        "index": str(rec.get("label", rec.get("index", "?"))),
        "name": str(rec.get("name", "?")) + (" (MIG)" if rec.get("is_mig") else ""),
        "uuid": str(rec.get("uuid") or ""),
        "memory": f"{mem / 2**20:.0f} MiB" if mem else "?",
        "compute capability": ".".join(map(str, cc)) if cc else "?",
    }
    if (rec.get(schema.PROCESS_COUNT) or 1) > 1:  # which process of the job monitored it
        row["process"] = f"{rec.get(schema.PROCESS_INDEX, '?')} ({rec.get(schema.HOST) or '?'})"
    return row


def memory_verdict_dict(rec: dict[str, Any], fits: list[Any] | None = None) -> dict[str, Any]:
    """The report's memory verdict from a `LeakVerdict` record, and the process's fits (their figures at the end)."""
    return {
        "category": str(rec.get("category", "unknown")),
        "message": str(rec.get("message", "")),
        "scope": str(rec.get("scope") or ""),
        "host_mib_per_epoch": finite(rec.get("host_mib_per_epoch")),
        "device_mib_per_epoch": finite(rec.get("device_mib_per_epoch")),
        "host_mib_per_fit": finite(rec.get("host_mib_per_fit")),
        "device_mib_per_fit": finite(rec.get("device_mib_per_fit")),
        "exhaustion": [str(x) for x in rec.get("exhaustion") or []],
        "evidence": [str(x) for x in rec.get("evidence") or []],
        "advice": [str(x) for x in rec.get("advice") or []],
        "fits": [dict(f) for f in fits or [] if isinstance(f, dict)],
    }


def verdict_dict(rec: dict[str, Any], text: str, fit_figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's verdict from a `Verdict` record and the summary text that goes with it.

    ``scope`` is what the verdict's figures cover (its steady state),
    ``phases`` every epoch (or window) with whether it is in the verdict and
    why not, ``speedup_bound`` what removing the wait is worth at most, and
    ``fit_figures`` the whole fit's figures. Records of earlier versions lack
    them: empty, None.
    """
    phases = [phase_dict(p) for p in rec.get("phases") or []]
    scope = str(rec.get("scope") or "")
    return {
        "category": str(rec.get("category", "unknown")),
        "span": span_name(scope, any(not p["steady"] for p in phases)) if scope else "",
        "wait_fraction": finite(rec.get("wait_fraction")),
        "message": str(rec.get("message", "")),
        "evidence": [str(x) for x in rec.get("evidence") or []],
        "advice": [str(x) for x in rec.get("advice") or []],
        "scope": scope,
        "phases": phases,
        "speedup_bound": finite(rec.get("speedup_bound")),
        "fit_wait_fraction": finite(rec.get("fit_wait_fraction")),
        "fit_figures": floats(fit_figures or {}),
        "text": text,
    }


def phase_dict(rec: dict[str, Any]) -> dict[str, Any]:
    """A phase of the verdict from a `Phase` record."""
    return {
        "label": str(rec["label"]),
        "steps": int(rec.get("steps") or 0),
        "wait_fraction": finite(rec.get("wait_fraction")),
        "step_ms": None if finite(rec.get("step")) is None else 1e3 * float(rec["step"]),
        "steady": bool(rec.get("steady")),
        "reason": None if rec.get("reason") is None else str(rec["reason"]),
    }


def job_verdict_dict(rec: dict[str, Any], text: str = "") -> dict[str, Any]:
    """The report's job verdict from a `JobVerdict` record (``text``: the verdict as the job run holds it).

    ``processes``: one row per process (``process``, ``host``, ``scope``, ``steps``, ``wait_fraction``,
    ``step_ms``, ``samples_per_sec``, ``category``), ``stragglers``: (process, kind) pairs.
    """
    processes = []
    for p in rec.get("processes") or []:
        processes.append(
            {
                "process": int(p["process"]),
                "host": str(p.get("host") or "?"),
                "scope": str(p.get("scope") or "?"),
                "steps": finite(p.get("steps")),
                "wait_fraction": finite(p.get("wait_fraction")),
                "step_ms": finite(p.get("step_ms")),
                "samples_per_sec": finite(p.get("samples_per_sec")),
                "category": str(p.get("category") or "unknown"),
            }
        )
    return {
        "processes": processes,
        "stragglers": [(int(s["process"]), str(s.get("kind") or "")) for s in rec.get("stragglers") or []],
        "message": str(rec.get("message") or ""),
        "advice": [str(a) for a in rec.get("advice") or []],
        "text": text,
    }


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


def layer_table_dict(rec: dict[str, Any]) -> dict[str, Any]:
    """A profiled window's time per Keras layer from a `LayerTable` record: its steps, source, error and rows."""
    start, n = int(rec["start_step"]), int(rec["num_steps"])
    return {
        "start": start,
        "span": steps_name(start, n),
        "source": str(rec.get("source") or ""),
        "total_ms": finite(rec.get("total_ms_per_step")),
        "error": str(rec.get("error") or ""),
        "note": str(rec.get("note") or ""),
        "rows": [
            {
                "path": str(r["path"]),
                "calls": int(r.get("calls") or 0),
                "ms_per_step": finite(r.get("ms_per_step")) or 0.0,
                "share": finite(r.get("share")) or 0.0,
                "forward_ms": finite(r.get("forward_ms")),
                "backward_ms": finite(r.get("backward_ms")),
                "flops": finite(r.get("flops_per_step")),
            }
            for r in rec.get("rows") or []
        ],
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


def finding_dict(rec: dict[str, Any]) -> dict[str, str | None]:
    """A mixed-precision finding of the report from a `MixedPrecisionFinding` record."""
    layer = rec.get("layer")
    return {
        "kind": str(rec.get("kind", "?")),
        "layer": None if layer is None else str(layer),
        "message": str(rec.get("message", "")),
    }


def oom_lines(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The line of each recovery and why, from `OOMEvent` records."""
    from keras_gpu_tools.memory.events import OOMEvent

    known = {f.name for f in dataclasses.fields(OOMEvent)}
    events = [OOMEvent(**{k: r[k] for k in known & set(r)}) for r in records]
    return [e.line() for e in events], [e.why() for e in events]


def plan_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The report's batch size plan from a `BatchPlan.as_dict()` record (its JSON in the log directory).

    ``text`` is the plan as `print(plan)` shows it, ``headline`` its first
    line, ``candidates`` the throughput plan's `Candidate` rows (empty for the
    memory objective) and ``chosen`` the planned global batch.
    """
    if not isinstance(rec, dict):
        raise TypeError(f"a plan record is a dict, not {type(rec).__name__}")
    plan = BatchPlan.from_dict(rec)
    text = str(plan)
    return {
        "objective": plan.objective,
        "chosen": plan.batch_size,
        "per_device_batch_size": plan.per_device_batch_size,
        "devices": plan.devices,
        "global_batch_size": plan.global_batch_size,
        "micro_batches": plan.micro_batches,
        "why": plan.why,
        "method": plan.method,
        "plan_seconds": plan.plan_seconds,
        "text": text,
        "headline": text.splitlines()[0] if plan.objective == "throughput" and plan.fits else text,
        "candidates": list(plan.candidates),
    }


def breakdown_dict(rec: dict[str, Any]) -> dict[str, Any]:
    """The report's step breakdown from the detector's record (``FitBreakdown.record()``).

    ``parts`` are the steady step's parts in seconds per step (label -> value, in order),
    ``step`` the step they add up to, ``compile_seconds`` and ``retraces`` the fit's
    compilation, ``largest`` the largest part's label and ``advice`` what fits it.
    """
    parts = {LABELS.get(str(k), str(k)): float(v) for k, v in dict(rec["parts"]).items() if finite(v) is not None}
    largest = rec.get("largest")
    return {
        "parts": parts,
        "step": finite(rec.get("step")),
        "compile_seconds": float(rec["compile_seconds"]),
        "retraces": int(rec["retraces"]),
        "shapes": [str(s) for s in rec.get("shapes") or []],
        "largest": LABELS.get(str(largest), str(largest)) if largest else None,
        "advice": [str(a) for a in rec.get("advice") or []],
        "collective_reason": rec.get("collective_reason"),
        "collective_how": rec.get("collective_how"),
    }
