"""Batch size plan: `plan_batch_size`'s plan, its candidates' table and samples/s and peak memory against the batch.

From the `BatchPlan` given to `report()` or the JSON ``plan/summary/data`` of the run ``plan``
(``plan_batch_size(log_dir=...)``; the last plan written).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.memory.search import BatchPlan
from keras_gpu_tools.memory.throughput import TABLE_HEADER, table_rows
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import e, img, prose, table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADING = "Batch size plan"


def plan_heading(plan: dict[str, Any]) -> str:
    """``Batch size plan (throughput)``."""
    return f"{HEADING} ({plan['objective']})"


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


class Plan(BaseSection):
    name = "plan"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        if not isinstance(source, BatchPlan):
            return None
        data.plan = plan_row(source.as_dict())
        return "plan_batch_size"

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        plan = logs.convert(data, schema.PLAN_SUMMARY_DATA, plan_row)  # the last plan written
        if plan is not None:
            data.plan = plan

    def fill(self, data: ReportData, other: ReportData) -> None:
        if data.plan is None:
            data.plan = other.plan

    def text(self, data: ReportData) -> TextSection | None:
        """The plan as `print(plan)` shows it: the batch, why, and by throughput the candidates' table."""
        if data.plan is None:
            return None
        return plan_heading(data.plan), data.plan["text"].splitlines()

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        plan = data.plan
        if plan is None:
            return []
        parts = [f"<h3>{e(plan_heading(plan))}</h3>", f'<p class="kgt-plan">{prose(plan["headline"])}</p>']
        if plan["candidates"]:
            parts.append(table(TABLE_HEADER, table_rows(plan["candidates"], plan["chosen"])))
            parts.append(img(pngs, "plan", "samples/s and peak memory against the batch size"))
            parts.append(
                f'<p class="kgt-src">* the plan; compile time is apart from samples/s; {prose(plan["method"])}</p>'
            )
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        """The throughput plan's candidates: samples/s and peak memory against the batch (the plan's own figure)."""
        if data.plan is None or not any(c.measured for c in data.plan["candidates"]):
            return {}
        from keras_gpu_tools.memory import throughput_plot

        return {"plan": throughput_plot.figure(data.plan["candidates"], data.plan["chosen"])}

    def badges(self, data: ReportData) -> list[Badge]:
        if data.plan is None:
            return []
        return [(f"batch plan: {data.plan['chosen']} ({data.plan['objective']})", "info")]


SECTION = Plan()
