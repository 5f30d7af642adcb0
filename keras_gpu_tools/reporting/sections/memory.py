"""Memory over time: `MemoryLeakDetector`'s verdict (does memory grow?), its evidence and advice, memory at
each epoch's end and at each fit's end.

From `MemoryLeakDetector` (``epoch_history``, ``verdict``, ``fit_history()``) or its run: scalars
``memory/*``, JSON ``memory/verdict/data``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.reporting import drawing
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import bullets, e, img, prose, table
from keras_gpu_tools.reporting.model import ReportData, Series, extend
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sources import leak_detector, name_of
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADING = "Memory over time"
FITS_HEADER = ("fit", "model", "epochs", "host RSS at its end", "device in use")
MEMORY_KEYS = (schema.MEMORY_HOST_RSS_MIB, schema.MEMORY_DEVICE_IN_USE_MIB, schema.MEMORY_DEVICE_RESERVED_MIB)


def memory_verdict_dict(rec: dict[str, Any], fits: list[Any] | None = None) -> dict[str, Any]:
    """The report's memory verdict from a `LeakVerdict` record, and the process's fits (their figures at the end)."""
    return {
        "category": str(rec.get("category", "unknown")),
        "message": str(rec.get("message", "")),
        "scope": str(rec.get("scope") or ""),
        "host_mib_per_epoch": finite(rec.get("host_mib_per_epoch")),
        "device_mib_per_epoch": finite(rec.get("device_mib_per_epoch")),
        "host_mib_per_fit": finite(rec.get("host_mib_per_fit")),
        "device_mib_per_fit": finite(rec.get("device_mib_per_fit")),
        "exhaustion": [str(x) for x in rec.get("exhaustion") or []],
        "evidence": [str(x) for x in rec.get("evidence") or []],
        "advice": [str(x) for x in rec.get("advice") or []],
        "fits": [dict(f) for f in fits or [] if isinstance(f, dict)],
    }


def memory_fit_rows(m: dict[str, Any]) -> list[tuple[str, ...]]:
    """The process's fits as table rows (MiB at each fit's end)."""
    return [
        (
            str(f.get("fit", "")),
            str(f.get("model", "")),
            str(f.get("epochs", "")),
            format_bytes(f["host_rss_mib"] * 2**20) if f.get("host_rss_mib") is not None else "-",
            format_bytes(f["device_in_use_mib"] * 2**20) if f.get("device_in_use_mib") is not None else "-",
        )
        for f in m["fits"]
    ]


class MemoryOverTime(BaseSection):
    name = "memory"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        det = leak_detector(source)
        if det is None:
            return None
        for epoch, values in enumerate(list(det.epoch_history)):
            for key, value in values.items():
                v = finite(value)
                if key.startswith(schema.MEMORY_PREFIX) and v is not None:
                    data.memory_series.setdefault(key, Series(key)).add(0.0, epoch + 1, v)
        if det.verdict is not None:
            data.memory_verdict = memory_verdict_dict(to_plain(det.verdict), det.fit_history())
        return name_of(det)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        for _run, tag, points in logs.scalars():
            if tag.startswith(schema.MEMORY_PREFIX):
                extend(data.memory_series, tag, points)
        memory = logs.convert(
            data, schema.MEMORY_VERDICT_DATA, lambda v: memory_verdict_dict(v["verdict"], v.get("fits"))
        )
        if memory is not None:
            data.memory_verdict = memory

    def fill(self, data: ReportData, other: ReportData) -> None:
        if data.memory_verdict is None:
            data.memory_verdict, data.memory_series = other.memory_verdict, other.memory_series

    def text(self, data: ReportData) -> TextSection | None:
        m = data.memory_verdict
        if not m:
            return None
        scope = f" ({m['scope']})" if m["scope"] else ""
        body = [f"Verdict: memory {m['category']}{scope}", m["message"]]
        body += list(m["exhaustion"][1:]) + list(m["evidence"])
        if m["advice"]:
            body += ["What to change:"] + [f"- {a}" for a in m["advice"]]
        if len(m["fits"]) > 1:
            rows = [FITS_HEADER, *memory_fit_rows(m)]
            widths = [max(len(r[i]) for r in rows) for i in range(len(FITS_HEADER))]
            body += ["Fits of this process:"] + [
                "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows
            ]
        return HEADING, body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        m = data.memory_verdict
        if not m:
            return []
        scope = f" ({m['scope']})" if m["scope"] else ""
        parts = [f"<h3>{HEADING}</h3>"]
        parts.append(
            f'<p><b class="kgt-memory-verdict">memory {e(m["category"])}{e(scope)}</b>: {prose(m["message"])}</p>'
        )
        parts += [f"<p>{prose(x)}</p>" for x in [*m["exhaustion"][1:], *m["evidence"]]]
        if m["advice"]:
            parts.append("<p>What to change:</p>" + bullets(m["advice"]))
        parts.append(img(pngs, "memory", "memory per epoch and per fit"))
        if len(m["fits"]) > 1:
            parts.append(table(FITS_HEADER, memory_fit_rows(m)))
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        if data.memory_series or (data.memory_verdict and len(data.memory_verdict["fits"]) > 1):
            return {"memory": _memory_figure(data)}
        return {}

    def badges(self, data: ReportData) -> list[Badge]:
        if not data.memory_verdict:
            return []
        cat = data.memory_verdict["category"]
        return [(f"memory {cat}", "bad" if cat == "grows" else "ok" if cat == "stable" else "info")]


def _memory_figure(data: ReportData) -> Figure:
    """Memory at each epoch's end (MemoryLeakDetector's step: epochs of every fit, in order), and at each fit's end."""
    from matplotlib.ticker import MaxNLocator

    fits = data.memory_verdict["fits"] if data.memory_verdict else []
    fig, axes = drawing.new_figure(2 if len(fits) > 1 else 1, height=2.2)
    for a in axes:  # epochs and fits are counted: no tick at epoch 1.5
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax = axes[0]
    for key in MEMORY_KEYS:
        s = data.memory_series.get(key)
        if s and s.values:
            ax.plot(s.steps, s.values, marker="o", markersize=3, linewidth=1.2, label=key.split("/", 1)[1])
    ax.set_ylabel("MiB")
    ax.set_xlabel("epoch (every fit's, in order)")
    ax.set_title("memory at each epoch's end", fontsize=9, loc="left")
    if ax.lines:
        drawing.legend_right(ax)
    if len(fits) > 1:
        ax_f = axes[1]
        for field in ("host_rss_mib", "device_in_use_mib"):
            pts = [(f["fit"], f[field]) for f in fits if f.get(field) is not None]
            if pts:
                ax_f.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", markersize=3, label=field)
        ax_f.set_ylabel("MiB")
        ax_f.set_xlabel("fit() in this process")
        ax_f.set_title("memory at each fit's end", fontsize=9, loc="left")
        if ax_f.lines:
            drawing.legend_right(ax_f)
    fig.suptitle("Memory over time", fontsize=11)
    return fig


SECTION = MemoryOverTime()
