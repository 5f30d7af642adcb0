"""Gathering the report from live callback objects (and Keras's `History` or the model).

Callbacks are recognised by their class (a subclass counts), imported only when `gather()` is
given sources and Keras is loaded, so this module imports neither Keras nor a framework. What
the report reads of each callback is the small interface below (one `Protocol` each): the
records it holds, converted to the same rows as the JSON it writes to the log directory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.memory.explain import headroom_lines
from keras_gpu_tools.memory.search import BatchPlan
from keras_gpu_tools.reporting import rows
from keras_gpu_tools.reporting.model import (
    OOM_FAILED_SECONDS,
    OOM_MICRO_BATCHES_NOW,
    SPLIT_AND_STEP_KEYS,
    ReportData,
    Series,
)
from keras_gpu_tools.speedups.report import SpeedupReport


class GPULoggerRecords(Protocol):
    """What the report reads of a `GPUUtilizationLogger` (and its optional ``topology``, and ``unsupported_fields``:
    the fields its GPUs cannot report, ``{gpu label: {field: reason}}``)."""

    epoch_history: Sequence[dict[str, Any]]  # per epoch: the logged figures, job-wide ones included
    timeline: Sequence[tuple[float, int, dict[str, float]]]  # (wall time, step, mean of each key)

    def device_records(self) -> list[dict[str, Any]]: ...


class DetectorRecords(Protocol):
    """What the report reads of an `InputBoundDetector` (and its optional ``fit_measurement``,
    ``job_verdict``, ``topology``)."""

    epoch_history: Sequence[dict[str, Any]]
    measurement: Any  # a Measurement (its `logs()`), or None
    verdict: Any  # a Verdict, or None

    def summary(self) -> str: ...


class ProfilerRecords(Protocol):
    """What the report reads of a `ProfilerWindow` (and its optional ``topology``)."""

    captures: Sequence[Any]  # WindowCapture records

    def wait_for_analysis(self, timeout: float) -> Any: ...

    def layer_table(self, window: int = -1) -> Any: ...  # the last window's LayerTable (or None)


class OOMRecords(Protocol):
    """What the report reads of an `OOMBatchSizeReducer`."""

    events: Sequence[Any]  # OOMEvent records (their `line()` and `why()`)
    micro_batches: int
    recovery_seconds: float

    def headroom(self) -> Any: ...


class LeakRecords(Protocol):
    """What the report reads of a `MemoryLeakDetector`."""

    epoch_history: Sequence[dict[str, Any]]  # per epoch: the memory/ figures
    verdict: Any  # a LeakVerdict, or None

    def fit_history(self) -> list[dict[str, Any]]: ...


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
    from keras_gpu_tools.callbacks.memory_leak_detector import MemoryLeakDetector
    from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

    return [
        ("model", keras.Model),
        ("gpu", GPUUtilizationLogger),
        ("input", InputBoundDetector),
        ("memory", MemoryLeakDetector),
        ("profile", ProfilerWindow),
        ("oom", OOMBatchSizeReducer),
        ("mixed_precision", MixedPrecisionCheck),
        ("history", keras.callbacks.History),
    ]


def flatten(sources: Iterable[Any]) -> list[Any]:
    """`sources` with nested lists and tuples spread out and `None`s left out."""
    out = []
    for s in sources:
        if isinstance(s, (list, tuple)):
            out.extend(flatten(s))
        elif s is not None:
            out.append(s)
    return out


def _set_processes(data: ReportData, source: Any, only_if_unset: bool = True) -> None:
    """The process of a job that `source` ran in (its ``topology``), where the job has several."""
    topology = getattr(source, "topology", None)
    if topology is not None and topology.process_count > 1 and not (only_if_unset and data.processes):
        data.processes, data.process_count = [topology.process_index], topology.process_count


def _add_job_figures(data: ReportData, history: Iterable[dict[str, Any]]) -> None:
    """The job-wide keys (`job/...`) of per-epoch logs, one point per epoch."""
    for epoch, values in enumerate(history):
        for key, value in values.items():
            v = rows.finite(value)
            if key.startswith(schema.JOB_PREFIX) and v is not None:
                data.job.setdefault(key, Series(key)).add(0.0, epoch + 1, v)


def _add_epoch_figures(data: ReportData, history: list[dict[str, Any]]) -> None:
    """The GPUs' epoch figures (`gpu/...`) and the energy per sample, one value per epoch (the GPU health section's)."""
    keys = {k for h in history for k in h if k.startswith(schema.GPU_PREFIX) or k == schema.JOULES_PER_SAMPLE}
    if schema.JOULES_PER_SAMPLE in data.gpu_epochs:  # another callback's already
        keys.discard(schema.JOULES_PER_SAMPLE)
    for key in keys:
        data.gpu_epochs[key] = [rows.finite(h.get(key)) for h in history]


def _from_gpu_logger(data: ReportData, lg: GPULoggerRecords) -> None:
    data.sources.append(type(lg).__name__)
    data.gpus += [rows.gpu_row(r) for r in lg.device_records()]
    _set_processes(data, lg, only_if_unset=False)
    history = list(lg.epoch_history)
    _add_job_figures(data, history)
    _add_epoch_figures(data, history)
    unsupported = getattr(lg, "unsupported_fields", None)
    for label, fields in (unsupported if isinstance(unsupported, dict) else {}).items():
        data.gpu_unsupported.setdefault(str(label), {}).update({str(f): str(r) for f, r in fields.items()})
    for wall, step, means in list(lg.timeline):
        if data.t0 is None or wall < data.t0:
            data.t0 = wall
        for key, value in means.items():
            v = rows.finite(value)
            if v is not None:
                data.series.setdefault(key, Series(key)).add(wall, step, v)


def _from_detector(data: ReportData, det: DetectorRecords) -> None:
    data.sources.append(type(det).__name__)
    history = list(det.epoch_history)
    if history:
        data.split_axis = "epoch"
        data.split_x = [float(i + 1) for i in range(len(history))]
        data.split = {k: [rows.finite(h.get(k)) for h in history] for k, _ in SPLIT_AND_STEP_KEYS}
    if det.measurement is not None:
        data.throughput = dict(det.measurement.logs())
    if det.verdict is not None:
        fit = getattr(det, "fit_measurement", None)
        data.verdict = rows.verdict_dict(to_plain(det.verdict), det.summary(), fit.logs() if fit is not None else None)
    fb = getattr(det, "breakdown", None)
    if fb is not None:
        data.breakdown = rows.breakdown_dict(fb.record())
    job_verdict = getattr(det, "job_verdict", None)
    if job_verdict is not None:  # a job of several processes: every process has the same
        data.job_verdict = rows.job_verdict_dict(to_plain(job_verdict), job_verdict.text())
        _set_processes(data, det)
    _add_job_figures(data, history)  # as the logger's
    if any(schema.JOULES_PER_SAMPLE in h for h in history) and schema.JOULES_PER_SAMPLE not in data.gpu_epochs:
        data.gpu_epochs[schema.JOULES_PER_SAMPLE] = [rows.finite(h.get(schema.JOULES_PER_SAMPLE)) for h in history]


def _from_leak_detector(data: ReportData, det: LeakRecords) -> None:
    data.sources.append(type(det).__name__)
    for epoch, values in enumerate(list(det.epoch_history)):
        for key, value in values.items():
            v = rows.finite(value)
            if key.startswith(schema.MEMORY_PREFIX) and v is not None:
                data.memory_series.setdefault(key, Series(key)).add(0.0, epoch + 1, v)
    if det.verdict is not None:
        data.memory_verdict = rows.memory_verdict_dict(to_plain(det.verdict), det.fit_history())


def _from_profiler(data: ReportData, prof: ProfilerRecords) -> None:
    data.sources.append(type(prof).__name__)
    prof.wait_for_analysis(timeout=60.0)  # xprof's conclusions, converted in the background
    records = [to_plain(c) for c in list(prof.captures)]
    data.profiles = [rows.profile_row(r) for r in records]
    table = prof.layer_table() if hasattr(prof, "layer_table") else None
    data.layer_table = rows.layer_table_dict(to_plain(table)) if table is not None else None
    # Process 0 of a job: the job's windows (the other processes hold no job_* figures).
    data.job_profiles = [row for r in records if (row := rows.job_profile_row(r)) is not None]
    if data.job_profiles:
        _set_processes(data, prof)


def _from_oom(data: ReportData, cb: OOMRecords) -> None:
    data.sources.append(type(cb).__name__)
    data.oom_seen = True
    events = list(cb.events)
    data.oom_events = [e.line() for e in events]
    data.oom_details = [e.why() for e in events]
    data.oom_headroom = headroom_lines(cb.headroom())
    data.oom_summary[OOM_MICRO_BATCHES_NOW] = cb.micro_batches
    if cb.recovery_seconds:
        data.oom_summary[OOM_FAILED_SECONDS] = round(float(cb.recovery_seconds), 2)


def _epoch_series(key: str, values: list[Any]) -> Series:
    """A History list as a series on the epoch axis (1, 2, ...), its non-numbers left out."""
    s = Series(key)
    for i, v in enumerate(values):
        if rows.finite(v) is not None:
            s.add(0.0, i + 1, float(v))
    return s


_NOT_TRAINING = tuple(p for p in schema.OWN_PREFIXES if p != schema.OOM_PREFIX)  # the package's keys but oom/


def _from_history(data: ReportData, hist: dict[str, list[Any]]) -> None:
    for key, values in hist.items():
        if key.startswith(_NOT_TRAINING):
            continue
        if key.startswith(schema.OOM_PREFIX):
            if key not in data.oom_series:
                s = _epoch_series(key, values)
                if s.values:
                    data.oom_series[key] = s
                    data.oom_seen = True
            continue
        s = _epoch_series(key, values)
        if s.values:
            data.training[key] = s


def _from_model(data: ReportData, model: Any) -> None:
    """The model's History (where no other gave one) and its mixed-precision check (where none ran)."""
    h = getattr(model, "history", None)
    if h is not None and not data.training:
        _from_history(data, h.history)
    if data.findings is None:
        try:
            from keras_gpu_tools.mixed_precision.check import check_mixed_precision

            data.findings = [rows.finding_dict(to_plain(f)) for f in check_mixed_precision(model)]
            data.sources.append("check_mixed_precision(model)")
        except Exception as e:
            data.notes.append(f"The mixed-precision check failed ({type(e).__name__}: {e}).")


def gather(sources: Sequence[Any], title: str | None = None) -> ReportData:
    """Reads the callbacks, History or model given into a `ReportData`.

    Each is recognised by its class (a subclass of a package callback
    counts; a `BatchPlan` from `plan_batch_size` is shown as the plan); anything else (Keras's TensorBoard, a LiveView, ...) has nothing
    to add and is left out.
    """
    data = ReportData(title=title or "Training report")
    classes = _classes()
    models = []
    for s in flatten(sources):
        if isinstance(s, dict) and all(isinstance(v, list) for v in s.values()):
            _from_history(data, s)  # history.history
            continue
        if isinstance(s, BatchPlan):  # plan_batch_size's plan
            data.sources.append("plan_batch_size")
            data.plan = rows.plan_row(s.as_dict())
            continue
        if isinstance(s, SpeedupReport):  # find_speedups' report
            data.sources.append("find_speedups")
            data.speedups = s
            continue
        role = next((r for r, cls in classes if isinstance(s, cls)), None)
        if role == "model":
            models.append(s)
        elif role == "gpu":
            _from_gpu_logger(data, s)
        elif role == "input":
            _from_detector(data, s)
        elif role == "memory":
            _from_leak_detector(data, s)
        elif role == "profile":
            _from_profiler(data, s)
        elif role == "oom":
            _from_oom(data, s)
        elif role == "mixed_precision":
            data.sources.append(type(s).__name__)
            data.findings = [rows.finding_dict(to_plain(f)) for f in s.findings]
        elif role == "history":
            _from_history(data, s.history)
    for model in models:
        _from_model(data, model)
    return data
