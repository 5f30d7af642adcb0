"""The report's plots: each section's figures (`Section.figures`), drawn once for every view.

matplotlib is imported when a figure is first drawn, never at module import (`drawing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keras_gpu_tools.reporting import drawing, registry
from keras_gpu_tools.reporting.model import ReportData

if TYPE_CHECKING:
    from matplotlib.figure import Figure

available = drawing.available
png = drawing.png


def draw(data: ReportData) -> dict[str, Figure]:
    """The report's plots by name (``gpu_<i>``, ``host``, ``health_<i>``, ``step_time``, ``plan``, ``speedups``,
    ``oom``, ``memory``, ``training``), in the sections' order.

    A plot is drawn only where the run has data for it.
    """
    figs: dict[str, Figure] = {}
    for section in registry.SECTIONS:
        figs.update(section.figures(data))
    for fig in figs.values():
        drawing.literal(fig)
    return figs
