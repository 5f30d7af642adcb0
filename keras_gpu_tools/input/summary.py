"""The detector's report: figure tables (plain text, also Markdown for TensorBoard's text tab), and its JSON records."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Verdict
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.units import format_ms, format_percent

if TYPE_CHECKING:
    from keras_gpu_tools.input.breakdown_advice import FitBreakdown
    from keras_gpu_tools.input.fit import EpochEnd, InputFit
    from keras_gpu_tools.input.stragglers import JobVerdict
    from keras_gpu_tools.logdir.writer import EventWriter


def _flops(value: float | None) -> str:
    if value is None:
        return "n/a"
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.2f} {unit}FLOP/s"
    return f"{value:.0f} FLOP/s"


def _rows(m: Measurement) -> list[tuple[str, str]]:
    return [
        ("wait for input / step", format_percent(m.wait_fraction)),
        ("step", format_ms(m.step)),
        ("wait", format_ms(m.wait)),
        ("fetch (host)", format_ms(m.fetch)),
        ("compute", format_ms(m.compute)),
        ("other (callbacks, Python)", format_ms(m.other)),
        ("steps/s", "n/a" if m.steps_per_sec is None else f"{m.steps_per_sec:.1f}"),
        ("samples/s", "n/a" if m.samples_per_sec is None else f"{m.samples_per_sec:.0f}"),
        ("achieved FLOP/s", _flops(m.flops_per_sec)),
        ("achieved FLOP/s per device", _flops(m.flops_per_sec_per_device)),
        ("MFU", format_percent(m.mfu)),
        ("without the wait, at most", "n/a" if m.speedup_bound is None else f"{m.speedup_bound:.2f}x faster"),
        ("steps (timed with a sync)", f"{m.steps} ({m.sampled_steps})"),
    ]


AGGREGATION_NOTE = (
    "Each figure of a span is time-weighted over the steps it covers: wait share = "
    "sum(steps x wait) / sum(steps x step) over its epochs (or windows)."
)


def summary_text(
    title: str, m: Measurement, v: Verdict, notes: Sequence[str] = (), fit: Measurement | None = None
) -> str:
    """A plain-text report (also valid Markdown for TensorBoard's text tab).

    With ``fit`` (the whole fit's figures, when the verdict covers only its
    steady state) the table has a column for each, and the phases follow.
    """
    head = f"{title}: {v.category}" + (f" ({v.span})" if v.scope else "")
    lines = [head, "", v.message, ""]
    if fit is not None and v.left_out:
        lines.append(f"| figure | {v.span} | whole fit |")
        lines.append("|---|---|---|")
        lines += [f"| {a} | {b} | {c} |" for (a, b), (_, c) in zip(_rows(m), _rows(fit))]
    else:
        lines.append("| figure | value |")
        lines.append("|---|---|")
        lines += [f"| {a} | {b} |" for a, b in _rows(m)]
    if len(v.phases) > 1:
        lines += ["", "| phase | steps | wait | step | in the verdict |", "|---|---|---|---|---|"]
        for p in v.phases:
            kept = "yes" if p.steady else f"no: {p.reason or 'warm-up'}"
            lines.append(
                f"| {p.label} | {p.steps} | {format_percent(p.wait_fraction)} | {format_ms(p.step)} | {kept} |"
            )
        lines += ["", AGGREGATION_NOTE]
    for e in v.evidence:
        lines += ["", e]
    if v.advice:
        lines += ["", "What to change:"]
        lines += [f"- {a}" for a in v.advice]
    for n in notes:
        lines += ["", n]
    return "\n".join(lines)


def run_summary(fit: InputFit, notes: Sequence[str] = (), breakdown: FitBreakdown | None = None) -> str:
    """The detector's report of a fit: verdict, figures (steady state and whole fit), phases, advice, the job,
    and the step breakdown."""
    m, v, job = fit.measurement, fit.verdict, fit.job_verdict
    if v is None or m is None:
        return "InputBoundDetector: no training step measured yet."
    text = summary_text("InputBoundDetector", m, v, notes, fit=fit.fit_measurement)
    if job is not None:
        text += f"\n\nThe job ({len(job.processes)} processes; each one's steady state):\n\n" + job.text()
    if breakdown is not None:
        text += "\n\n" + "\n".join(breakdown.section())
    return text


def write_epoch(
    writer: EventWriter, scope: str, end: EpochEnd, job: JobVerdict | None, step: int, wall_time: float | None = None
) -> None:
    """An epoch's verdict as text, and as JSON for the report (``input/verdict/data``), at ``wall_time`` (now)."""
    m, v = end.measurement, end.verdict
    writer.text(schema.INPUT_VERDICT, summary_text(scope.capitalize(), m, v), step=step, wall_time=wall_time)
    record: dict[str, Any] = {"scope": scope, "verdict": v, "measurement": m, "figures": end.logs}
    if job is not None:
        record[schema.JOB] = job
    writer.json(schema.INPUT_VERDICT_DATA, record, step=step, wall_time=wall_time)


def write_epoch_later(
    writer: EventWriter, scalars: dict[str, float], scope: str, end: EpochEnd, job: JobVerdict | None, step: int
) -> None:
    """The epoch end's events, handed over to be written off the training thread (``EventWriter.later``).

    ``scalars`` (the last window's figures, the step breakdown's) and the verdict, as :func:`write_epoch`
    writes it, with this call's time; nothing of them changes after the epoch's end.
    """
    writer.scalars_later(scalars, step)
    wall_time = time.time()
    writer.later(lambda: write_epoch(writer, scope, end, job, step, wall_time))


def write_fit(
    writer: EventWriter, fit: InputFit, notes: Sequence[str], step: int, breakdown: FitBreakdown | None = None
) -> None:
    """The run's verdict: the summary as text, and as JSON for the report (the job's as of the last epoch end);
    the step breakdown as text and JSON of its own; what was handed over to ``writer`` first, in its order."""
    writer.write_later()
    m = fit.measurement
    writer.text(schema.INPUT_VERDICT, run_summary(fit, notes, breakdown), step=step)
    if breakdown is not None:
        writer.text(schema.STEP_BREAKDOWN, "\n".join(breakdown.section()), step=step)
        writer.json(schema.STEP_BREAKDOWN_DATA, breakdown.record(), step=step)
    assert m is not None, "written once the fit has a verdict, which comes with its measurement"
    record: dict[str, Any] = {
        "scope": "fit",
        "verdict": fit.verdict,  # with its scope, phases and speedup bound
        "measurement": m,  # the steady state's figures
        "figures": m.logs(),
        "fit_figures": fit.fit_measurement.logs() if fit.fit_measurement is not None else {},
        "notes": notes,
    }
    if fit.job_verdict is not None:
        record[schema.JOB] = fit.job_verdict
    writer.json(schema.INPUT_VERDICT_DATA, record, step=step)
