"""Mixed precision: the findings of `MixedPrecisionCheck` (or of the check run on the model given).

From `MixedPrecisionCheck` (``findings``), the model (`check_mixed_precision`), or the JSON
``mixed_precision/findings/data`` of the run ``report`` (`TrainingReport.write_to_tensorboard`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sources import is_model, mixed_precision_check, name_of

HEADING = "Mixed precision"
NO_FINDING = "No mixed-precision finding."


def finding_dict(rec: dict[str, Any]) -> dict[str, str | None]:
    """A mixed-precision finding of the report from a `MixedPrecisionFinding` record."""
    layer = rec.get("layer")
    return {
        "kind": str(rec.get("kind", "?")),
        "layer": None if layer is None else str(layer),
        "message": str(rec.get("message", "")),
    }


def findings_markdown(findings: Sequence[dict[str, str | None]]) -> str:
    """The mixed-precision findings as a Markdown list."""
    if not findings:
        return NO_FINDING
    return "\n".join(
        f"- [{f['kind']}]" + (f" `{f['layer']}`" if f["layer"] else "") + f": {f['message']}" for f in findings
    )


class MixedPrecision(BaseSection):
    name = "mixed_precision"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        check = mixed_precision_check(source)
        if check is not None:
            data.findings = [finding_dict(to_plain(f)) for f in check.findings]
            return name_of(check)
        if is_model(source) and data.findings is None:  # the model's check, where none ran
            try:
                from keras_gpu_tools.mixed_precision.check import check_mixed_precision

                data.findings = [finding_dict(to_plain(f)) for f in check_mixed_precision(source)]
                return "check_mixed_precision(model)"
            except Exception as e:
                data.notes.append(f"The mixed-precision check failed ({type(e).__name__}: {e}).")
        return None

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        findings = logs.convert(data, schema.MIXED_PRECISION_FINDINGS_DATA, lambda v: [finding_dict(r) for r in v])
        if findings is not None:
            data.findings = findings

    def fill(self, data: ReportData, other: ReportData) -> None:
        if data.findings is None:
            data.findings = other.findings

    def text(self, data: ReportData) -> TextSection | None:
        if data.findings is None:
            return None
        if not data.findings:
            return HEADING, [NO_FINDING]
        return HEADING, [
            f"- [{f['kind']}]" + (f" {f['layer']}" if f["layer"] else "") + f": {f['message']}" for f in data.findings
        ]

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if data.findings is None:
            return []
        if not data.findings:
            return [f"<h3>{HEADING}</h3>", f"<p>{NO_FINDING}</p>"]
        rows = [(f["kind"], f["layer"] or "", f["message"]) for f in data.findings]
        return [f"<h3>{HEADING}</h3>", table(["kind", "layer", "finding"], rows)]

    def badges(self, data: ReportData) -> list[Badge]:
        if data.findings is None:
            return []
        n = len(data.findings)
        return [(f"{n} mixed-precision finding(s)", "warn" if n else "ok")]

    def not_measured(self, data: ReportData) -> list[str]:
        return ["mixed-precision findings (MixedPrecisionCheck, or pass the model)"] if data.findings is None else []


SECTION = MixedPrecision()
