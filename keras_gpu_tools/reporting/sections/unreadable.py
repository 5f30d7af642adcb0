"""The event files of a log directory that could not be read (the reader names them, with why)."""

from __future__ import annotations

from keras_gpu_tools.reporting.markup import e
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection

HEADING = "Event files that could not be read"


class Unreadable(BaseSection):
    name = "unreadable"
    badge_rank = -2  # first: the report may lack what these files held

    def fill(self, data: ReportData, other: ReportData) -> None:
        data.unreadable = other.unreadable

    def text(self, data: ReportData) -> TextSection | None:
        return (HEADING, [f"- {path} {why}" for path, why in data.unreadable]) if data.unreadable else None

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if not data.unreadable:
            return []
        return [
            f"<h3>{HEADING}</h3>",
            "<ul>" + "".join(f"<li>{e(p)} {e(why)}</li>" for p, why in data.unreadable) + "</ul>",
        ]

    def badges(self, data: ReportData) -> list[Badge]:
        return [(f"{len(data.unreadable)} event file(s) could not be read", "bad")] if data.unreadable else []


SECTION = Unreadable()
