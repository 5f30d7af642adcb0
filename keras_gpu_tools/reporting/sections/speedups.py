"""Speed-ups: `find_speedups`' report: the summary, a row per change, the code of those that paid, its figure.

From the `SpeedupReport` given to `report()` or the JSON ``speedups/summary/data`` of the run ``speedups``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import e, img, prose, table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import BaseSection, TextSection
from keras_gpu_tools.speedups.report import HEADER, SpeedupReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADING = "Speed-ups (find_speedups)"


class Speedups(BaseSection):
    name = "speedups"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        if not isinstance(source, SpeedupReport):
            return None
        data.speedups = source
        return "find_speedups"

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        speedups = logs.convert(data, schema.SPEEDUPS_SUMMARY_DATA, SpeedupReport.from_dict)
        if speedups is not None:
            data.speedups = speedups

    def fill(self, data: ReportData, other: ReportData) -> None:
        if data.speedups is None:
            data.speedups = other.speedups

    def text(self, data: ReportData) -> TextSection | None:
        """The speed-ups as `print(report)` shows them: the summary, a row per change, the code of those that paid."""
        if data.speedups is None:
            return None
        return HEADING, str(data.speedups).splitlines()

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        report = data.speedups
        if report is None:
            return []
        parts = [f"<h3>{e(HEADING)}</h3>", f'<p class="kgt-plan">{prose(report.summary())}</p>']
        parts.append(table(list(HEADER), report.table()))
        parts.append(img(pngs, "speedups", "each measured change's speed-up over the fit as given"))
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        if data.speedups is not None and any(r.speedup is not None for r in data.speedups.rows):
            return {"speedups": data.speedups.plot()}
        return {}


SECTION = Speedups()
