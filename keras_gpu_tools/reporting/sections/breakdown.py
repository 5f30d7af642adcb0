"""Step breakdown: the steady step's parts (compilation apart), the compilation and retraces, the largest
part and its advice.

From `InputBoundDetector` (``breakdown.record()``) or its run: the JSON ``step/breakdown/data``.
"""

from __future__ import annotations

from typing import Any

from keras_gpu_tools.input.breakdown_advice import LABELS, collective_note
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import bullets, e, prose, table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import BaseSection, TextSection
from keras_gpu_tools.reporting.sources import input_detector, name_of
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_milliseconds, format_percent

HEADING = "Step breakdown"


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


def compile_line(b: dict[str, Any]) -> str:
    """``Compile/trace: 0.91 s over the fit, 1 retrace (shapes: ...).``"""
    n = b["retraces"]
    shapes = f" (shapes: {'; '.join(b['shapes'][:4])})" if n and b["shapes"] else ""
    return f"Compile/trace: {b['compile_seconds']:.2f} s over the fit, {n} retrace{'' if n == 1 else 's'}{shapes}."


class StepBreakdown(BaseSection):
    name = "breakdown"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        det = input_detector(source)
        if det is None:
            return None
        fb = getattr(det, "breakdown", None)
        if fb is not None:
            data.breakdown = breakdown_dict(fb.record())
        return name_of(det)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        breakdown = logs.convert(data, schema.STEP_BREAKDOWN_DATA, breakdown_dict)
        if breakdown is not None:
            data.breakdown = breakdown

    def text(self, data: ReportData) -> TextSection | None:
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
        return HEADING, body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        b = data.breakdown
        if not b:
            return []
        step = b["step"]
        rows = [
            (label, format_milliseconds(v * 1e3), format_percent(v / step if step else None))
            for label, v in b["parts"].items()
        ]
        rows.append(("step", format_milliseconds(step * 1e3 if step is not None else None), "100%"))
        parts = [f"<h3>{HEADING}</h3>", table(["part (steady step)", "per step", "share"], rows)]
        parts.append(f"<p>{prose(compile_line(b))}</p>")
        if b["largest"]:
            parts.append(
                f"<p>Largest part: <b>{e(b['largest'])}</b>.</p>" + (bullets(b["advice"]) if b["advice"] else "")
            )
        return parts


SECTION = StepBreakdown()
