"""Out of memory: the recoveries (each one's line and why), the headroom, the micro-batches now, and the
events and micro-batches over the run.

From `OOMBatchSizeReducer` (``events``, ``micro_batches``, ``recovery_seconds``, ``headroom()``), the
``oom/...`` keys of a History, or its run: scalars ``oom/*``, JSON ``oom/events/data`` (one per
recovery) and ``oom/headroom/data``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.memory.explain import headroom_lines
from keras_gpu_tools.reporting import drawing
from keras_gpu_tools.reporting.logs import Logs
from keras_gpu_tools.reporting.markup import bullets, img, prose, table
from keras_gpu_tools.reporting.model import OOM_FAILED_SECONDS, OOM_MICRO_BATCHES_NOW, ReportData, extend
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sections.training import epoch_series
from keras_gpu_tools.reporting.sources import history_of, name_of, oom_reducer
from keras_gpu_tools.runtime.units import format_number

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEADING = "Out of memory"


def oom_lines(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The line of each recovery and why, from `OOMEvent` records."""
    from keras_gpu_tools.memory.events import OOMEvent

    known = {f.name for f in dataclasses.fields(OOMEvent)}
    events = [OOMEvent(**{k: r[k] for k in known & set(r)}) for r in records]
    return [e.line() for e in events], [e.why() for e in events]


def recoveries(data: ReportData) -> str:
    """``3 recoveries from out-of-memory errors.``"""
    n = data.oom_count() or 0
    return f"{n} recover{'y' if n == 1 else 'ies'} from out-of-memory errors."


class OutOfMemory(BaseSection):
    name = "oom"
    every_record: tuple[str, ...] = (schema.OOM_EVENTS_DATA,)  # one record per recovery

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        hist = history_of(source)
        if hist is not None:  # the reducer's figures per epoch, in History
            for key, values in hist.items():
                if key.startswith(schema.OOM_PREFIX) and key not in data.oom_series:
                    s = epoch_series(key, values)
                    if s.values:
                        data.oom_series[key] = s
                        data.oom_seen = True
            return None
        cb = oom_reducer(source)
        if cb is None:
            return None
        data.oom_seen = True
        events = list(cb.events)
        data.oom_events = [e.line() for e in events]
        data.oom_details = [e.why() for e in events]
        data.oom_headroom = headroom_lines(cb.headroom())
        data.oom_summary[OOM_MICRO_BATCHES_NOW] = cb.micro_batches
        if cb.recovery_seconds:
            data.oom_summary[OOM_FAILED_SECONDS] = round(float(cb.recovery_seconds), 2)
        return name_of(cb)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        for _run, tag, points in logs.scalars():
            if tag.startswith(schema.OOM_PREFIX):
                data.oom_seen = True
                extend(data.oom_series, tag, points)
        oom = logs.convert(
            data,
            schema.OOM_EVENTS_DATA,
            lambda v: (oom_lines(v), sum(float(r.get("seconds") or 0.0) for r in v)),
            every=True,
        )
        if oom is not None:
            data.oom_seen, (data.oom_events, data.oom_details) = True, oom[0]
            if oom[1]:
                data.oom_summary[OOM_FAILED_SECONDS] = round(oom[1], 2)
        headroom = logs.convert(
            data,
            schema.OOM_HEADROOM_DATA,
            lambda v: headroom_lines(v[-1] if v and isinstance(v[-1], list) else v),
        )
        if headroom is not None:
            data.oom_seen, data.oom_headroom = True, headroom
        micro = data.oom_series.get(schema.OOM_MICRO_BATCHES)
        if micro is not None and micro.values:  # the last split in use, as the callback's `micro_batches`
            data.oom_summary = {OOM_MICRO_BATCHES_NOW: int(micro.values[-1]), **data.oom_summary}

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.oom_seen and other.oom_seen:
            data.oom_seen, data.oom_events, data.oom_series = True, other.oom_events, other.oom_series

    def text(self, data: ReportData) -> TextSection | None:
        if not data.oom_seen:
            return None
        body = [recoveries(data)]
        body += [f"{k}: {v if isinstance(v, str) else format_number(v)}" for k, v in data.oom_summary.items()]
        for i, line in enumerate(data.oom_events):
            body.append(f"- {line}")
            body += [f"    {w}" for w in (data.oom_details[i] if i < len(data.oom_details) else [])]
        if data.oom_headroom:
            body += ["Headroom:"] + [f"- {h}" for h in data.oom_headroom]
        if data.oom_count() and not data.oom_events:
            body.append("(The log directory holds the counts; the callback's `summary()` has each recovery.)")
        return HEADING, body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if not data.oom_seen:
            return []
        parts = [f"<h3>{HEADING}</h3>", f"<p>{prose(recoveries(data))}</p>"]
        if data.oom_events:
            items = []
            for i, x in enumerate(data.oom_events):
                why = data.oom_details[i] if i < len(data.oom_details) else []
                items.append("<li>" + prose(x) + "".join(f"<br><small>{prose(w)}</small>" for w in why) + "</li>")
            parts.append("<ul>" + "".join(items) + "</ul>")
        if data.oom_headroom:
            parts.append("<p>Headroom:</p>" + bullets(data.oom_headroom))
        rows = [(k, v if isinstance(v, str) else format_number(v)) for k, v in data.oom_summary.items()]
        if rows:
            parts.append(table(["figure", "value"], rows))
        parts.append(img(pngs, "oom", "out-of-memory events and micro-batches"))
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        if data.oom_count() or any(
            v > 1 for k, s in data.oom_series.items() if k.endswith("micro_batches") for v in s.values
        ):
            return {"oom": _oom_figure(data)}  # not for a run without a single OOM
        return {}

    def badges(self, data: ReportData) -> list[Badge]:
        if not data.oom_seen:
            return []
        n = data.oom_count() or 0
        return [(f"{n} OOM recover{'y' if n == 1 else 'ies'}", "warn" if n else "ok")]


def _oom_figure(data: ReportData) -> Figure:
    from matplotlib.ticker import MaxNLocator

    fig, (ax,) = drawing.new_figure(1, height=2.4)
    for key, s in data.oom_series.items():
        if s.values:
            ax.plot(s.steps, s.values, label=key, linewidth=1.4, marker="o", markersize=4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch" if all(w == 0.0 for s in data.oom_series.values() for w in s.wall) else "training step")
    ax.set_title("Out of memory: events and micro-batches", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    return fig


SECTION = OutOfMemory()
