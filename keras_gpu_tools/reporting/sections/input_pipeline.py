"""Input pipeline: the input-bound verdict, its phases (epochs in it and left out), evidence and advice.

From `InputBoundDetector` (``verdict``, ``summary()``, ``fit_measurement``) or its run: the JSON
``input/verdict/data`` (the last one written: the whole fit's) and the text ``input/verdict``.
"""

from __future__ import annotations

from typing import Any

from keras_gpu_tools.input.span import WHOLE_FIT, span_name
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import bullets, e, prose, table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sections.job import job_heading
from keras_gpu_tools.reporting.sources import input_detector, name_of
from keras_gpu_tools.reporting.values import finite, floats
from keras_gpu_tools.runtime.units import format_milliseconds, format_percent

HEADING = "Input pipeline"


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


def _whole_fit_apart(v: dict[str, Any]) -> bool:
    """Whether the verdict covers less than the whole fit, whose wait is then said apart."""
    return v.get("fit_wait_fraction") is not None and v.get("scope") not in ("", "the whole fit", WHOLE_FIT)


class InputPipeline(BaseSection):
    name = "input_pipeline"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        det = input_detector(source)
        if det is None:
            return None
        if det.verdict is not None:
            fit = getattr(det, "fit_measurement", None)
            data.verdict = verdict_dict(to_plain(det.verdict), det.summary(), fit.logs() if fit is not None else None)
        return name_of(det)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        text = logs.prose.get(schema.INPUT_VERDICT, "")  # the last one written: the whole fit's, like its JSON
        verdict = logs.convert(
            data,
            schema.INPUT_VERDICT_DATA,
            lambda v: (verdict_dict(v["verdict"], text, v.get("fit_figures")), floats(v["figures"])),
        )
        if verdict is not None:
            data.verdict = verdict[0]
            data.throughput.update(verdict[1])

    def fill(self, data: ReportData, other: ReportData) -> None:
        if data.verdict is None:
            data.verdict = other.verdict

    def text(self, data: ReportData) -> TextSection | None:
        v = data.verdict
        if not v:
            return None
        scope = f" ({v.get('span') or v['scope']})" if v.get("scope") else ""
        body = [f"Verdict: {v['category']}{scope}", v["message"]]
        note = own_verdict_note(data)
        if note:
            body.insert(0, note)
        if _whole_fit_apart(v):
            body.append(f"Whole fit, every phase included: {format_percent(v['fit_wait_fraction'])} waiting for input.")
        if len(v.get("phases") or []) > 1:
            body += ["Phases:"] + [f"- {phase_line(p)}" for p in v["phases"]]
        body += list(v["evidence"])
        if v["advice"]:
            body += ["What to change:"] + [f"- {a}" for a in v["advice"]]
        return HEADING, body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        v = data.verdict
        if not v:
            return []
        parts = [f"<h3>{HEADING}</h3>"]
        scope = f" ({v.get('span') or v['scope']})" if v.get("scope") else ""
        note = own_verdict_note(data)
        if note:
            parts.append(f"<p><i>{prose(note)}</i></p>")
        parts.append(f'<p><b class="kgt-verdict">{e(v["category"])}{e(scope)}</b>: {prose(v["message"])}</p>')
        if len(v.get("phases") or []) > 1:
            parts.append(
                table(
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
        if _whole_fit_apart(v):
            parts.append(
                f"<p>Whole fit, every phase included: {format_percent(v['fit_wait_fraction'])} waiting for input.</p>"
            )
        parts += [f"<p>{prose(x)}</p>" for x in v["evidence"]]
        if v["advice"]:
            parts.append("<p>What to change:</p>" + bullets(v["advice"]))
        return parts

    def badges(self, data: ReportData) -> list[Badge]:
        if not data.verdict:
            return []
        cat = data.verdict["category"]
        bound = data.verdict.get("speedup_bound")
        label = cat if bound is None or cat == "unknown" else f"{cat} (at most {bound:.2f}x faster without the wait)"
        return [(label, "bad" if cat.startswith("highly") else "warn" if cat.startswith("moderately") else "ok")]


SECTION = InputPipeline()
