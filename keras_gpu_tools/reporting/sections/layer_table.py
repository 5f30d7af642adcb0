"""Time per layer: the last profiled window's heaviest Keras layers, forward and backward.

From `ProfilerWindow` (``layer_table()``) or its run: the JSON ``profile/steps_<first>_<last>/layers/data``
of the last window.
"""

from __future__ import annotations

from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.profiling.capture import copies_sentence, steps_name
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import e, prose, table
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import BaseSection, TextSection
from keras_gpu_tools.reporting.sources import name_of, profiler
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_milliseconds

LAYER_ROWS = 10  # rows of the layer table the report shows (the heaviest)


def layer_table_dict(rec: dict[str, Any]) -> dict[str, Any]:
    """A profiled window's time per Keras layer from a `LayerTable` record: its steps, source, error and rows."""
    start, n = int(rec["start_step"]), int(rec["num_steps"])
    return {
        "start": start,
        "span": steps_name(start, n),
        "source": str(rec.get("source") or ""),
        "total_ms": finite(rec.get("total_ms_per_step")),
        "copy_ms": finite(rec.get("copy_ms_per_step")),
        "error": str(rec.get("error") or ""),
        "note": str(rec.get("note") or ""),
        "rows": [
            {
                "path": str(r["path"]),
                "calls": int(r.get("calls") or 0),
                "ms_per_step": finite(r.get("ms_per_step")) or 0.0,
                "share": finite(r.get("share")) or 0.0,
                "forward_ms": finite(r.get("forward_ms")),
                "backward_ms": finite(r.get("backward_ms")),
                "flops": finite(r.get("flops_per_step")),
            }
            for r in rec.get("rows") or []
        ],
    }


def layer_table_lines(t: dict[str, Any]) -> tuple[str, list[str]]:
    """A window's time per layer: its heading and the heaviest rows as text (or why there is none)."""
    head = f"Time per layer ({t['span']})"
    if t["error"]:
        return head, [f"none: {t['error']}"]
    total = "" if t["total_ms"] is None else f", {format_milliseconds(t['total_ms'])} per step in all"
    body = [f"{t['source']}{total}; forward and backward together:"]
    width = max([len(r["path"]) for r in t["rows"][:LAYER_ROWS]] + [5])
    for r in t["rows"][:LAYER_ROWS]:
        calls = f"  x{r['calls']}" if r["calls"] > 1 else ""
        body.append(
            f"  {r['path'].ljust(width)}  {format_milliseconds(r['ms_per_step']):>9}  {100 * r['share']:5.1f}%{calls}"
        )
    if len(t["rows"]) > LAYER_ROWS:
        body.append(f"  ... {len(t['rows']) - LAYER_ROWS} more rows (ProfilerWindow.layer_table())")
    if t.get("copy_ms") is not None:
        body.append(copies_sentence(t["copy_ms"]))
    if t["note"]:
        body.append(t["note"])
    return head, body


class LayerTable(BaseSection):
    name = "layer_table"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        prof = profiler(source)
        if prof is None:
            return None
        table_ = prof.layer_table() if hasattr(prof, "layer_table") else None
        data.layer_table = layer_table_dict(to_plain(table_)) if table_ is not None else None
        return name_of(prof)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        tags = [
            t for t in logs.records if t.startswith(schema.PROFILE_PREFIX) and t.endswith(schema.LAYERS_DATA_SUFFIX)
        ]
        if tags:  # the last window's
            last = max(tags, key=lambda t: int(t.split("_")[1]) if t.split("_")[1].isdigit() else -1)
            data.layer_table = logs.convert(data, last, layer_table_dict)

    def text(self, data: ReportData) -> TextSection | None:
        return layer_table_lines(data.layer_table) if data.layer_table is not None else None

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        t = data.layer_table
        if t is None:
            return []
        head, lines = layer_table_lines(t)
        if t["error"]:
            return [f"<h3>{e(head)}</h3>", f"<p>{prose(lines[0])}</p>"]
        rows = [
            (
                r["path"],
                r["calls"] or "-",
                format_milliseconds(r["ms_per_step"]),
                f"{100 * r['share']:.1f}%",
                "-" if r["forward_ms"] is None else format_milliseconds(r["forward_ms"]),
                "-" if r["backward_ms"] is None else format_milliseconds(r["backward_ms"]),
            )
            for r in t["rows"][:LAYER_ROWS]
        ]
        parts = [f"<h3>{e(head)}</h3>", f"<p>{prose(lines[0])}</p>"]
        parts.append(table(["layer", "calls", "per step", "share", "forward", "backward"], rows))
        notes = [line for line in lines[1:] if not line.startswith("  ")]  # the copies and the note, as in the text
        return parts + [f"<p>{prose(n)}</p>" for n in notes]


SECTION = LayerTable()
