"""GPUs and host: the GPU table, each GPU's utilization and memory over time, the host's CPU and memory.

From `GPUUtilizationLogger` (`device_records()`, `timeline`) or its log runs (scalars ``gpu/<i>/*``,
``host/*``; JSON ``gpu/devices/data``), of every process of a job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting import drawing
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import img, table
from keras_gpu_tools.reporting.model import ReportData, Series, extend
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sources import gpu_logger, name_of
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADING = "GPUs and host"
UTIL_FIELDS = ("utilization_percent", "sm_activity_percent", "tensor_activity_percent", "memory_busy_percent")
MEMORY_FIELDS = ("memory_used_mib", "allocator_memory_mib", "allocator_peak_memory_mib", "memory_total_mib")
# The host's CPU figures, each on an axis of its own: the process's is in % of one core (400% is four
# cores busy), the machine's in % of all its cores (at most 100%); one "%" axis would mix the two.
HOST_CPU_AXES = (
    (schema.HOST_CPU_PERCENT, "% of one core", "CPU of this process (100% = one core busy)"),
    (schema.HOST_SYSTEM_CPU_PERCENT, "% of all cores", "CPU of the whole machine (100% = every core busy)"),
)


def gpu_row(rec: dict[str, Any]) -> dict[str, str]:
    """A row of the GPU table from a `GPUUtilizationLogger.device_records()` entry."""
    mem, cc = rec.get("memory_total_bytes"), rec.get("compute_capability")
    row = {
        # the GPU's name in the tags (gpu/<label>/...): its job-wide label in a job of several processes
        "index": str(rec.get("label", rec.get("index", "?"))),
        "name": str(rec.get("name", "?")) + (" (MIG)" if rec.get("is_mig") else ""),
        "uuid": str(rec.get("uuid") or ""),
        "memory": f"{mem / 2**20:.0f} MiB" if mem else "?",
        "compute capability": ".".join(map(str, cc)) if cc else "?",
    }
    if (rec.get(schema.PROCESS_COUNT) or 1) > 1:  # which process of the job monitored it
        row["process"] = f"{rec.get(schema.PROCESS_INDEX, '?')} ({rec.get(schema.HOST) or '?'})"
    return row


def device_records(logs: Logs) -> list[Any] | None:
    """The device records of a log directory: the last of each process, in process order (None: none written)."""
    devices: dict[int, Any] = {}  # -1: not a process run
    for run, value in logs.every(schema.GPU_DEVICES_DATA):
        devices[logs.process_of.get(run, -1)] = value
    if not devices:
        return None
    return [r for p in sorted(devices) for r in (devices[p] if isinstance(devices[p], list) else [devices[p]])]


class GPUsAndHost(BaseSection):
    name = "gpus"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        lg = gpu_logger(source)
        if lg is None:
            return None
        data.gpus += [gpu_row(r) for r in lg.device_records()]
        for wall, step, means in list(lg.timeline):
            if data.t0 is None or wall < data.t0:
                data.t0 = wall
            for key, value in means.items():
                v = finite(value)
                if v is not None:
                    data.series.setdefault(key, Series(key)).add(wall, step, v)
        return name_of(lg)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        for _run, tag, points in logs.scalars():  # (another process's runs hold only its GPUs')
            if tag.startswith((schema.GPU_PREFIX, schema.HOST_PREFIX)):
                extend(data.series, tag, points)
                if points.wall:
                    first = min(points.wall)
                    data.t0 = first if data.t0 is None else min(data.t0, first)
        records = device_records(logs)
        if records is not None:
            gpus = logs.convert(data, schema.GPU_DEVICES_DATA, lambda _: [gpu_row(r) for r in records])
            if gpus is not None:
                data.gpus = gpus

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.series:
            data.series, data.t0, data.gpus = other.series, other.t0, other.gpus or data.gpus

    def text(self, data: ReportData) -> TextSection | None:
        body = []
        for g in data.gpus:
            where = f", process {g['process']}" if g.get("process") else ""
            body.append(
                f"GPU {g['index']}: {g['name']}, {g['memory']}, compute capability {g['compute capability']}{where}"
            )
        rows = [(k, s) for k, s in data.series.items() if s.values]
        if rows:
            body.append(f"{'metric':42s} {'min':>9s} {'mean':>9s} {'max':>9s} {'last':>9s}")
            for k, s in sorted(rows):
                body.append(f"{k:42s} " + " ".join(f"{format_number(v, decimals=1):>9s}" for v in s.stats()))
        if not data.gpu_indices() and rows:
            body.insert(0, "No GPU was monitored (host metrics only).")
        return (HEADING, body) if body else None

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if not (data.series or data.gpus):
            return []
        parts = [f"<h3>{HEADING}</h3>"]
        if data.gpus:
            by_process = any(g.get("process") for g in data.gpus)
            parts.append(
                table(
                    ["GPU", "name", "memory", "compute capability", "UUID"] + (["process"] if by_process else []),
                    [
                        (g["index"], g["name"], g["memory"], g["compute capability"], g.get("uuid", ""))
                        + ((g.get("process", ""),) if by_process else ())
                        for g in data.gpus
                    ],
                )
            )
        else:
            parts.append("<p>No GPU was monitored: host metrics only.</p>")
        for index in data.gpu_indices():
            parts.append(img(pngs, f"gpu_{index}", f"GPU {index} utilization and memory over time"))
        parts.append(img(pngs, "host", "host CPU and memory over time"))
        if data.series:
            parts.append(
                "<details><summary>All series (min / mean / max / last)</summary>"
                + table(
                    ["metric", "min", "mean", "max", "last"],
                    [
                        (k, *(format_number(v, decimals=1) for v in s.stats()))
                        for k, s in sorted(data.series.items())
                        if s.values
                    ],
                )
                + "</details>"
            )
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        figs = {}
        plotted = {m.group(1) for k in data.series if (m := schema.GPU_KEY_RE.match(k))}
        for index in data.gpu_indices():
            if index in plotted:
                figs[f"gpu_{index}"] = _gpu_figure(data, index)
        if any(k.startswith(schema.HOST_PREFIX) for k in data.series):
            figs["host"] = _host_figure(data)
        return figs

    def badges(self, data: ReportData) -> list[Badge]:
        out: list[Badge] = []
        for index in data.gpu_indices():
            s = data.series.get(schema.gpu_key(index, "sm_activity_percent")) or data.series.get(
                schema.gpu_key(index, "utilization_percent")
            )
            if s and s.values:
                what = "SM activity" if s.key.endswith("sm_activity_percent") else "utilization"
                mean = s.stats()[1]
                out.append((f"GPU {index}: {what} {mean:.0f}%", "ok" if mean >= 70 else "warn"))
        return out

    def not_measured(self, data: ReportData) -> list[str]:
        return [] if data.series or data.gpus else ["GPU and host metrics (GPUUtilizationLogger)"]


def _gpu_figure(data: ReportData, index: str) -> Figure:
    fig, (ax_u, ax_m) = drawing.new_figure(2)
    name = next((g["name"] for g in data.gpus if g.get("index") == index), "")
    fig.suptitle(f"GPU {index}" + (f": {name}" if name else ""), fontsize=11)
    plotted = False
    for field in UTIL_FIELDS:
        s = data.series.get(schema.gpu_key(index, field))
        if s and s.values:
            ax_u.plot(
                drawing.seconds(data, s), s.values, label=field, linewidth=1.4 if field in UTIL_FIELDS[:2] else 0.9
            )
            plotted = True
    ax_u.set_ylabel("%")
    ax_u.set_ylim(0, 105)
    ax_u.set_title("utilization", fontsize=9, loc="left")
    if plotted:
        drawing.legend_right(ax_u)
    plotted = False
    for field in MEMORY_FIELDS:
        s = data.series.get(schema.gpu_key(index, field))
        if s and s.values:
            style = "--" if field == "memory_total_mib" else "-"
            ax_m.plot(drawing.seconds(data, s), s.values, style, label=field, linewidth=1.2)
            plotted = True
    ax_m.set_ylabel("MiB")
    ax_m.set_xlabel("seconds since the first sample")
    ax_m.set_title("memory", fontsize=9, loc="left")
    if plotted:
        drawing.legend_right(ax_m)
    drawing.note_sampled(fig, [data.series.get(schema.gpu_key(index, f)) for f in UTIL_FIELDS + MEMORY_FIELDS])
    return fig


def _host_figure(data: ReportData) -> Figure:
    shown = [(k, unit, title) for k, unit, title in HOST_CPU_AXES if (s := data.series.get(k)) and s.values]
    shown = shown or list(HOST_CPU_AXES[:1])  # an empty CPU axis says what was not recorded
    fig, axes = drawing.new_figure(len(shown) + 1, height=2.0)
    ax_m = axes[-1]
    fig.suptitle("Host", fontsize=11)
    for ax_c, (key, unit, title) in zip(axes, shown):
        s = data.series.get(key)
        if s and s.values:
            ax_c.plot(drawing.seconds(data, s), s.values, label=key.split("/")[1], linewidth=1.2)
            drawing.legend_right(ax_c)
        if key == schema.HOST_SYSTEM_CPU_PERCENT:
            ax_c.set_ylim(0, 105)
        ax_c.set_ylabel(unit)
        ax_c.set_title(title, fontsize=9, loc="left")
    s = data.series.get(schema.HOST_RSS_MIB)
    if s and s.values:
        ax_m.plot(drawing.seconds(data, s), s.values, label="rss_mib", color="#2ca02c", linewidth=1.2)
        drawing.legend_right(ax_m)
    ax_m.set_ylabel("MiB")
    ax_m.set_xlabel("seconds since the first sample")
    ax_m.set_title("resident memory", fontsize=9, loc="left")
    drawing.note_sampled(
        fig,
        [data.series.get(k) for k in (schema.HOST_CPU_PERCENT, schema.HOST_SYSTEM_CPU_PERCENT, schema.HOST_RSS_MIB)],
    )
    return fig


SECTION = GPUsAndHost()
