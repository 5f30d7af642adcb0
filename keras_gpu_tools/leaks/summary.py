"""The memory verdict in words (the summary, the terminal's lines) and its event-file records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keras_gpu_tools.leaks.fits import FitRecord
from keras_gpu_tools.leaks.verdict import LeakVerdict
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain

if TYPE_CHECKING:
    from keras_gpu_tools.logdir.writer import EventWriter

_FIGURES = (
    (schema.MEMORY_HOST_RSS_MIB, "host RSS (MiB)"),
    (schema.MEMORY_DEVICE_IN_USE_MIB, "device in use (MiB)"),
    (schema.MEMORY_DEVICE_RESERVED_MIB, "device reserved (MiB)"),
    (schema.MEMORY_LIVE_TENSORS, "live tensors"),
    (schema.MEMORY_COMPILED_FUNCTIONS, "compiled functions"),
)


def summary_text(v: LeakVerdict | None, epochs: Sequence[dict[str, float]], fits: Sequence[dict[str, Any]]) -> str:
    """The verdict, its evidence and fixes, and the figures per epoch and per fit (Markdown-compatible text)."""
    if v is None:
        return "Memory: no fit() has run with this detector yet."
    lines = [f"Memory: {v.category}" + (f" ({v.scope})" if v.scope else ""), "", v.message]
    if v.exhaustion[1:]:
        lines += [""] + list(v.exhaustion[1:])
    if v.evidence:
        lines += ["", "Evidence:"] + [f"- {e}" for e in v.evidence]
    if v.advice:
        lines += ["", "What to change:"] + [f"- {a}" for a in v.advice]
    cols = [(k, label) for k, label in _FIGURES if any(k in e for e in epochs)]
    if epochs and cols:
        lines += ["", "| epoch | " + " | ".join(label for _, label in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for i, e in enumerate(epochs):
            cells = [_cell(e.get(k)) for k, _ in cols]
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    if len(fits) > 1:
        lines += [
            "",
            "| fit | model | epochs | host RSS at its end (MiB) | device in use (MiB) |",
            "|---|---|---|---|---|",
        ]
        for f in fits:
            lines.append(
                f"| {f['fit']} | {f['model']} | {f['epochs']} | {_cell(f.get('host_rss_mib'))} | "
                f"{_cell(f.get('device_in_use_mib'))} |"
            )
    return "\n".join(lines)


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def epoch_line(epoch: int, figures: dict[str, float]) -> str:
    """One line per epoch (verbose=2): the memory now and its growth where claimed."""
    parts = [f"host {figures[schema.MEMORY_HOST_RSS_MIB]:,.0f} MiB"] if schema.MEMORY_HOST_RSS_MIB in figures else []
    if schema.MEMORY_HOST_GROWTH in figures:
        parts[-1:] = [f"{parts[-1] if parts else 'host'} ({figures[schema.MEMORY_HOST_GROWTH]:+.1f} MiB/epoch)"]
    if schema.MEMORY_DEVICE_IN_USE_MIB in figures:
        dev = f"device {figures[schema.MEMORY_DEVICE_IN_USE_MIB]:,.0f} MiB"
        if schema.MEMORY_DEVICE_GROWTH in figures:
            dev += f" ({figures[schema.MEMORY_DEVICE_GROWTH]:+.1f} MiB/epoch)"
        parts.append(dev)
    return f"MemoryLeakDetector: epoch {epoch + 1}: " + (", ".join(parts) or "no figure")


def fit_lines(v: LeakVerdict, run_dir: str | None) -> list[str]:
    """The end of a fit (verbose=1): the verdict and where the details are."""
    where = f"Details: detector.summary(), TensorBoard run {run_dir}." if run_dir else "Details: detector.summary()."
    return [f"MemoryLeakDetector: memory {v.category}: {v.message} {where}"]


def write_epoch(writer: EventWriter, figures: dict[str, float], step: int) -> None:
    """An epoch's figures, handed over to be written off the training thread (``EventWriter.scalars_later``)."""
    writer.scalars_later(figures, step=step)


def write_fit(
    writer: EventWriter,
    v: LeakVerdict,
    text: str,
    epochs: Sequence[dict[str, float]],
    fits: Sequence[FitRecord],
    step: int,
) -> None:
    """The fit's verdict: text for TensorBoard's Text tab, JSON for the report (after what was handed over)."""
    writer.write_later()
    writer.text(schema.MEMORY_VERDICT, text, step=step)
    record = {"verdict": to_plain(v), "epochs": list(epochs), "fits": [f.row() for f in fits]}
    writer.json(schema.MEMORY_VERDICT_DATA, record, step=step)
