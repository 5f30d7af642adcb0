"""Gathering the report from live callback objects (and Keras's `History` or the model).

Every source is offered to every section (`Section.from_callbacks`), which reads what it shows
of the sources it knows: a callback by its class (a subclass counts), a `History`, a plan.
Models come last: their History only where no other gave one, their mixed-precision check only
where none ran. This module imports neither Keras nor a framework (`sources`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.reporting import registry
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.sources import flatten, is_model

__all__ = ["flatten", "gather"]


def _offer(data: ReportData, source: Any) -> None:
    """`source` to every section; the first name a section gives it goes to the "From:" line."""
    names = [section.from_callbacks(data, source) for section in registry.SECTIONS]
    name = next((n for n in names if n), None)
    if name is not None:
        data.sources.append(name)


def gather(sources: Sequence[Any], title: str | None = None) -> ReportData:
    """Reads the callbacks, History or model given into a `ReportData`.

    Each is recognised by its class (a subclass of a package callback
    counts; a `BatchPlan` from `plan_batch_size` is shown as the plan); anything else (Keras's TensorBoard, a LiveView, ...) has nothing
    to add and is left out.
    """
    data = ReportData(title=title or "Training report")
    models = []
    for s in flatten(sources):
        if is_model(s):
            models.append(s)
        else:
            _offer(data, s)
    for model in models:
        h = getattr(model, "history", None)
        if h is not None and not data.training:
            _offer(data, h.history)
        _offer(data, model)
    return data
