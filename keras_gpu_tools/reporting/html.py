"""The report as an HTML page (or a notebook's HTML view), from a `ReportData` and its plots.

One function per section, as in `keras_gpu_tools.reporting.text`, whose wording it shares; the
plots come in as PNG bytes (`figures.png`) and are embedded in the page. Prose written by the
callbacks (verdicts, advice, findings, notes) marks code as Markdown does, in backticks: `prose`
renders it as ``<code>``.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from keras_gpu_tools.input.span import WHOLE_FIT
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.memory.throughput import TABLE_HEADER, table_rows
from keras_gpu_tools.reporting import health, text
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.runtime.units import (
    format_bytes,
    format_metric,
    format_milliseconds,
    format_number,
    format_percent,
)
from keras_gpu_tools.speedups.report import HEADER as SPEEDUP_HEADER

e = html.escape
_CODE_SPAN = re.compile(r"(`+)(.+?)\1(?!`)")  # a Markdown code span: `x`, or ``x`` (which may hold a `)


def prose(s: str) -> str:
    """`s` as HTML: escaped, its Markdown code spans (text in backticks) as ``<code>``."""
    out, at = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [e(s[at : m.start()]), f"<code>{e(m.group(2).strip())}</code>"]
        at = m.end()
    out.append(e(s[at:]))
    return "".join(out)


CSS = """<style>
.kgt-report{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:13px;max-width:900px;color:#222}
.kgt-report h2{margin:4px 0 2px 0;font-size:20px}
.kgt-report h3{margin:18px 0 6px 0;font-size:15px;border-bottom:1px solid #ddd;padding-bottom:2px}
.kgt-report table{border-collapse:collapse;margin:4px 0;font-size:12px}
.kgt-report th,.kgt-report td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
.kgt-report th{background:#f4f4f4}
.kgt-report figure{margin:6px 0}
.kgt-report img{max-width:100%}
.kgt-src{color:#777;margin:0}
.kgt-badge{display:inline-block;border-radius:10px;padding:2px 9px;margin:2px;font-size:12px;background:#eee}
.kgt-ok{background:#d9f2d9}.kgt-warn{background:#fff0c2}.kgt-bad{background:#f8d0d0}.kgt-info{background:#dde8f8}
</style>"""


def render(data: ReportData, pngs: dict[str, bytes], full_page: bool = False) -> str:
    """The report as HTML: a ``<div>`` for a notebook, or a whole page (`full_page`)."""
    parts = [f"<h2>{e(data.title)}</h2>"]
    if data.sources:
        parts.append(f'<p class="kgt-src">From: {e(", ".join(data.sources))}</p>')
    summary = badges(data)
    if summary:
        parts.append(
            '<p class="kgt-badges">'
            + " ".join(f'<span class="kgt-badge kgt-{cls}">{e(t)}</span>' for t, cls in summary)
            + "</p>"
        )
    if data.unreadable:
        parts.append(f"<h3>{text.UNREADABLE}</h3>")
        parts.append("<ul>" + "".join(f"<li>{e(p)} {e(why)}</li>" for p, why in data.unreadable) + "</ul>")
    for section in (
        _gpus_and_host,
        _gpu_health,
        _job,
        _step_time,
        _input_pipeline,
        _step_breakdown,
        _batch_plan,
        _speedups,
        _out_of_memory,
        _memory_over_time,
        _profiler_windows,
        _layer_table,
        _mixed_precision,
        _training_curves,
    ):
        parts += section(data, pngs)
    missing = text.not_measured(data)
    if missing:
        parts.append(f'<p class="kgt-src">Not measured in this run: {prose("; ".join(missing))}.</p>')
    for n in data.notes:
        parts.append(f"<p><i>{prose(n)}</i></p>")
    body = f'<div class="kgt-report">{CSS}{"".join(p for p in parts if p)}</div>'
    if not full_page:
        return body
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{e(data.title)}</title></head>'
        f"<body>{body}</body></html>\n"
    )


def badges(data: ReportData) -> list[tuple[str, str]]:
    """The summary at the top of the page: (text, kind) with kind one of ok, warn, bad, info."""
    out = []
    if data.unreadable:
        out.append((f"{len(data.unreadable)} event file(s) could not be read", "bad"))
    if data.process_count > 1:
        out.append((f"job of {data.process_count} processes", "info"))
    if data.job_verdict is not None and data.job_verdict["processes"]:
        slow = sorted({p for p, _ in data.job_verdict["stragglers"]})
        if slow:
            out.append((f"straggler: process {', '.join(map(str, slow))}", "bad"))
        else:
            out.append(("no straggler", "ok"))
    for index in data.gpu_indices():
        s = data.series.get(schema.gpu_key(index, "sm_activity_percent")) or data.series.get(
            schema.gpu_key(index, "utilization_percent")
        )
        if s and s.values:
            what = "SM activity" if s.key.endswith("sm_activity_percent") else "utilization"
            mean = s.stats()[1]
            out.append((f"GPU {index}: {what} {mean:.0f}%", "ok" if mean >= 70 else "warn"))
    if health.has_health(data):
        n = sum(len(g.attention) for g in health.gpu_health(data))
        out.append((f"GPU health: {n} finding(s)", "warn") if n else ("GPU health: nothing to note", "ok"))
    if data.verdict:
        cat = data.verdict["category"]
        bound = data.verdict.get("speedup_bound")
        label = cat if bound is None or cat == "unknown" else f"{cat} (at most {bound:.2f}x faster without the wait)"
        out.append((label, "bad" if cat.startswith("highly") else "warn" if cat.startswith("moderately") else "ok"))
    if data.plan is not None:
        out.append((f"batch plan: {data.plan['chosen']} ({data.plan['objective']})", "info"))
    if data.oom_seen:
        n = data.oom_count() or 0
        out.append((f"{n} OOM recover{'y' if n == 1 else 'ies'}", "warn" if n else "ok"))
    if data.memory_verdict:
        cat = data.memory_verdict["category"]
        out.append((f"memory {cat}", "bad" if cat == "grows" else "ok" if cat == "stable" else "info"))
    if data.profiles:
        out.append((f"{len(data.profiles)} profiler window(s)", "info"))
    if data.findings is not None:
        n = len(data.findings)
        out.append((f"{n} mixed-precision finding(s)", "warn" if n else "ok"))
    return out


def _img(pngs: dict[str, bytes], name: str, alt: str) -> str:
    if name not in pngs:
        return ""
    b64 = base64.b64encode(pngs[name]).decode("ascii")
    return (
        f'<figure class="kgt-fig" data-figure="{e(name)}"><img alt="{e(alt)}" '
        f'src="data:image/png;base64,{b64}"/></figure>'
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    h = "".join(f"<th>{e(str(c))}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{prose(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{prose(x)}</li>" for x in items) + "</ul>"


def _gpus_and_host(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if not (data.series or data.gpus):
        return []
    parts = ["<h3>GPUs and host</h3>"]
    if data.gpus:
        by_process = any(g.get("process") for g in data.gpus)
        parts.append(
            _table(
                ["GPU", "name", "memory", "compute capability", "UUID"] + (["process"] if by_process else []),
                [
                    (g["index"], g["name"], g["memory"], g["compute capability"], g.get("uuid", ""))
                    + ((g.get("process", ""),) if by_process else ())
                    for g in data.gpus
                ],
            )
        )
    else:
        parts.append("<p>No GPU was monitored: host metrics only.</p>")
    for index in data.gpu_indices():
        parts.append(_img(pngs, f"gpu_{index}", f"GPU {index} utilization and memory over time"))
    parts.append(_img(pngs, "host", "host CPU and memory over time"))
    if data.series:
        parts.append(
            "<details><summary>All series (min / mean / max / last)</summary>"
            + _table(
                ["metric", "min", "mean", "max", "last"],
                [
                    (k, *(format_number(v, decimals=1) for v in s.stats()))
                    for k, s in sorted(data.series.items())
                    if s.values
                ],
            )
            + "</details>"
        )
    return parts


def _gpu_health(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if not health.has_health(data):
        return []
    gpus = health.gpu_health(data)
    flagged = [g for g in gpus if g.attention]
    parts = [f"<h3>{health.HEADING}</h3>"]
    if not flagged:
        parts.append(f'<p class="kgt-health-ok">{prose(health.summary_line(gpus))}</p>')
    for g in flagged:
        parts.append(f'<p class="kgt-health">GPU {e(g.label)}:</p>' + _list(g.attention))
        parts.append(_img(pngs, f"health_{g.label}", f"GPU {g.label} throttle reasons, SM clock and power per epoch"))
    energy, unsupported = health.energy_lines(data, gpus), health.unsupported_lines(gpus)
    if energy:
        parts.append(f"<p>{e(health.ENERGY)}</p>" + _list(energy))
    if unsupported:
        parts.append(f"<p>{e(health.UNSUPPORTED)}</p>" + _list(unsupported))
    return parts


def _job(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if not data.is_job():
        return []
    parts = [f"<h3>{e(text.job_heading(data))}</h3>"]
    rows, single = data.job_rows()
    intro = text.job_intro(data)
    if intro is not None:
        parts.append(f"<p>{prose(intro)}</p>")
    if rows:
        parts.append(
            _table(
                ["job-wide figure at the last epoch", "min", "mean", "max"],
                [(n, *(format_number(v, decimals=1) for v in stats)) for n, *stats in rows],
            )
        )
    if single:
        parts.append(_table(["figure", "value"], [(n, format_metric(n, v)) for n, v in single]))
    jv = data.job_verdict
    if jv is not None:
        parts.append("<p>Input pipeline of each process (its steady state):</p>")
        if jv["processes"]:
            parts.append(_table(text.JOB_VERDICT_HEADER, text.job_process_rows(jv)))
            cls = "kgt-straggler" if jv["stragglers"] else "kgt-no-straggler"
            parts.append(f'<p class="{cls}">{prose(jv["message"])}</p>')
            if jv["advice"]:
                parts.append("<p>What to change:</p>" + _list(jv["advice"]))
        else:
            parts.append(f"<pre>{prose(jv['text'])}</pre>")
    if data.job_profiles:
        parts.append("<p>Profiler windows of the job (one session, one trace per process):</p>")
        for p in data.job_profiles:
            parts += _job_profile(p)
    return parts


def _job_profile(p: dict[str, Any]) -> list[str]:
    where = p["trace_dir"] or "no trace file"
    parts = [
        f'<p class="kgt-job-profile">steps {e(p["steps"])}: {len(p["files"])} trace files of '
        f"{p['processes']} processes in <code>{e(where)}</code></p>"
    ]
    rows = [
        (f"{i} (slowest)" if i == p["slowest"] else str(i), "not measured" if ms is None else format_milliseconds(ms))
        for i, ms in enumerate(p["mean_step_ms"])
    ]
    parts.append(_table(["process", "mean step in the window"], rows))
    if p["files"]:
        parts.append(_list(f"trace: {os.path.basename(f)}" for f in p["files"]))
    if len(p["files"]) < p["processes"]:
        parts.append(
            f"<p>Only {len(p['files'])} of {p['processes']} processes' traces are there "
            "(is log_dir shared by every host?)</p>"
        )
    parts.append(f"<p>xprof over every trace: {prose(p['conclusion'] or text.NO_XPROF)}</p>")
    return parts


def _step_time(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if "step_time" not in pngs:
        return []
    parts = ["<h3>Step time</h3>", _img(pngs, "step_time", "step time split into input wait, compute and other")]
    tp = [(k, format_metric(k, data.throughput[k])) for k in sorted(data.throughput)]
    if tp:
        parts.append(
            "<details><summary>Figures of the whole run</summary>" + _table(["figure", "value"], tp) + "</details>"
        )
    return parts


def _input_pipeline(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    v = data.verdict
    if not v:
        return []
    parts = ["<h3>Input pipeline</h3>"]
    scope = f" ({v.get('span') or v['scope']})" if v.get("scope") else ""
    note = text.own_verdict_note(data)
    if note:
        parts.append(f"<p><i>{prose(note)}</i></p>")
    parts.append(f'<p><b class="kgt-verdict">{e(v["category"])}{e(scope)}</b>: {prose(v["message"])}</p>')
    if len(v.get("phases") or []) > 1:
        parts.append(
            _table(
                ["phase", "steps", "waiting", "step", "in the verdict"],
                [
                    (
                        p["label"],
                        p["steps"],
                        format_percent(p["wait_fraction"]),
                        format_milliseconds(p["step_ms"]),
                        "yes" if p["steady"] else f"no: {p['reason'] or 'warm-up'}",
                    )
                    for p in v["phases"]
                ],
            )
        )
    if v.get("fit_wait_fraction") is not None and v.get("scope") not in ("", "the whole fit", WHOLE_FIT):
        parts.append(
            f"<p>Whole fit, every phase included: {format_percent(v['fit_wait_fraction'])} waiting for input.</p>"
        )
    parts += [f"<p>{prose(x)}</p>" for x in v["evidence"]]
    if v["advice"]:
        parts.append("<p>What to change:</p>" + _list(v["advice"]))
    return parts


def _step_breakdown(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    b = data.breakdown
    if not b:
        return []
    step = b["step"]
    rows_ = [
        (label, format_milliseconds(v * 1e3), format_percent(v / step if step else None))
        for label, v in b["parts"].items()
    ]
    rows_.append(("step", format_milliseconds(step * 1e3 if step is not None else None), "100%"))
    parts = [f"<h3>{text.BREAKDOWN_HEADING}</h3>", _table(["part (steady step)", "per step", "share"], rows_)]
    parts.append(f"<p>{prose(text.compile_line(b))}</p>")
    if b["largest"]:
        parts.append(f"<p>Largest part: <b>{e(b['largest'])}</b>.</p>" + (_list(b["advice"]) if b["advice"] else ""))
    return parts


def _batch_plan(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    plan = data.plan
    if plan is None:
        return []
    parts = [f"<h3>{e(text.plan_heading(plan))}</h3>", f'<p class="kgt-plan">{prose(plan["headline"])}</p>']
    if plan["candidates"]:
        parts.append(_table(TABLE_HEADER, table_rows(plan["candidates"], plan["chosen"])))
        parts.append(_img(pngs, "plan", "samples/s and peak memory against the batch size"))
        parts.append(
            f'<p class="kgt-src">* the plan; compile time is apart from samples/s; {prose(plan["method"])}</p>'
        )
    return parts


def _speedups(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    report = data.speedups
    if report is None:
        return []
    parts = [f"<h3>{e(text.SPEEDUPS_HEADING)}</h3>", f'<p class="kgt-plan">{prose(report.summary())}</p>']
    parts.append(_table(list(SPEEDUP_HEADER), report.table()))
    parts.append(_img(pngs, "speedups", "each measured change's speed-up over the fit as given"))
    return parts


def _out_of_memory(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if not data.oom_seen:
        return []
    parts = ["<h3>Out of memory</h3>", f"<p>{prose(text.recoveries(data))}</p>"]
    if data.oom_events:
        items = []
        for i, x in enumerate(data.oom_events):
            why = data.oom_details[i] if i < len(data.oom_details) else []
            items.append("<li>" + prose(x) + "".join(f"<br><small>{prose(w)}</small>" for w in why) + "</li>")
        parts.append("<ul>" + "".join(items) + "</ul>")
    if data.oom_headroom:
        parts.append("<p>Headroom:</p>" + _list(data.oom_headroom))
    rows = [(k, v if isinstance(v, str) else format_number(v)) for k, v in data.oom_summary.items()]
    if rows:
        parts.append(_table(["figure", "value"], rows))
    parts.append(_img(pngs, "oom", "out-of-memory events and micro-batches"))
    return parts


def _memory_over_time(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    m = data.memory_verdict
    if not m:
        return []
    scope = f" ({m['scope']})" if m["scope"] else ""
    parts = [f"<h3>{text.MEMORY_HEADING}</h3>"]
    parts.append(f'<p><b class="kgt-memory-verdict">memory {e(m["category"])}{e(scope)}</b>: {prose(m["message"])}</p>')
    parts += [f"<p>{prose(x)}</p>" for x in [*m["exhaustion"][1:], *m["evidence"]]]
    if m["advice"]:
        parts.append("<p>What to change:</p>" + _list(m["advice"]))
    parts.append(_img(pngs, "memory", "memory per epoch and per fit"))
    if len(m["fits"]) > 1:
        parts.append(_table(text.MEMORY_FITS_HEADER, text.memory_fit_rows(m)))
    return parts


def _profiler_windows(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
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
            (p["conclusion"] or "-") + (f" Why xprof differs: {p['xprof_reason']}" if p.get("xprof_reason") else ""),
        )
        for p in data.profiles
    ]
    head = ["steps", "reason", "mean step", "trace", "size", "input wait (this window)", "xprof conclusion"]
    return ["<h3>Profiler windows</h3>", _table(head, rows)]


def _layer_table(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    t = data.layer_table
    if t is None:
        return []
    head, lines = text.layer_table_lines(t)
    if t["error"]:
        return [f"<h3>{e(head)}</h3>", f"<p>{prose(lines[0])}</p>"]
    rows = [
        (
            r["path"],
            r["calls"] or "-",
            format_milliseconds(r["ms_per_step"]),
            f"{100 * r['share']:.1f}%",
            "-" if r["forward_ms"] is None else format_milliseconds(r["forward_ms"]),
            "-" if r["backward_ms"] is None else format_milliseconds(r["backward_ms"]),
        )
        for r in t["rows"][: text.LAYER_ROWS]
    ]
    table = _table(["layer", "calls", "per step", "share", "forward", "backward"], rows)
    return [f"<h3>{e(head)}</h3>", f"<p>{prose(lines[0])}</p>", table] + [f"<p>{prose(t['note'])}</p>"] * bool(
        t["note"]
    )


def _mixed_precision(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if data.findings is None:
        return []
    if not data.findings:
        return ["<h3>Mixed precision</h3>", f"<p>{text.NO_FINDING}</p>"]
    rows = [(f["kind"], f["layer"] or "", f["message"]) for f in data.findings]
    return ["<h3>Mixed precision</h3>", _table(["kind", "layer", "finding"], rows)]


def _training_curves(data: ReportData, pngs: dict[str, bytes]) -> list[str]:
    if "training" not in pngs:
        return []
    return ["<h3>Training curves</h3>", _img(pngs, "training", "loss and metrics per epoch")]
