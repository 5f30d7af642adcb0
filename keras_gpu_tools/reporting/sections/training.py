"""Training curves: the loss and metrics Keras logged per epoch.

From a `History` (its dict, or the model's) or Keras's own runs (``train``, ``validation``: ``epoch_*``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import img
from keras_gpu_tools.reporting.model import ReportData, Series, extend
from keras_gpu_tools.reporting.section import BaseSection, TextSection
from keras_gpu_tools.reporting.sources import history_of
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADING = "Training curves"


def epoch_series(key: str, values: list[Any]) -> Series:
    """A History list as a series on the epoch axis (1, 2, ...), its non-numbers left out."""
    s = Series(key)
    for i, v in enumerate(values):
        if finite(v) is not None:
            s.add(0.0, i + 1, float(v))
    return s


def training_key(run: str, name: str) -> str:
    """The History key of Keras's `epoch_<name>` in a run: `loss`, `val_loss`, ..."""
    if run in (schema.KERAS_TRAIN_RUN, "."):
        return name
    if run == schema.KERAS_VALIDATION_RUN:
        return f"val_{name}"
    return f"{run.split('/')[-1][:3]}_{name}"


class TrainingCurves(BaseSection):
    name = "training"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        hist = history_of(source)
        for key, values in (hist or {}).items():
            if not key.startswith(schema.OWN_PREFIXES):  # the package's own keys are other sections'
                s = epoch_series(key, values)
                if s.values:
                    data.training[key] = s
        return None

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        for run, tag, points in logs.scalars():
            if tag.startswith(schema.KERAS_EPOCH_PREFIX):
                name = tag[len(schema.KERAS_EPOCH_PREFIX) :]
                if not name.startswith(schema.OWN_PREFIXES):
                    # (our own epoch logs, which Keras's TensorBoard copies, are read from our runs)
                    extend(data.training, training_key(run, name), points, step_offset=1)

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.training:
            data.training = other.training

    def text(self, data: ReportData) -> TextSection | None:
        if not data.training:
            return None
        return HEADING, [
            f"{k}: " + ", ".join(format_number(v) for v in s.values) for k, s in sorted(data.training.items())
        ]

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if "training" not in pngs:
            return []
        return [f"<h3>{HEADING}</h3>", img(pngs, "training", "loss and metrics per epoch")]

    def figures(self, data: ReportData) -> dict[str, Figure]:
        return {"training": _training_figure(data)} if data.training else {}


def _training_figure(data: ReportData) -> Figure:
    from matplotlib.ticker import MaxNLocator

    from keras_gpu_tools.runtime.figure import ShownFigure

    names = sorted({k[4:] if k.startswith("val_") else k for k in data.training})
    names = [n for n in names if n != "learning_rate"] or names
    cols = min(len(names), 2)
    rows = -(-len(names) // cols)
    fig = ShownFigure(figsize=(8.0, 2.4 * rows + 0.3), dpi=100, layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(len(names))]
    for ax, name in zip(axes, names):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch", fontsize=8)
        for key, style in ((name, "-"), (f"val_{name}", "--")):
            s = data.training.get(key)
            if s and s.values:
                ax.plot(s.steps, s.values, style, marker="o", markersize=3, label=key)
        ax.set_title(name, fontsize=9, loc="left")
        ax.legend(fontsize=7)
    fig.suptitle("Training curves", fontsize=11)
    return fig


SECTION = TrainingCurves()
