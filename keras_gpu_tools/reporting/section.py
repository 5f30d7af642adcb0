"""What a report section is: the `Section` Protocol, and `BaseSection`, its defaults.

A section owns one feature's part of the report: what it gathers from the callbacks
(`from_callbacks`) and from a log directory (`from_logdir`), what it takes from a log
directory's report when the callbacks lack it (`fill`), and its views: text, HTML, figures,
badges at the top of the page, and what the run did not measure. The page (`text`, `html`,
`figures`, `from_callbacks`, `from_logdir`, `report`) calls every section of
`keras_gpu_tools.reporting.registry.SECTIONS`, in that order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from keras_gpu_tools.reporting.model import ReportData

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from keras_gpu_tools.reporting.logs import Logs

TextSection = tuple[str, list[str]]  # heading, lines
Badge = tuple[str, str]  # text, kind (ok, warn, bad, info)


@runtime_checkable
class Section(Protocol):
    """One section of the report. Its figures are drawn once (`figures`) and read by every view."""

    name: str  # its key in `ReportData.extra`, where a section keeps what has no field of its own
    badge_rank: int  # badges are shown by rank, then in the sections' order
    every_record: tuple[str, ...]  # the JSON tags of a log directory of which it reads every record, not the last

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        """Reads what it shows of one source (a callback, a History's dict, a plan, ...) into `data`.

        Returns the source's name for the report's "From:" line (None: nothing read, or nothing to name).
        """
        ...

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        """Reads what it shows from a log directory's runs and records into `data`."""
        ...

    def fill(self, data: ReportData, other: ReportData) -> None:
        """Takes from `other` (a log directory's) what `data` (the callbacks') lacks."""
        ...

    def text(self, data: ReportData) -> TextSection | None:
        """Its heading and lines (None: no data, no section)."""
        ...

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        """Its HTML parts (none: no data); its figures come as PNG bytes by name."""
        ...

    def figures(self, data: ReportData) -> dict[str, Figure]:
        """Its plots by name (none: no data); matplotlib is imported only here."""
        ...

    def badges(self, data: ReportData) -> list[Badge]:
        """Its part of the summary at the top of the page."""
        ...

    def not_measured(self, data: ReportData) -> list[str]:
        """What the run has no data for, and which callback measures it."""
        ...


class BaseSection:
    """A section that reads and shows nothing: the defaults a section overrides."""

    name = ""
    badge_rank = 0
    every_record: tuple[str, ...] = ()

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        return None

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        return None

    def fill(self, data: ReportData, other: ReportData) -> None:
        return None

    def text(self, data: ReportData) -> TextSection | None:
        return None

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        return []

    def figures(self, data: ReportData) -> dict[str, Figure]:
        return {}

    def badges(self, data: ReportData) -> list[Badge]:
        return []

    def not_measured(self, data: ReportData) -> list[str]:
        return []
