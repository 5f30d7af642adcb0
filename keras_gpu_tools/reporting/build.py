"""A report of a training run: what the callbacks measured, in one view.

:func:`report` gathers what the package's callbacks recorded (or, after the
fact, what they wrote to a TensorBoard log directory) into a
:class:`TrainingReport`, which renders as plain text (``str(report)``), as HTML
with matplotlib plots in a notebook (``_repr_html_``), and saves as one HTML
file with the plots embedded as PNG (``report.save("report.html")``).

Sections: per GPU, utilization (SM activity where the GPU reports it) and
memory over time; the host's CPU and memory; step time split into input wait,
compute and other; the input-bound verdict and its advice; OOM recoveries;
profiler windows and their xprof conclusion; mixed-precision findings; the
training curves Keras wrote.

Callbacks are recognised by their class (a subclass counts), imported only
when `report()` is given sources, so this module imports neither Keras nor a
framework: matplotlib is imported when a figure is first drawn, TensorBoard's
protos when a log directory is read. From a callback the report reads the
records it holds (dataclasses, dicts); from a log directory, the JSON each
callback writes next to its text (text tags ending in ``/data``), never the
text itself. Logs written before those tags are read from their text.

What is read (a missing one leaves its part of the report out):

| callback: records | log dir: run, tags |
|---|---|
| `GPUUtilizationLogger`: `device_records()`, `timeline` | `gpu`: scalars `gpu/<i>/*`, `host/*`; JSON `gpu/devices/data` |
| `InputBoundDetector`: `epoch_history`, `measurement`, `verdict`, `job_verdict` | `input`: scalars `input/*`, `throughput/*`; JSON `input/verdict/data` |
| `ProfilerWindow`: `captures` | `profile`: JSON `profile/steps_<a>_<b>/data`, `.../input_pipeline/data` |
| `OOMBatchSizeReducer`: `events`, `micro_batches`, `recovery_seconds` | `oom`: scalars `oom/*`; JSON `oom/events/data` |
| `MixedPrecisionCheck`: `findings` | `report`: JSON `mixed_precision/findings/data` (`TrainingReport.write_to_tensorboard`) |
| `History` (or the model's) | `train`, `validation`: Keras's `epoch_*` |

An event file that cannot be read (not an event file, corrupt, cut short) is
named in the report; when none can be read, `report()` raises `ValueError`.

A log directory written by a job of several processes holds, per callback,
one run per process (`<run>/process_<p>`) and process 0's job-wide figures
(`<run>/job`). The report shows the GPUs of every process (their tags name them
apart), everything else from the lowest process (0) alone, so nothing is
counted twice, and a table of the job-wide figures (`job/...` scalars). The
job's input verdict (each process's step time and input wait, the stragglers
and the advice for them) comes from the `job` part of process 0's
`input/verdict/data`, else from the text `input/job_verdict` of `input/job`.
Each profiler window of the job (`ProfilerWindow`'s `captures[i].job_*` on
process 0, or `profile/job`'s `profile/steps_<a>_<b>/data` and
`.../input_pipeline/data`) is shown there too: the traces of every process,
each process's mean step time, the slowest, and xprof's conclusion over all
the traces.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
import os
import re
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from keras_gpu_tools.memory.explain import headroom_lines

GPU_KEY = re.compile(r"^gpu/([^/]+)/(.+)$")
SPLIT_KEYS = (("input/wait_ms", "input wait"), ("input/compute_ms", "compute"), ("input/other_ms", "other"))
SPLIT_COLORS = ("#d62728", "#1f77b4", "#bbbbbb")
UTIL_FIELDS = ("utilization_percent", "sm_activity_percent", "tensor_activity_percent", "memory_busy_percent")
MEMORY_FIELDS = ("memory_used_mib", "allocator_memory_mib", "allocator_peak_memory_mib", "memory_total_mib")
MP_TAG = "mixed_precision/findings"
# The tags of the JSON the callbacks write next to their text (see EventWriter.json).
DATA_SUFFIX = "/data"
DEVICES_DATA_TAG = "gpu/devices/data"  # GPUUtilizationLogger.device_records()
# {scope, verdict: Verdict (with its scope, phases, speedup_bound), measurement: Measurement (the steady
# state's), figures, fit_figures (the whole fit's), notes}
VERDICT_DATA_TAG = "input/verdict/data"
ANALYSIS_DATA_SUFFIX = "/input_pipeline/data"  # profile/steps_<a>_<b>/input_pipeline/data: TraceAnalysis
OOM_DATA_TAG = "oom/events/data"  # one OOMEvent per recovery
OOM_HEADROOM_TAG = "oom/headroom/data"  # per device: peak, capacity, the batch that would fit
MP_DATA_TAG = MP_TAG + DATA_SUFFIX  # [MixedPrecisionFinding]
# (`oom/` last: History's oom keys are read, the others come from the callbacks' runs)
_OWN_PREFIXES = ("gpu/", "host/", "input/", "throughput/", "job/", "oom/")
# The runs of a job of several processes: one per process, and the job-wide figures (process 0's).
# (`report logs/input`, a callback's own folder, holds them at its top: `process_0`, `job`)
PROCESS_RUN = re.compile(r"^(?:(.+)/)?process_(\d+)$")
JOB_RUN = re.compile(r"^(?:(.+)/)?job$")
JOB_STATS = ("min", "mean", "max")
_NO_FINDING = "No mixed-precision finding."
_UNREADABLE = "Event files that could not be read"


# ---------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Series:
    """One metric over time: wall-clock seconds, the training step, the value."""

    key: str
    wall: list[float] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    values: list[float] = dataclasses.field(default_factory=list)

    def add(self, wall: float, step: int, value: float) -> None:
        self.wall.append(float(wall))
        self.steps.append(int(step))
        self.values.append(float(value))

    def stats(self) -> tuple[float, float, float, float]:
        v = self.values
        return min(v), sum(v) / len(v), max(v), v[-1]


@dataclasses.dataclass
class ReportData:
    """Everything a report shows; filled from callbacks or from a log directory."""

    title: str = "Training report"
    sources: list[str] = dataclasses.field(default_factory=list)
    gpus: list[dict[str, str]] = dataclasses.field(default_factory=list)  # index, name, memory, ...
    series: dict[str, Series] = dataclasses.field(default_factory=dict)  # gpu/* and host/*
    t0: float | None = None  # wall time of the first GPU/host point
    # Step time split: x (epoch numbers or steps) and per-key values in ms.
    split_axis: str = "epoch"
    split_x: list[float] = dataclasses.field(default_factory=list)
    split: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    throughput: dict[str, float] = dataclasses.field(default_factory=dict)  # last figures of the run
    verdict: dict[str, Any] | None = None  # category, message, evidence, advice, text
    oom_events: list[str] = dataclasses.field(default_factory=list)
    oom_details: list[list[str]] = dataclasses.field(default_factory=list)  # why, per event (may be shorter)
    oom_headroom: list[str] = dataclasses.field(default_factory=list)  # peak against capacity, per device
    oom_series: dict[str, Series] = dataclasses.field(default_factory=dict)
    oom_summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    oom_seen: bool = False  # an OOM callback (or its logs) was there
    profiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # see _profile_row
    findings: list[dict[str, str | None]] | None = None  # None: the check did not run
    training: dict[str, Series] = dataclasses.field(default_factory=dict)  # loss, val_loss, ...
    notes: list[str] = dataclasses.field(default_factory=list)
    unreadable: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # event file, what went wrong
    # A job of several processes: the indices whose runs were read (empty: one process), how many
    # the job has, and the job-wide figures (`job/...`) by tag, on the step (or epoch) axis.
    processes: list[int] = dataclasses.field(default_factory=list)
    process_count: int = 1
    job: dict[str, Series] = dataclasses.field(default_factory=dict)
    # The job's input verdict (InputBoundDetector.job_verdict, or the "job" part of its JSON): each
    # process's steady-state figures, the stragglers, the message and its advice; see _job_verdict_dict.
    job_verdict: dict[str, Any] | None = None
    # The job's profiler windows (process 0's job records of ProfilerWindow): see _job_profile_row.
    job_profiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def job_rows(self) -> tuple[list[tuple[str, float | None, float | None, float | None]], list[tuple[str, float]]]:
        """The job-wide figures at their last point: (figure, min, mean, max) rows, and the other figures."""
        grouped: dict[str, dict[str, float]] = {}
        single: list[tuple[str, float]] = []
        for tag, s in sorted(self.job.items()):
            if not s.values:
                continue
            name = tag[len("job/") :] if tag.startswith("job/") else tag
            base, _, stat = name.rpartition("_")
            if base and stat in JOB_STATS:
                grouped.setdefault(base, {})[stat] = s.values[-1]
            else:
                single.append((name, s.values[-1]))
        for name, g in list(grouped.items()):  # one statistic alone (`job/step_ms_max`): a figure of its own
            if len(g) == 1:
                (stat, value), *_ = g.items()
                single.append((f"{name}_{stat}", value))
                del grouped[name]
        rows = [(name, *(g.get(stat) for stat in JOB_STATS)) for name, g in grouped.items()]
        return rows, sorted(single)

    def oom_count(self) -> int | None:
        """Recoveries: from the callback's records, else from the logged counts."""
        if self.oom_events:
            return len(self.oom_events)
        total = self.oom_series.get("oom/events_total")
        if total is not None and total.values:
            return int(max(total.values))
        per_epoch = self.oom_series.get("oom/events")
        if per_epoch is not None and per_epoch.values:
            return int(sum(per_epoch.values))
        return 0 if self.oom_seen else None

    def gpu_indices(self) -> list[str]:
        seen = []
        for key in self.series:
            m = GPU_KEY.match(key)
            if m and m.group(1) not in seen:
                seen.append(m.group(1))
        for g in self.gpus:
            if g.get("index") not in seen:
                seen.append(g.get("index"))
        return sorted(seen, key=lambda s: (len(s), s))


# ---------------------------------------------------------------------------
# Gathering from callbacks
# ---------------------------------------------------------------------------
def _classes() -> list[tuple[str, type]]:
    """The classes the report reads, by role: the package's callbacks, Keras's `History` and `Model`.

    Imported here rather than at module import, so that this module imports no
    Keras; and only once Keras is loaded, as no instance of them exists before.
    """
    if "keras" not in sys.modules:
        return []
    import keras

    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

    return [
        ("model", keras.Model),
        ("gpu", GPUUtilizationLogger),
        ("input", InputBoundDetector),
        ("profile", ProfilerWindow),
        ("oom", OOMBatchSizeReducer),
        ("mixed_precision", MixedPrecisionCheck),
        ("history", keras.callbacks.History),
    ]


def _flatten(sources: Iterable[Any]) -> list[Any]:
    out = []
    for s in sources:
        if isinstance(s, (list, tuple)):
            out.extend(_flatten(s))
        elif s is not None:
            out.append(s)
    return out


def _finite(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# Each record below is the JSON-ready form a callback writes to its `.../data`
# tag, so that the callbacks and the log directory make the same report.
def _gpu_row(rec: dict[str, Any]) -> dict[str, str]:
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
    if (rec.get("process_count") or 1) > 1:  # which process of the job monitored it
        row["process"] = f"{rec.get('process_index', '?')} ({rec.get('host') or '?'})"
    return row


def _verdict_dict(rec: dict[str, Any], text: str, fit_figures: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's verdict from a `Verdict` record and the summary text that goes with it.

    ``scope`` is what the verdict's figures cover (its steady state),
    ``phases`` every epoch (or window) with whether it is in the verdict and
    why not, ``speedup_bound`` what removing the wait is worth at most, and
    ``fit_figures`` the whole fit's figures. Records of earlier versions lack
    them: empty, None.
    """
    return {
        "category": str(rec.get("category", "unknown")),
        "message": str(rec.get("message", "")),
        "evidence": [str(x) for x in rec.get("evidence") or []],
        "advice": [str(x) for x in rec.get("advice") or []],
        "scope": str(rec.get("scope") or ""),
        "phases": [_phase_dict(p) for p in rec.get("phases") or []],
        "speedup_bound": _finite(rec.get("speedup_bound")),
        "fit_wait_fraction": _finite(rec.get("fit_wait_fraction")),
        "fit_figures": _floats(fit_figures or {}),
        "text": text,
    }


def _phase_dict(rec: dict[str, Any]) -> dict[str, Any]:
    """A phase of the verdict from a `Phase` record."""
    return {
        "label": str(rec["label"]),
        "steps": int(rec.get("steps") or 0),
        "wait_fraction": _finite(rec.get("wait_fraction")),
        "step_ms": None if _finite(rec.get("step")) is None else 1e3 * float(rec["step"]),
        "steady": bool(rec.get("steady")),
        "reason": None if rec.get("reason") is None else str(rec["reason"]),
    }


def _phase_line(p: dict[str, Any]) -> str:
    """A phase as a line: ``epoch 1: 12 steps, 30.5% waiting, 34.72 ms a step; left out while the cache filled``."""
    wait = "n/a" if p["wait_fraction"] is None else f"{100 * p['wait_fraction']:.1f}%"
    step = "n/a" if p["step_ms"] is None else f"{p['step_ms']:.2f} ms"
    where = "in the verdict" if p["steady"] else f"left out {p['reason'] or ''}".rstrip()
    return f"{p['label']}: {p['steps']} steps, {wait} waiting, {step} a step; {where}"


def _job_verdict_dict(rec: dict[str, Any], text: str = "") -> dict[str, Any]:
    """The report's job verdict from a `JobVerdict` record (``text``: the verdict as the job run holds it).

    ``processes``: one row per process (``process``, ``host``, ``scope``, ``steps``, ``wait_fraction``,
    ``step_ms``, ``samples_per_sec``, ``category``), ``stragglers``: (process, kind) pairs.
    """
    processes = []
    for p in rec.get("processes") or []:
        processes.append(
            {
                "process": int(p["process"]),
                "host": str(p.get("host") or "?"),
                "scope": str(p.get("scope") or "?"),
                "steps": _finite(p.get("steps")),
                "wait_fraction": _finite(p.get("wait_fraction")),
                "step_ms": _finite(p.get("step_ms")),
                "samples_per_sec": _finite(p.get("samples_per_sec")),
                "category": str(p.get("category") or "unknown"),
            }
        )
    return {
        "processes": processes,
        "stragglers": [(int(s["process"]), str(s.get("kind") or "")) for s in rec.get("stragglers") or []],
        "message": str(rec.get("message") or ""),
        "advice": [str(a) for a in rec.get("advice") or []],
        "text": text,
    }


def _job_process_rows(jv: dict[str, Any]) -> list[tuple[str, ...]]:
    """The per-process table of a job verdict: process (marked when a straggler), host, scope, steps, wait, step, samples/s, verdict."""
    slow = {p: kind for p, kind in jv["stragglers"]}

    def num(x, fmt: str, scale: float = 1.0, unit: str = "") -> str:
        return "n/a" if x is None else f"{format(scale * x, fmt)}{unit}"

    return [
        (
            f"{p['process']}" + (f" (straggler: {slow[p['process']]})" if p["process"] in slow else ""),
            p["host"],
            p["scope"],
            num(p["steps"], ".0f"),
            num(p["wait_fraction"], ".1f", 100.0, "%"),
            num(p["step_ms"], ".2f", unit=" ms"),
            num(p["samples_per_sec"], ".0f"),
            p["category"],
        )
        for p in jv["processes"]
    ]


JOB_VERDICT_HEADER = ("process", "host", "scope", "steps", "wait for input", "step", "samples/s", "verdict")
JOB_VERDICT_TAG = "input/job_verdict"  # the job run's text (process 0), read where no JSON has the verdict


def _conclusion(analysis: dict[str, Any] | None) -> str:
    """What xprof concluded of a window, worded as `ProfilerWindow` writes it ("" before any analysis)."""
    if not analysis:
        return ""
    return analysis.get("conclusion") or f"xprof gave no conclusion ({analysis.get('error') or 'no steps found'})"


def _profile_row(rec: dict[str, Any]) -> dict[str, Any]:
    """A profiler window of the report from a `WindowCapture` record."""
    start, n = int(rec["start_step"]), int(rec["num_steps"])
    files = rec.get("files") or []
    size = _finite(rec.get("size_bytes"))
    return {
        "steps": f"{start}-{start + n}",
        "start": start,
        "num_steps": n,
        "reason": str(rec.get("reason", "")),
        "trace_dir": os.path.dirname(files[0]) if files else "",
        "size_mib": None if size is None else size / 2**20,
        "mean_step_ms": _finite(rec.get("mean_step_ms")),
        "conclusion": _conclusion(rec.get("analysis")),
    }


def _job_profile_row(rec: dict[str, Any], analysis: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A profiler window of the job from process 0's `WindowCapture` record (None: not a job's window).

    ``analysis``: xprof's analysis over every trace, where it comes apart (its own tag); else the
    record's ``job_analysis``.
    """
    means = [_finite(ms) for ms in rec.get("job_mean_step_ms") or []]
    if not means:
        return None
    start, n = int(rec["start_step"]), int(rec["num_steps"])
    files = [str(f) for f in rec.get("job_files") or []]
    known = [(ms, i) for i, ms in enumerate(means) if ms is not None]
    return {
        "steps": f"{start}-{start + n}",
        "start": start,
        "num_steps": n,
        "processes": len(means),
        "files": files,
        "trace_dir": os.path.dirname(files[0]) if files else "",
        "mean_step_ms": means,  # by process index; None: that process measured none
        "slowest": max(known)[1] if len(known) > 1 else None,
        "conclusion": _conclusion(analysis if analysis is not None else rec.get("job_analysis")),
    }


def _job_profile_lines(p: dict[str, Any]) -> list[str]:
    """A job's profiler window in lines: its traces, each process's mean step, the slowest, xprof's conclusion."""
    n, files = p["processes"], p["files"]
    where = p["trace_dir"] or "no trace file"
    lines = [f"steps {p['steps']}: {len(files)} trace file{'' if len(files) == 1 else 's'} of {n} processes in {where}"]
    lines += [f"  trace: {os.path.basename(f)}" for f in files]
    if len(files) < n:  # a process's trace is not where process 0 looked
        lines.append(f"  only {len(files)} of {n} processes' traces are there (is log_dir shared by every host?)")
    for i, ms in enumerate(p["mean_step_ms"]):
        mean = "not measured" if ms is None else f"{ms:.2f} ms"
        lines.append(f"  process {i}: mean step {mean}" + (" (slowest)" if i == p["slowest"] else ""))
    lines.append(f"  xprof over every trace: {p['conclusion'] or 'none (no xprof analysis)'}")
    return lines


def _finding_dict(rec: dict[str, Any]) -> dict[str, str | None]:
    """A mixed-precision finding of the report from a `MixedPrecisionFinding` record."""
    layer = rec.get("layer")
    return {
        "kind": str(rec.get("kind", "?")),
        "layer": None if layer is None else str(layer),
        "message": str(rec.get("message", "")),
    }


def _from_gpu_logger(data: ReportData, lg) -> None:
    data.sources.append(type(lg).__name__)
    data.gpus += [_gpu_row(r) for r in lg.device_records()]
    topology = getattr(lg, "topology", None)
    if topology is not None and topology.process_count > 1:
        data.processes, data.process_count = [topology.process_index], topology.process_count
    for epoch, values in enumerate(list(lg.epoch_history)):  # job-wide figures, one point per epoch
        for key, value in values.items():
            v = _finite(value)
            if key.startswith("job/") and v is not None:
                data.job.setdefault(key, Series(key)).add(0.0, epoch + 1, v)
    for wall, step, means in list(lg.timeline):
        if data.t0 is None or wall < data.t0:
            data.t0 = wall
        for key, value in means.items():
            v = _finite(value)
            if v is not None:
                data.series.setdefault(key, Series(key)).add(wall, step, v)


def _from_detector(data: ReportData, det) -> None:
    from keras_gpu_tools.logdir.events import to_plain

    data.sources.append(type(det).__name__)
    history = list(det.epoch_history)
    if history:
        data.split_axis = "epoch"
        data.split_x = [float(i + 1) for i in range(len(history))]
        data.split = {k: [_finite(h.get(k)) for h in history] for k, _ in SPLIT_KEYS + (("input/step_ms", ""),)}
    if det.measurement is not None:
        data.throughput = dict(det.measurement.logs())
    if det.verdict is not None:
        fit = getattr(det, "fit_measurement", None)
        data.verdict = _verdict_dict(to_plain(det.verdict), det.summary(), fit.logs() if fit is not None else None)
    job_verdict = getattr(det, "job_verdict", None)
    if job_verdict is not None:  # a job of several processes: every process has the same
        data.job_verdict = _job_verdict_dict(to_plain(job_verdict), job_verdict.text())
        topology = getattr(det, "topology", None)
        if topology is not None and topology.process_count > 1 and not data.processes:
            data.processes, data.process_count = [topology.process_index], topology.process_count
    for epoch, values in enumerate(history):  # the job-wide keys, one point per epoch (as the logger's)
        for key, value in values.items():
            v = _finite(value)
            if key.startswith("job/") and v is not None:
                data.job.setdefault(key, Series(key)).add(0.0, epoch + 1, v)


def _from_profiler(data: ReportData, prof) -> None:
    from keras_gpu_tools.logdir.events import to_plain

    data.sources.append(type(prof).__name__)
    prof.wait_for_analysis(timeout=60.0)  # xprof's conclusions, converted in the background
    records = [to_plain(c) for c in list(prof.captures)]
    data.profiles = [_profile_row(r) for r in records]
    # Process 0 of a job: the job's windows (the other processes hold no job_* figures).
    data.job_profiles = [row for r in records if (row := _job_profile_row(r)) is not None]
    topology = getattr(prof, "topology", None)
    if data.job_profiles and topology is not None and topology.process_count > 1 and not data.processes:
        data.processes, data.process_count = [topology.process_index], topology.process_count


def _from_oom(data: ReportData, cb) -> None:
    data.sources.append(type(cb).__name__)
    data.oom_seen = True
    events = list(cb.events)
    data.oom_events = [e.line() for e in events]
    data.oom_details = [e.why() for e in events]
    data.oom_headroom = headroom_lines(cb.headroom())
    data.oom_summary["micro-batches per batch now"] = cb.micro_batches
    if cb.recovery_seconds:
        data.oom_summary["seconds spent in failed attempts"] = round(float(cb.recovery_seconds), 2)


def _from_history(data: ReportData, hist: dict[str, list[Any]]) -> None:
    for key, values in hist.items():
        if key.startswith(_OWN_PREFIXES[:-1]):
            continue
        if key.startswith("oom/"):
            if key not in data.oom_series:
                s = Series(key)
                for i, v in enumerate(values):
                    if _finite(v) is not None:
                        s.add(0.0, i + 1, float(v))
                if s.values:
                    data.oom_series[key] = s
                    data.oom_seen = True
            continue
        s = Series(key)
        for i, v in enumerate(values):
            if _finite(v) is not None:
                s.add(0.0, i + 1, float(v))
        if s.values:
            data.training[key] = s


def gather(sources: Sequence[Any], title: str | None = None) -> ReportData:
    """Reads the callbacks, History or model given into a `ReportData`.

    Each is recognised by its class (a subclass of a package callback
    counts); anything else (Keras's TensorBoard, a LiveView, ...) has nothing
    to add and is left out.
    """
    from keras_gpu_tools.logdir.events import to_plain

    data = ReportData(title=title or "Training report")
    classes = _classes()
    models = []
    for s in _flatten(sources):
        if isinstance(s, dict) and all(isinstance(v, list) for v in s.values()):
            _from_history(data, s)  # history.history
            continue
        role = next((r for r, cls in classes if isinstance(s, cls)), None)
        if role == "model":
            models.append(s)
        elif role == "gpu":
            _from_gpu_logger(data, s)
        elif role == "input":
            _from_detector(data, s)
        elif role == "profile":
            _from_profiler(data, s)
        elif role == "oom":
            _from_oom(data, s)
        elif role == "mixed_precision":
            data.sources.append(type(s).__name__)
            data.findings = [_finding_dict(to_plain(f)) for f in s.findings]
        elif role == "history":
            _from_history(data, s.history)
    for model in models:
        h = getattr(model, "history", None)
        if h is not None and not data.training:
            _from_history(data, h.history)
        if data.findings is None:
            try:
                from keras_gpu_tools.mixed_precision.check import check_mixed_precision

                data.findings = [_finding_dict(to_plain(f)) for f in check_mixed_precision(model)]
                data.sources.append("check_mixed_precision(model)")
            except Exception as e:
                data.notes.append(f"The mixed-precision check failed ({type(e).__name__}: {e}).")
    return data


# ---------------------------------------------------------------------------
# Gathering from a TensorBoard log directory
# ---------------------------------------------------------------------------
_DT_STRING = 7  # the tensor dtype of text summaries


def _text_of(proto) -> str:
    return proto.string_val[0].decode("utf-8", "replace") if proto.string_val else ""


def _scalar_of(proto) -> float | None:
    from tensorboard.util import tensor_util

    try:
        return _finite(tensor_util.make_ndarray(proto).item())
    except Exception:  # not a single number: a histogram, an image, ...
        return None


def _runs(log_dir: str) -> list[tuple[str, str, list[str]]]:
    """(run name, directory, event files) of every folder under log_dir holding event files."""
    runs = []
    for root, dirs, files in os.walk(log_dir):
        dirs[:] = sorted(d for d in dirs if d != "plugins")
        events = sorted(f for f in files if ".tfevents." in f)
        if events:
            rel = os.path.relpath(root, log_dir)
            runs.append(("." if rel == "." else rel.replace(os.sep, "/"), root, events))
    return sorted(runs)


_RECORD_HEADER = struct.Struct("<QI")  # payload length, masked CRC32C of the length


def read_event_file(path: str) -> tuple[list[Any], str | None]:
    """The events of one TensorBoard event file, and why reading stopped early (None: it did not).

    Reads the TFRecord framing itself, so that a file which cannot be read is
    named rather than skipped: each record's length must pass its checksum
    and be there in full, and its payload must parse as an `Event`. The
    payload checksum is not verified (TensorBoard's pure-Python CRC32C reads
    about 2 MB/s); the length checksum and the parse catch a file that is not
    an event file, garbage, and a file cut short.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from keras_gpu_tools.runtime import deps

    _, event_pb2 = deps.tensorboard_protos()
    events: list[Any] = []

    def stopped(what: str) -> str:
        return f"{what} ({len(events)} event(s) read before it)" if events else what

    try:
        with open(path, "rb") as f:
            offset = 0
            while True:
                header = f.read(_RECORD_HEADER.size)
                if not header:
                    return events, None
                if len(header) < _RECORD_HEADER.size:
                    return events, stopped(f"is truncated: the record at byte {offset} is cut short")
                length, crc = _RECORD_HEADER.unpack(header)
                if masked_crc32c(header[:8]) != crc:
                    what = "is corrupt" if events else "is not a TensorBoard event file"
                    return events, stopped(f"{what}: bad record header at byte {offset}")
                payload = f.read(length + 4)  # the payload and its checksum
                if len(payload) < length + 4:
                    return events, stopped(f"is truncated: the record at byte {offset} is cut short")
                event = event_pb2.Event()
                try:
                    event.ParseFromString(payload[:length])
                except DecodeError:
                    return events, stopped(f"is corrupt: the record at byte {offset} is not an event")
                events.append(event)
                offset += _RECORD_HEADER.size + length + 4
    except OSError as e:
        return events, stopped(f"could not be opened ({type(e).__name__}: {e.strerror or e})")


@dataclasses.dataclass
class _Point:
    """One summary value of an event file: a number or a text."""

    wall_time: float
    step: int
    value: float = math.nan
    text: str = ""


def _read_run(
    run: str, directory: str, files: list[str], unreadable: list[tuple[str, str]]
) -> tuple[dict[str, list[_Point]], dict[str, list[_Point]], int]:
    """The scalars and the texts of one run by tag, and how many events were read.

    Scalars are both `simple_value`s (our callbacks) and one-number tensors
    (Keras's TensorBoard callback). Each file that could not be read, whole or
    in part, is added to `unreadable` as (path relative to the log directory,
    what went wrong).
    """
    scalars: dict[str, list[_Point]] = {}
    texts: dict[str, list[_Point]] = {}
    count = 0
    for name in files:
        events, problem = read_event_file(os.path.join(directory, name))
        if problem is not None:
            unreadable.append((name if run == "." else f"{run}/{name}", problem))
        count += len(events)
        for e in events:
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    if math.isfinite(v.simple_value):
                        scalars.setdefault(v.tag, []).append(_Point(e.wall_time, e.step, value=v.simple_value))
                elif v.HasField("tensor") and v.tensor.dtype == _DT_STRING:
                    texts.setdefault(v.tag, []).append(_Point(e.wall_time, e.step, text=_text_of(v.tensor)))
                elif v.HasField("tensor"):
                    value = _scalar_of(v.tensor)
                    if value is not None:
                        scalars.setdefault(v.tag, []).append(_Point(e.wall_time, e.step, value=value))
    return scalars, texts, count


def _training_key(run: str, name: str) -> str:
    """The History key of Keras's `epoch_<name>` in a run: `loss`, `val_loss`, ..."""
    if run in ("train", "."):
        return name
    if run == "validation":
        return f"val_{name}"
    return f"{run.split('/')[-1][:3]}_{name}"


def gather_log_dir(log_dir: str, title: str | None = None) -> ReportData:
    """Reads every run under a TensorBoard log directory into a `ReportData`."""
    from keras_gpu_tools.logdir.events import check_log_dir

    log_dir = check_log_dir(log_dir)
    if not os.path.isdir(log_dir):
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={log_dir!r}, which does not exist. "
            "Expected a TensorBoard log directory written by keras_gpu_tools callbacks."
        )
    data = ReportData(title=title or f"Training report: {log_dir}")
    runs = _runs(log_dir)
    if not runs:
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={log_dir!r}, which holds no "
            "TensorBoard event file. Expected the `log_dir` given to the callbacks."
        )
    window_points: dict[int, dict[str, float]] = {}
    texts: list[tuple[str, str, int, float, str]] = []  # run, tag, step, wall, text
    job_text = ""  # the job verdict as process 0 wrote it to the detector's job run
    job_records: dict[str, tuple[float, int, Any]] = {}  # the profiler's job run: the last JSON of each tag
    read = 0
    # A job of several processes: each GPU's series from its own process's run, the rest from the
    # lowest process only (each process has its own host, input, oom, profile figures: never summed).
    process_of = {run: int(m.group(2)) for run, _, _ in runs if (m := PROCESS_RUN.match(run))}
    # A job run: `<run>/job`, or `job` itself next to `process_<i>` runs (a top-level "job" alone is a user's run).
    top_level_job = any(PROCESS_RUN.match(run).group(1) is None for run in process_of)
    job_runs = {run for run, _, _ in runs if (m := JOB_RUN.match(run)) and (m.group(1) or top_level_job)}
    data.processes = sorted(set(process_of.values()))
    first = data.processes[0] if data.processes else None
    for run, path, files in runs:
        scalars, run_texts, count = _read_run(run, path, files, data.unreadable)
        read += count
        if count:
            data.sources.append(run)
        if run in job_runs:
            for tag, points in scalars.items():
                s = data.job.setdefault(tag, Series(tag))
                for e in points:
                    s.add(e.wall_time, e.step, e.value)
            points = run_texts.get(JOB_VERDICT_TAG, [])
            if points:  # the last one: as of the last epoch end
                job_text = max(points, key=lambda e: (e.wall_time, e.step)).text
            for tag, points in run_texts.items():  # ProfilerWindow's job windows (process 0's)
                if tag.startswith("profile/") and tag.endswith(DATA_SUFFIX):
                    for e in points:
                        if tag not in job_records or (e.wall_time, e.step) >= job_records[tag][:2]:
                            job_records[tag] = (e.wall_time, e.step, e.text)
            continue
        if process_of.get(run, first) != first:
            for tag, points in scalars.items():
                if tag.startswith("gpu/"):
                    s = data.series.setdefault(tag, Series(tag))
                    for e in points:
                        s.add(e.wall_time, e.step, e.value)
                        data.t0 = e.wall_time if data.t0 is None else min(data.t0, e.wall_time)
            points = run_texts.get(DEVICES_DATA_TAG, [])
            texts += [(run, DEVICES_DATA_TAG, e.step, e.wall_time, e.text) for e in points]
            continue
        for tag, points in scalars.items():
            if tag.startswith(("gpu/", "host/")):
                s = data.series.setdefault(tag, Series(tag))
                for e in points:
                    s.add(e.wall_time, e.step, e.value)
                    data.t0 = e.wall_time if data.t0 is None else min(data.t0, e.wall_time)
            elif tag.startswith(("input/", "throughput/")):
                for e in points:
                    window_points.setdefault(e.step, {})[tag] = e.value
            elif tag.startswith("oom/"):
                data.oom_seen = True
                s = data.oom_series.setdefault(tag, Series(tag))
                for e in points:
                    s.add(e.wall_time, e.step, e.value)
            elif tag.startswith("epoch_") and not tag[len("epoch_") :].startswith(_OWN_PREFIXES):
                # (our own epoch logs, which Keras's TensorBoard copies, are read from our runs)
                key = _training_key(run, tag[len("epoch_") :])
                s = data.training.setdefault(key, Series(key))
                for e in points:
                    s.add(e.wall_time, e.step + 1, e.value)
        for tag, points in run_texts.items():
            texts += [(run, tag, e.step, e.wall_time, e.text) for e in points]

    n_files = sum(len(files) for _, _, files in runs)
    if not read and len(data.unreadable) == n_files:
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={log_dir!r}, but none of its "
            f"{n_files} event file(s) could be read: "
            + "; ".join(f"{p} {why}" for p, why in data.unreadable)
            + ". Expected TensorBoard event files written by the callbacks."
        )
    if window_points:
        steps = sorted(window_points)
        last = dict(window_points[steps[-1]])
        steps = [s for s in steps if any(window_points[s].get(k) is not None for k, _ in SPLIT_KEYS)]
        data.split_axis = "step"
        data.split_x = [float(s) for s in steps]
        data.split = {
            k: [_finite(window_points[s].get(k)) for s in steps] for k, _ in SPLIT_KEYS + (("input/step_ms", ""),)
        }
        data.throughput = last
    texts.sort(key=lambda t: (t[3], t[2]))
    prose: dict[str, str] = {}  # the last text of each tag written for people
    records: dict[str, Any] = {}  # the last JSON of each `.../data` tag
    oom_records: list[dict[str, Any]] = []
    devices: dict[int, Any] = {}  # the last device records of each process (-1: not a process run)
    for run, tag, _step, _wall, text in texts:
        if not tag.endswith(DATA_SUFFIX):
            prose[tag] = text
            continue
        try:
            value = json.loads(text)
        except ValueError:
            data.notes.append(f"The tag {tag!r} of run {run!r} holds no valid JSON; it is left out.")
            continue
        if tag == OOM_DATA_TAG:
            oom_records.append(value)  # one per recovery
        elif tag == DEVICES_DATA_TAG:
            devices[process_of.get(run, -1)] = value
        else:
            records[tag] = value

    if oom_records:
        records[OOM_DATA_TAG] = oom_records
    if devices:  # every process's GPUs, in process order
        records[DEVICES_DATA_TAG] = [
            r for p in sorted(devices) for r in (devices[p] if isinstance(devices[p], list) else [devices[p]])
        ]
        counts = [r.get("process_count") for r in records[DEVICES_DATA_TAG] if isinstance(r, dict)]
        data.process_count = max([c for c in counts if isinstance(c, int)] + [len(data.processes), 1])
    elif data.processes:
        data.process_count = max(len(data.processes), 1)

    def read(tag: str, convert) -> Any:
        """`convert(records[tag])`; None where the tag is missing or its JSON not shaped as expected."""
        if tag not in records:
            return None
        try:
            return convert(records[tag])
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            data.notes.append(f"The JSON of tag {tag!r} is not as expected ({type(e).__name__}: {e}); it is left out.")
            return None

    gpus = read(DEVICES_DATA_TAG, lambda v: [_gpu_row(r) for r in v])
    if gpus is not None:
        data.gpus = gpus
    profiles: dict[str, dict[str, Any]] = {}
    for tag in [t for t in records if t.startswith("profile/") and not t.endswith(ANALYSIS_DATA_SUFFIX)]:
        window = tag[: -len(DATA_SUFFIX)]  # profile/steps_<a>_<b>; xprof's analysis comes in a tag of its own
        analysis = records.get(window + ANALYSIS_DATA_SUFFIX)
        row = read(tag, lambda v, a=analysis: _profile_row(v if a is None else {**v, "analysis": a}))
        if row is not None:
            profiles[window] = row
    findings = read(MP_DATA_TAG, lambda v: [_finding_dict(r) for r in v])
    if findings is not None:
        data.findings = findings
    oom = read(OOM_DATA_TAG, lambda v: (_oom_lines(v), sum(float(r.get("seconds") or 0.0) for r in v)))
    if oom is not None:
        data.oom_seen, (data.oom_events, data.oom_details) = True, oom[0]
        if oom[1]:
            data.oom_summary["seconds spent in failed attempts"] = round(oom[1], 2)
    headroom = read(OOM_HEADROOM_TAG, lambda v: headroom_lines(v[-1] if v and isinstance(v[-1], list) else v))
    if headroom is not None:
        data.oom_seen, data.oom_headroom = True, headroom
    text = prose.get("input/verdict", "")  # the last one written: the whole fit's, like its JSON
    verdict = read(
        VERDICT_DATA_TAG,
        lambda v: (_verdict_dict(v["verdict"], text, v.get("fit_figures")), _floats(v["figures"])),
    )
    if verdict is not None:
        data.verdict = verdict[0]
        data.throughput.update(verdict[1])
    # The job's verdict: the "job" part of process 0's JSON, else the text of the job run.
    job_verdict = read(
        VERDICT_DATA_TAG, lambda v: _job_verdict_dict(v["job"], job_text) if v.get("job") is not None else None
    )
    if job_verdict is None and job_text:
        job_verdict = _job_verdict_dict({}, job_text)
    data.job_verdict = job_verdict
    if job_verdict is not None and len(job_verdict["processes"]) > data.process_count:
        data.process_count = len(job_verdict["processes"])
    data.job_profiles = _job_profiles_of(data, {tag: text for tag, (_, _, text) in job_records.items()})
    if data.job_profiles and max(p["processes"] for p in data.job_profiles) > data.process_count:
        data.process_count = max(p["processes"] for p in data.job_profiles)
    _read_old_prose(data, prose, records, profiles)  # logs written before the JSON tags
    data.profiles = sorted(profiles.values(), key=lambda p: p["start"])
    micro = data.oom_series.get("oom/micro_batches")
    if micro is not None and micro.values:  # the last split in use, as the callback's `micro_batches`
        data.oom_summary = {"micro-batches per batch now": int(micro.values[-1]), **data.oom_summary}
    return data


def _job_profiles_of(data: ReportData, texts: dict[str, str]) -> list[dict[str, Any]]:
    """The job's profiler windows from the JSON texts of the profiler's job run, by tag."""
    rows = []
    for tag in sorted(t for t in texts if not t.endswith(ANALYSIS_DATA_SUFFIX)):
        window = tag[: -len(DATA_SUFFIX)]
        try:
            rec = json.loads(texts[tag])
            analysis = (
                json.loads(texts[window + ANALYSIS_DATA_SUFFIX]) if window + ANALYSIS_DATA_SUFFIX in texts else None
            )
            row = _job_profile_row(rec, analysis)
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            data.notes.append(
                f"The JSON of tag {tag!r} of the job run is not as expected ({type(e).__name__}: {e}); it is left out."
            )
            continue
        if row is not None:
            rows.append(row)
    return sorted(rows, key=lambda p: p["start"])


def _oom_lines(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The line of each recovery and why, from `OOMEvent` records."""
    from keras_gpu_tools.memory.events import OOMEvent

    known = {f.name for f in dataclasses.fields(OOMEvent)}
    events = [OOMEvent(**{k: r[k] for k in known & set(r)}) for r in records]
    return [e.line() for e in events], [e.why() for e in events]


def _floats(figures: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in figures.items() if _finite(v) is not None}


# ---------------------------------------------------------------------------
# Logs written before the JSON tags: their text read as well as it can be
# ---------------------------------------------------------------------------
def _read_old_prose(
    data: ReportData, prose: dict[str, str], records: dict[str, Any], profiles: dict[str, dict[str, Any]]
) -> None:
    """Fills what no JSON tag gave from the texts written for people (logs of earlier versions)."""
    if DEVICES_DATA_TAG not in records and "gpu/devices" in prose:
        data.gpus = _parse_device_table(prose["gpu/devices"])
    if MP_DATA_TAG not in records and MP_TAG in prose:
        text = prose[MP_TAG]
        data.findings = [] if text.strip().startswith(_NO_FINDING) else _parse_findings(text)
    if VERDICT_DATA_TAG not in records and "input/verdict" in prose:
        data.verdict = _parse_verdict(prose["input/verdict"])
        data.throughput.update(_figures_of(prose["input/verdict"]))
    for tag, text in prose.items():
        m = re.match(r"^(profile/steps_(\d+)_(\d+))(/input_pipeline)?$", tag)
        if m is None or m.group(1) + DATA_SUFFIX in records:
            continue
        a, b = int(m.group(2)), int(m.group(3))
        p = profiles.setdefault(m.group(1), _profile_row({"start_step": a, "num_steps": b - a}))
        if m.group(4):
            p["conclusion"] = text
            continue
        lm = re.search(r"\(([^()]*)\) -> (.*) \(([\d.]+) MiB(?:, mean step ([\d.]+) ms)?\)$", text)
        if lm:
            p["reason"], p["trace_dir"] = lm.group(1), lm.group(2)
            p["size_mib"] = float(lm.group(3))
            p["mean_step_ms"] = float(lm.group(4)) if lm.group(4) else None


def _parse_verdict(text: str) -> dict[str, Any]:
    lines = text.splitlines()
    first = lines[0] if lines else ""
    head = first.split(":", 1)[1].strip() if ":" in first else "unknown"
    scoped = re.match(r"^(.*?) \((.*)\)$", head)  # "moderately input-bound (epochs 2-3)"
    return {
        "category": scoped.group(1) if scoped else head,
        "message": next((ln for ln in lines[1:] if ln.strip()), ""),
        "evidence": [],
        "advice": [ln[2:] for ln in lines if ln.startswith("- ")],
        "scope": scoped.group(2) if scoped else "",
        "phases": [],
        "speedup_bound": None,
        "fit_wait_fraction": None,
        "fit_figures": {},
        "text": text,
    }


def _parse_findings(text: str) -> list[dict[str, str | None]]:
    out = []
    for line in text.splitlines():
        m = re.match(r"^- \[(\w+)\](?: `([^`]*)`)?: (.*)$", line.strip())
        if m:
            out.append({"kind": m.group(1), "layer": m.group(2) or None, "message": m.group(3)})
    return out


_SUMMARY_ROWS = {"steps/s": "throughput/steps_per_sec", "samples/s": "throughput/samples_per_sec"}


def _figures_of(summary: str) -> dict[str, float]:
    """The whole-run figures of an InputBoundDetector summary's table."""
    out = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in _SUMMARY_ROWS:
            v = _finite(cells[1])
            if v is not None:
                out[_SUMMARY_ROWS[cells[0]]] = v
    return out


def _parse_device_table(text: str) -> list[dict[str, str]]:
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].isdigit():
            gpus.append(
                {
                    "index": cells[0],
                    "name": cells[1],
                    "uuid": cells[2],
                    "memory": f"{cells[3]} MiB",
                    "compute capability": cells[4],
                }
            )
    return gpus


# ---------------------------------------------------------------------------
# Figures (matplotlib, imported lazily; no pyplot, so no global state)
# ---------------------------------------------------------------------------
def _literal(fig) -> None:
    """Makes every label, title and legend entry of `fig` show its text as written.

    They hold tag, metric and GPU names, in which matplotlib would read
    "$...$" as mathtext (and fail to draw "$a_b_c$": a double subscript) or
    hand the text to LaTeX under `text.usetex`. Tick labels are left to
    matplotlib: they are numbers, which its formatters may write as mathtext.
    """
    from matplotlib.text import Text

    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks.add(axis.get_offset_text())
            ticks.update(axis.get_ticklabels(which="both"))
    for t in fig.findobj(Text):
        if t not in ticks:
            t.set_usetex(False)
            t.set_parse_math(False)


def _new_figure(rows: int = 1, height: float = 2.6, width: float = 8.0):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * rows), dpi=100, layout="constrained")
    axes = [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]
    return fig, axes


def _seconds(data: ReportData, s: Series) -> list[float]:
    t0 = data.t0 or (s.wall[0] if s.wall else 0.0)
    return [w - t0 for w in s.wall]


def _gpu_figure(data: ReportData, index: str):
    fig, (ax_u, ax_m) = _new_figure(2)
    name = next((g["name"] for g in data.gpus if g.get("index") == index), "")
    fig.suptitle(f"GPU {index}" + (f": {name}" if name else ""), fontsize=11)
    plotted = False
    for field in UTIL_FIELDS:
        s = data.series.get(f"gpu/{index}/{field}")
        if s and s.values:
            ax_u.plot(_seconds(data, s), s.values, label=field, linewidth=1.4 if field in UTIL_FIELDS[:2] else 0.9)
            plotted = True
    ax_u.set_ylabel("%")
    ax_u.set_ylim(0, 105)
    ax_u.set_title("utilization", fontsize=9, loc="left")
    if plotted:
        ax_u.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    plotted = False
    for field in MEMORY_FIELDS:
        s = data.series.get(f"gpu/{index}/{field}")
        if s and s.values:
            style = "--" if field == "memory_total_mib" else "-"
            ax_m.plot(_seconds(data, s), s.values, style, label=field, linewidth=1.2)
            plotted = True
    ax_m.set_ylabel("MiB")
    ax_m.set_xlabel("seconds since the first sample")
    ax_m.set_title("memory", fontsize=9, loc="left")
    if plotted:
        ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _host_figure(data: ReportData):
    fig, (ax_c, ax_m) = _new_figure(2, height=2.0)
    fig.suptitle("Host", fontsize=11)
    for key in ("host/cpu_percent", "host/system_cpu_percent"):
        s = data.series.get(key)
        if s and s.values:
            ax_c.plot(_seconds(data, s), s.values, label=key.split("/")[1], linewidth=1.2)
    ax_c.set_ylabel("%")
    ax_c.set_title("CPU", fontsize=9, loc="left")
    ax_c.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    s = data.series.get("host/rss_mib")
    if s and s.values:
        ax_m.plot(_seconds(data, s), s.values, label="rss_mib", color="#2ca02c", linewidth=1.2)
        ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax_m.set_ylabel("MiB")
    ax_m.set_xlabel("seconds since the first sample")
    ax_m.set_title("resident memory", fontsize=9, loc="left")
    return fig


def _split_figure(data: ReportData):
    fig, (ax,) = _new_figure(1, height=3.0)
    n = len(data.split_x)
    pos = list(range(n))
    bottom = [0.0] * n
    for (key, label), color in zip(SPLIT_KEYS, SPLIT_COLORS):
        vals = [v or 0.0 for v in data.split.get(key, [None] * n)]
        ax.bar(pos, vals, bottom=bottom, label=label, color=color, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i in range(n):  # a split the detector could not measure: say so, do not draw 0
        if all((data.split.get(k) or [None] * n)[i] is None for k, _ in SPLIT_KEYS):
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8, color="#777")
    ax.set_xticks(pos)
    ax.set_xticklabels([f"{x:g}" for x in data.split_x], fontsize=8)
    if n > 20:
        for i, t in enumerate(ax.get_xticklabels()):
            t.set_visible(i % max(1, n // 10) == 0)
    ax.set_xlabel("epoch" if data.split_axis == "epoch" else "training step (end of window)")
    ax.set_ylabel("ms per step")
    ax.set_title("Step time: input wait, compute, other", fontsize=10, loc="left")
    ax.set_ylim(0, max(bottom + [0.0]) * 1.25 or 1.0)
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    return fig


def _oom_figure(data: ReportData):
    fig, (ax,) = _new_figure(1, height=2.4)
    for key, s in data.oom_series.items():
        if s.values:
            ax.plot(s.steps, s.values, label=key, linewidth=1.4, marker="o", markersize=4)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch" if all(w == 0.0 for s in data.oom_series.values() for w in s.wall) else "training step")
    ax.set_title("Out of memory: events and micro-batches", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    return fig


def _training_figure(data: ReportData):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = sorted({k[4:] if k.startswith("val_") else k for k in data.training})
    names = [n for n in names if n != "learning_rate"] or names
    cols = min(len(names), 2)
    rows = -(-len(names) // cols)
    fig = Figure(figsize=(8.0, 2.4 * rows + 0.3), dpi=100, layout="constrained")
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


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------
class TrainingReport:
    """One view of a training run; see `report()`.

    Renders as text (`str(report)`, `report.text()`), as HTML in a notebook,
    and saves as an HTML file with its plots embedded (`report.save(path)`)
    or as PNG files (`report.save_figures(directory)`).
    """

    def __init__(self, data: ReportData):
        self.data = data
        self._figures = None
        self._pngs: dict[str, bytes] | None = None

    # -- figures ------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        """The report's plots as matplotlib `Figure`s, by name (drawn once)."""
        if self._figures is None:
            d = self.data
            figs: dict[str, Any] = {}
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                note = "The plots need matplotlib, which could not be imported: `pip install matplotlib`."
                if note not in d.notes:
                    d.notes.append(note)
                self._figures = figs
                return figs
            for index in d.gpu_indices():
                if any(k.startswith(f"gpu/{index}/") for k in d.series):
                    figs[f"gpu_{index}"] = _gpu_figure(d, index)
            if any(k.startswith("host/") for k in d.series):
                figs["host"] = _host_figure(d)
            if d.split_x and any(v is not None for k, _ in SPLIT_KEYS for v in d.split.get(k, [])):
                figs["step_time"] = _split_figure(d)
            if d.oom_count() or any(
                v > 1 for k, s in d.oom_series.items() if k.endswith("micro_batches") for v in s.values
            ):
                figs["oom"] = _oom_figure(d)  # not for a run without a single OOM
            if d.training:
                figs["training"] = _training_figure(d)
            for fig in figs.values():
                _literal(fig)
            self._figures = figs
        return self._figures

    def pngs(self) -> dict[str, bytes]:
        if self._pngs is None:
            out = {}
            for name, fig in self.figures().items():
                buf = io.BytesIO()
                fig.savefig(buf, format="png", dpi=100)
                out[name] = buf.getvalue()
            self._pngs = out
        return self._pngs

    def save_figures(self, directory) -> list[str]:
        """Writes each plot as `<directory>/<name>.png`; returns the paths."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name, png in self.pngs().items():
            path = os.path.join(directory, f"{name}.png")
            with open(path, "wb") as f:
                f.write(png)
            paths.append(path)
        return paths

    # -- text -----------------------------------------------------------------------
    def text(self) -> str:
        d = self.data
        out = [d.title, "=" * len(d.title)]
        if d.sources:
            out.append(f"From: {', '.join(d.sources)}")
        for heading, body in self._sections_text():
            out += ["", heading, "-" * len(heading)] + body
        missing = self.not_measured()
        if missing:
            out += ["", "Not measured in this run: " + "; ".join(missing) + "."]
        for n in d.notes:
            out += ["", f"Note: {n}"]
        return "\n".join(out)

    __str__ = text

    def __repr__(self) -> str:
        return f"<TrainingReport {self.data.title!r}: {', '.join(self.figures()) or 'no plots'}>"

    def not_measured(self) -> list[str]:
        """What this run's report has no data for, and which callback measures it."""
        d = self.data
        out = []
        if not d.series and not d.gpus:
            out.append("GPU and host metrics (GPUUtilizationLogger)")
        if not d.split_x and not d.verdict:
            out.append("step time and the input-bound verdict (InputBoundDetector)")
        if not d.profiles:
            out.append("profiler windows (ProfilerWindow)")
        if d.findings is None:
            out.append("mixed-precision findings (MixedPrecisionCheck, or pass the model)")
        return out

    def _sections_text(self) -> list[tuple[str, list[str]]]:
        d = self.data
        sections = []
        if d.unreadable:
            sections.append((_UNREADABLE, [f"- {path} {why}" for path, why in d.unreadable]))
        body = []
        for g in d.gpus:
            where = f", process {g['process']}" if g.get("process") else ""
            body.append(
                f"GPU {g['index']}: {g['name']}, {g['memory']}, compute capability {g['compute capability']}{where}"
            )
        rows = [(k, s) for k, s in d.series.items() if s.values]
        if rows:
            body.append(f"{'metric':42s} {'min':>9s} {'mean':>9s} {'max':>9s} {'last':>9s}")
            for k, s in sorted(rows):
                body.append(f"{k:42s} " + " ".join(f"{v:9.1f}" for v in s.stats()))
        if not d.gpu_indices() and rows:
            body.insert(0, "No GPU was monitored (host metrics only).")
        if body:
            sections.append(("GPUs and host", body))
        if d.process_count > 1 or d.job or d.job_verdict or d.job_profiles:
            sections.append((self._job_heading(), self._job_text()))

        body = []
        if d.split_x:
            body.append(
                f"{d.split_axis:>8s} " + " ".join(f"{label:>11s}" for _, label in SPLIT_KEYS) + f" {'step':>9s}"
            )
            for i, x in enumerate(d.split_x):
                vals = [d.split.get(k, [None] * len(d.split_x))[i] for k, _ in SPLIT_KEYS + (("input/step_ms", ""),)]
                body.append(
                    f"{x:8g} "
                    + " ".join("        n/a" if v is None else f"{v:8.2f} ms" for v in vals[:3])
                    + ("      n/a" if vals[3] is None else f" {vals[3]:6.2f} ms")
                )
        for k in ("throughput/samples_per_sec", "throughput/steps_per_sec", "throughput/mfu"):
            if k in d.throughput:
                body.append(f"{k}: {d.throughput[k]:.4g}")
        if body:
            sections.append(("Step time", body))

        if d.verdict:
            v = d.verdict
            scope = f" ({v['scope']})" if v.get("scope") else ""
            body = [f"Verdict: {v['category']}{scope}", v["message"]]
            if self._own_verdict_note():
                body.insert(0, self._own_verdict_note())
            if v.get("fit_wait_fraction") is not None and v.get("scope") not in ("", "the whole fit"):
                body.append(f"Whole fit, every phase included: {100 * v['fit_wait_fraction']:.1f}% waiting for input.")
            if len(v.get("phases") or []) > 1:
                body += ["Phases:"] + [f"- {_phase_line(p)}" for p in v["phases"]]
            body += list(v["evidence"])
            if v["advice"]:
                body += ["What to change:"] + [f"- {a}" for a in v["advice"]]
            sections.append(("Input pipeline", body))

        if d.oom_seen:
            n = d.oom_count() or 0
            body = [f"{n} recover{'y' if n == 1 else 'ies'} from out-of-memory errors."]
            body += [f"{k}: {v}" for k, v in d.oom_summary.items()]
            for i, line in enumerate(d.oom_events):
                body.append(f"- {line}")
                body += [f"    {w}" for w in (d.oom_details[i] if i < len(d.oom_details) else [])]
            if d.oom_headroom:
                body += ["Headroom:"] + [f"- {h}" for h in d.oom_headroom]
            if n and not d.oom_events:
                body.append("(The log directory holds the counts; the callback's `summary()` has each recovery.)")
            sections.append(("Out of memory", body))

        if d.profiles:
            body = []
            for p in d.profiles:
                size = "?" if p["size_mib"] is None else f"{p['size_mib']:.1f} MiB"
                mean = "" if p["mean_step_ms"] is None else f", mean step {p['mean_step_ms']:.2f} ms"
                where = p["trace_dir"] or "no trace file"
                body.append(f"steps {p['steps']} ({p['reason'] or '?'}): {where} ({size}{mean})")
                body.append(f"  conclusion: {p['conclusion'] or 'none (no xprof analysis)'}")
            sections.append(("Profiler windows", body))

        if d.findings is not None:
            if not d.findings:
                body = [_NO_FINDING]
            else:
                body = [
                    f"- [{f['kind']}]" + (f" {f['layer']}" if f["layer"] else "") + f": {f['message']}"
                    for f in d.findings
                ]
            sections.append(("Mixed precision", body))

        if d.training:
            body = [f"{k}: " + ", ".join(f"{v:.4g}" for v in s.values) for k, s in sorted(d.training.items())]
            sections.append(("Training curves", body))
        return sections

    def _own_verdict_note(self) -> str:
        """In a job: whose verdict the input-pipeline section is, and where the job's is."""
        d = self.data
        if d.job_verdict is None or not d.processes:
            return ""
        return (
            f"Process {d.processes[0]}'s own verdict; every process's figures and the stragglers are under "
            f'"{self._job_heading()}".'
        )

    def _job_heading(self) -> str:
        d = self.data
        return f"Job of {d.process_count} processes" if d.process_count > 1 else "Job"

    def _job_text(self) -> list[str]:
        d = self.data
        body = []
        if len(d.processes) > 1:
            body.append(
                f"Runs of processes {', '.join(map(str, d.processes))}: the GPUs of every process; "
                f"the other sections are process {d.processes[0]}'s."
            )
        elif d.processes:
            body.append(f"The figures of process {d.processes[0]}; the job-wide ones below are every process's.")
        rows, single = d.job_rows()
        if rows or single:
            body.append("Job-wide figures at the last epoch:")
        if rows:
            body.append(f"{'figure':42s} {'min':>9s} {'mean':>9s} {'max':>9s}")
            for name, *stats in rows:
                body.append(f"{name:42s} " + " ".join("      n/a" if v is None else f"{v:9.1f}" for v in stats))
        body += [f"{name}: {value:.4g}" for name, value in single]
        if not rows and not single and not d.job_profiles:  # (ProfilerWindow alone writes no job/ figure)
            body.append("No job-wide figures were written (one process, or its channel failed).")
        jv = d.job_verdict
        if jv is not None:
            body += ["", "Input pipeline of each process (its steady state):"]
            if jv["processes"]:
                table = [JOB_VERDICT_HEADER, *_job_process_rows(jv)]
                widths = [max(len(r[i]) for r in table) for i in range(len(JOB_VERDICT_HEADER))]
                body += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
                body.append(jv["message"])
                if jv["advice"]:
                    body += ["What to change:"] + [f"- {a}" for a in jv["advice"]]
            else:  # only the job run's text (no JSON): as process 0 wrote it
                body += jv["text"].splitlines()
        if d.job_profiles:
            body += ["", "Profiler windows of the job (one session, one trace per process):"]
            for p in d.job_profiles:
                body += _job_profile_lines(p)
        return body

    # -- HTML ------------------------------------------------------------------------
    def html(self, full_page: bool = False) -> str:
        d = self.data
        pngs = self.pngs()
        e = html.escape

        def img(name: str, alt: str) -> str:
            if name not in pngs:
                return ""
            b64 = base64.b64encode(pngs[name]).decode("ascii")
            return (
                f'<figure class="kgt-fig" data-figure="{e(name)}"><img alt="{e(alt)}" '
                f'src="data:image/png;base64,{b64}"/></figure>'
            )

        def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
            h = "".join(f"<th>{e(str(c))}</th>" for c in header)
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
            return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"

        parts = [f"<h2>{e(d.title)}</h2>"]
        if d.sources:
            parts.append(f'<p class="kgt-src">From: {e(", ".join(d.sources))}</p>')
        summary = self._badges()
        if summary:
            parts.append(
                '<p class="kgt-badges">'
                + " ".join(f'<span class="kgt-badge kgt-{cls}">{e(t)}</span>' for t, cls in summary)
                + "</p>"
            )

        if d.unreadable:
            parts.append(f"<h3>{_UNREADABLE}</h3>")
            parts.append("<ul>" + "".join(f"<li>{e(p)} {e(why)}</li>" for p, why in d.unreadable) + "</ul>")

        if d.series or d.gpus:
            parts.append("<h3>GPUs and host</h3>")
            if d.gpus:
                parts.append(
                    table(
                        ["GPU", "name", "memory", "compute capability", "UUID"]
                        + (["process"] if any(g.get("process") for g in d.gpus) else []),
                        [
                            (g["index"], g["name"], g["memory"], g["compute capability"], g.get("uuid", ""))
                            + ((g.get("process", ""),) if any(g.get("process") for g in d.gpus) else ())
                            for g in d.gpus
                        ],
                    )
                )
            else:
                parts.append("<p>No GPU was monitored: host metrics only.</p>")
            for index in d.gpu_indices():
                parts.append(img(f"gpu_{index}", f"GPU {index} utilization and memory over time"))
            parts.append(img("host", "host CPU and memory over time"))
            if d.series:
                parts.append(
                    "<details><summary>All series (min / mean / max / last)</summary>"
                    + table(
                        ["metric", "min", "mean", "max", "last"],
                        [(k, *(f"{v:.1f}" for v in s.stats())) for k, s in sorted(d.series.items()) if s.values],
                    )
                    + "</details>"
                )

        if d.process_count > 1 or d.job or d.job_verdict or d.job_profiles:
            parts.append(f"<h3>{e(self._job_heading())}</h3>")
            rows, single = d.job_rows()
            if d.processes:
                parts.append(f"<p>{e(self._job_text()[0])}</p>")
            if rows:
                parts.append(
                    table(
                        ["job-wide figure at the last epoch", "min", "mean", "max"],
                        [(n, *("n/a" if v is None else f"{v:.1f}" for v in stats)) for n, *stats in rows],
                    )
                )
            if single:
                parts.append(table(["figure", "value"], [(n, f"{v:.4g}") for n, v in single]))
            jv = d.job_verdict
            if jv is not None:
                parts.append("<p>Input pipeline of each process (its steady state):</p>")
                if jv["processes"]:
                    parts.append(table(JOB_VERDICT_HEADER, _job_process_rows(jv)))
                    cls = "kgt-straggler" if jv["stragglers"] else "kgt-no-straggler"
                    parts.append(f'<p class="{cls}">{e(jv["message"])}</p>')
                    if jv["advice"]:
                        parts.append(
                            "<p>What to change:</p><ul>" + "".join(f"<li>{e(a)}</li>" for a in jv["advice"]) + "</ul>"
                        )
                else:
                    parts.append(f"<pre>{e(jv['text'])}</pre>")
            if d.job_profiles:
                parts.append("<p>Profiler windows of the job (one session, one trace per process):</p>")
                for p in d.job_profiles:
                    where = p["trace_dir"] or "no trace file"
                    parts.append(
                        f'<p class="kgt-job-profile">steps {e(p["steps"])}: {len(p["files"])} trace files of '
                        f"{p['processes']} processes in <code>{e(where)}</code></p>"
                    )
                    rows = [
                        (
                            f"{i} (slowest)" if i == p["slowest"] else str(i),
                            "not measured" if ms is None else f"{ms:.2f} ms",
                        )
                        for i, ms in enumerate(p["mean_step_ms"])
                    ]
                    parts.append(table(["process", "mean step in the window"], rows))
                    if p["files"]:
                        parts.append(
                            "<ul>" + "".join(f"<li>trace: {e(os.path.basename(f))}</li>" for f in p["files"]) + "</ul>"
                        )
                    if len(p["files"]) < p["processes"]:
                        parts.append(
                            f"<p>Only {len(p['files'])} of {p['processes']} processes' traces are there "
                            "(is log_dir shared by every host?)</p>"
                        )
                    parts.append(f"<p>xprof over every trace: {e(p['conclusion'] or 'none (no xprof analysis)')}</p>")

        if "step_time" in pngs:
            parts.append("<h3>Step time</h3>")
            parts.append(img("step_time", "step time split into input wait, compute and other"))
            tp = [(k, f"{d.throughput[k]:.4g}") for k in sorted(d.throughput)]
            if tp:
                parts.append(
                    "<details><summary>Figures of the whole run</summary>"
                    + table(["figure", "value"], tp)
                    + "</details>"
                )

        if d.verdict:
            v = d.verdict
            parts.append("<h3>Input pipeline</h3>")
            scope = f" ({v['scope']})" if v.get("scope") else ""
            if self._own_verdict_note():
                parts.append(f"<p><i>{e(self._own_verdict_note())}</i></p>")
            parts.append(f'<p><b class="kgt-verdict">{e(v["category"])}{e(scope)}</b>: {e(v["message"])}</p>')
            if len(v.get("phases") or []) > 1:
                parts.append(
                    table(
                        ["phase", "steps", "waiting", "step", "in the verdict"],
                        [
                            (
                                p["label"],
                                p["steps"],
                                "n/a" if p["wait_fraction"] is None else f"{100 * p['wait_fraction']:.1f}%",
                                "n/a" if p["step_ms"] is None else f"{p['step_ms']:.2f} ms",
                                "yes" if p["steady"] else f"no: {p['reason'] or 'warm-up'}",
                            )
                            for p in v["phases"]
                        ],
                    )
                )
            if v.get("fit_wait_fraction") is not None and v.get("scope") not in ("", "the whole fit"):
                parts.append(
                    f"<p>Whole fit, every phase included: {100 * v['fit_wait_fraction']:.1f}% waiting for input.</p>"
                )
            parts += [f"<p>{e(x)}</p>" for x in v["evidence"]]
            if v["advice"]:
                parts.append("<p>What to change:</p><ul>" + "".join(f"<li>{e(a)}</li>" for a in v["advice"]) + "</ul>")

        if d.oom_seen:
            parts.append("<h3>Out of memory</h3>")
            n = d.oom_count() or 0
            parts.append(f"<p>{n} recover{'y' if n == 1 else 'ies'} from out-of-memory errors.</p>")
            if d.oom_events:
                items = []
                for i, x in enumerate(d.oom_events):
                    why = d.oom_details[i] if i < len(d.oom_details) else []
                    items.append("<li>" + e(x) + "".join(f"<br><small>{e(w)}</small>" for w in why) + "</li>")
                parts.append("<ul>" + "".join(items) + "</ul>")
            if d.oom_headroom:
                parts.append("<p>Headroom:</p><ul>" + "".join(f"<li>{e(h)}</li>" for h in d.oom_headroom) + "</ul>")
            rows = [(k, v) for k, v in d.oom_summary.items()]
            if rows:
                parts.append(table(["figure", "value"], rows))
            parts.append(img("oom", "out-of-memory events and micro-batches"))

        if d.profiles:
            parts.append("<h3>Profiler windows</h3>")
            parts.append(
                table(
                    ["steps", "reason", "mean step", "trace", "size", "xprof conclusion"],
                    [
                        (
                            p["steps"],
                            p["reason"],
                            "" if p["mean_step_ms"] is None else f"{p['mean_step_ms']:.2f} ms",
                            p["trace_dir"],
                            "" if p["size_mib"] is None else f"{p['size_mib']:.1f} MiB",
                            p["conclusion"] or "-",
                        )
                        for p in d.profiles
                    ],
                )
            )

        if d.findings is not None:
            parts.append("<h3>Mixed precision</h3>")
            if not d.findings:
                parts.append(f"<p>{_NO_FINDING}</p>")
            else:
                parts.append(
                    table(
                        ["kind", "layer", "finding"], [(f["kind"], f["layer"] or "", f["message"]) for f in d.findings]
                    )
                )

        if "training" in pngs:
            parts.append("<h3>Training curves</h3>")
            parts.append(img("training", "loss and metrics per epoch"))
        missing = self.not_measured()
        if missing:
            parts.append(f'<p class="kgt-src">Not measured in this run: {e("; ".join(missing))}.</p>')
        for n in d.notes:
            parts.append(f"<p><i>{e(n)}</i></p>")
        body = f'<div class="kgt-report">{_CSS}{"".join(p for p in parts if p)}</div>'
        if not full_page:
            return body
        return (
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{e(d.title)}</title></head>'
            f"<body>{body}</body></html>\n"
        )

    def _badges(self) -> list[tuple[str, str]]:
        d = self.data
        out = []
        if d.unreadable:
            out.append((f"{len(d.unreadable)} event file(s) could not be read", "bad"))
        if d.process_count > 1:
            out.append((f"job of {d.process_count} processes", "info"))
        if d.job_verdict is not None and d.job_verdict["processes"]:
            slow = sorted({p for p, _ in d.job_verdict["stragglers"]})
            if slow:
                out.append((f"straggler: process {', '.join(map(str, slow))}", "bad"))
            else:
                out.append(("no straggler", "ok"))
        for index in d.gpu_indices():
            s = d.series.get(f"gpu/{index}/sm_activity_percent") or d.series.get(f"gpu/{index}/utilization_percent")
            if s and s.values:
                what = "SM activity" if s.key.endswith("sm_activity_percent") else "utilization"
                mean = s.stats()[1]
                out.append((f"GPU {index}: {what} {mean:.0f}%", "ok" if mean >= 70 else "warn"))
        if d.verdict:
            cat = d.verdict["category"]
            bound = d.verdict.get("speedup_bound")
            text = cat if bound is None or cat == "unknown" else f"{cat} (at most {bound:.2f}x faster without the wait)"
            out.append((text, "bad" if cat.startswith("highly") else "warn" if cat.startswith("moderately") else "ok"))
        if d.oom_seen:
            n = d.oom_count() or 0
            out.append((f"{n} OOM recover{'y' if n == 1 else 'ies'}", "warn" if n else "ok"))
        if d.profiles:
            out.append((f"{len(d.profiles)} profiler window(s)", "info"))
        if d.findings is not None:
            n = len(d.findings)
            out.append((f"{n} mixed-precision finding(s)", "warn" if n else "ok"))
        return out

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path) -> str:
        """Writes the report as one HTML file with the plots embedded; returns the path."""
        path = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html(full_page=True))
        return path

    def write_to_tensorboard(self, log_dir, run_name: str = "report") -> str:
        """Writes the mixed-precision findings (text and JSON) and the text report into `log_dir/<run_name>`.

        The callbacks write everything else themselves; this keeps the
        findings for a report built later from the log directory, and puts
        the text report in TensorBoard's Text tab.
        """
        from keras_gpu_tools.logdir.events import EventWriter

        run_dir = os.path.join(os.fspath(log_dir), run_name)
        writer = EventWriter(run_dir)
        try:
            if self.data.findings is not None:
                writer.text(MP_TAG, findings_markdown(self.data.findings), step=0)
                writer.json(MP_DATA_TAG, self.data.findings, step=0)
            writer.text("report/summary", "```\n" + self.text() + "\n```", step=0)
        finally:
            writer.close()
        return run_dir


def findings_markdown(findings: Sequence[dict[str, str | None]]) -> str:
    if not findings:
        return _NO_FINDING
    return "\n".join(
        f"- [{f['kind']}]" + (f" `{f['layer']}`" if f["layer"] else "") + f": {f['message']}" for f in findings
    )


_CSS = """<style>
.kgt-report{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:13px;max-width:900px;color:#222}
.kgt-report h2{margin:4px 0 2px 0;font-size:20px}
.kgt-report h3{margin:18px 0 6px 0;font-size:15px;border-bottom:1px solid #ddd;padding-bottom:2px}
.kgt-report table{border-collapse:collapse;margin:4px 0;font-size:12px}
.kgt-report th,.kgt-report td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
.kgt-report th{background:#f4f4f4}
.kgt-report figure{margin:6px 0}
.kgt-report img{max-width:100%}
.kgt-src{color:#777;margin:0}
.kgt-badge{display:inline-block;border-radius:10px;padding:2px 9px;margin:2px;font-size:12px;background:#eee}
.kgt-ok{background:#d9f2d9}.kgt-warn{background:#fff0c2}.kgt-bad{background:#f8d0d0}.kgt-info{background:#dde8f8}
</style>"""


def report(*sources: Any, log_dir: Any | None = None, title: str | None = None) -> TrainingReport:
    """Combines what the callbacks measured into one report.

    Pass the callbacks of a `fit()` (any of the package's callbacks, in any
    order, or the list you gave to `fit()`), the `History` or the model
    (whose mixed-precision setup is then checked), or a TensorBoard log
    directory to build the report after the fact from what the callbacks
    wrote there. With both, the callbacks' own records are used and the log
    directory fills in what they lack (Keras's training curves, for
    example).

    Args:
        *sources: callbacks, a `History`, a model, lists of these, or one
            log directory (a path).
        log_dir: a TensorBoard log directory to read. Defaults to `None`.
        title: the report's title. Defaults to `None` ("Training report").

    Returns:
        A `TrainingReport`: `str(r)` is the text, `r` displays as HTML with
        plots in a notebook, `r.save("report.html")` writes one HTML file
        with the plots embedded, `r.figures()` gives the matplotlib figures.
        Event files of `log_dir` that could not be read are listed in
        `r.data.unreadable` and named in the report.

    Raises:
        ValueError: nothing to report on, or `log_dir` does not exist, holds
            no event file, or none of its event files could be read.
        TypeError: a path among the sources next to other sources.

    Example:

    ```python
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, report

    callbacks = [GPUUtilizationLogger(log_dir="logs"), InputBoundDetector(log_dir="logs")]
    model.fit(dataset, epochs=3, callbacks=callbacks)
    r = report(callbacks, model)     # shows as HTML in a notebook
    print(r)                         # plain text in a terminal
    r.save("logs/report.html")
    report("logs").save("again.html")  # later, from the logs alone
    ```
    """
    objs = list(sources)
    if log_dir is None and len(objs) == 1 and isinstance(objs[0], (str, os.PathLike)):
        log_dir, objs = objs[0], []
    bad = [o for o in _flatten(objs) if isinstance(o, (str, bytes, os.PathLike))]
    if bad:
        raise TypeError(
            f"Invalid value for argument `sources`. Received: {bad[0]!r} next to other sources. "
            "Expected callbacks, a History or a model; pass a log directory as `log_dir=`."
        )
    if not objs and log_dir is None:
        raise ValueError(
            "Invalid arguments: nothing to report on. Expected callbacks (or the list given to fit()), "
            "a History or a model, or `log_dir=` a TensorBoard log directory."
        )
    if objs:
        data = gather(objs, title)
        if log_dir is not None:
            _fill_from(data, gather_log_dir(os.fspath(log_dir)))
    else:
        data = gather_log_dir(os.fspath(log_dir), title)
    if title:
        data.title = title
    return TrainingReport(data)


def _fill_from(data: ReportData, other: ReportData) -> None:
    """Fills the parts `data` lacks from `other` (read from a log directory)."""
    if not data.series:
        data.series, data.t0, data.gpus = other.series, other.t0, other.gpus or data.gpus
    if not data.split_x:
        data.split_axis, data.split_x, data.split = other.split_axis, other.split_x, other.split
        data.throughput = data.throughput or other.throughput
    if data.verdict is None:
        data.verdict = other.verdict
    if not data.oom_seen and other.oom_seen:
        data.oom_seen, data.oom_events, data.oom_series = True, other.oom_events, other.oom_series
    if not data.profiles:
        data.profiles = other.profiles
    if data.findings is None:
        data.findings = other.findings
    if not data.job:
        data.job = other.job
    if not data.processes:
        data.processes, data.process_count = other.processes, other.process_count
    if data.job_verdict is None:
        data.job_verdict = other.job_verdict
    if not data.job_profiles:
        data.job_profiles = other.job_profiles
    data.unreadable = other.unreadable
    if not data.training:
        data.training = other.training
    data.sources.append("log dir")
