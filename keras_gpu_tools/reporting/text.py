"""The report as plain text, from a `ReportData`: the title, each section's text, what was not measured, notes.

Each section's text is its own (`keras_gpu_tools.reporting.sections`); `sections()` lists those
the run has data for, in the order of `keras_gpu_tools.reporting.registry.SECTIONS`.
"""

from __future__ import annotations

from keras_gpu_tools.reporting import registry
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import TextSection

# The speed-ups' heading, as the speed-ups' tests read it here.
from keras_gpu_tools.reporting.sections.speedups import HEADING as SPEEDUPS_HEADING  # noqa: F401


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


def sections(data: ReportData) -> list[TextSection]:
    """The sections the run has data for, in the report's order."""
    return [s for section in registry.SECTIONS if (s := section.text(data)) is not None]


def not_measured(data: ReportData) -> list[str]:
    """What this run's report has no data for, and which callback measures it."""
    return [what for section in registry.SECTIONS for what in section.not_measured(data)]
