"""The report's model of a run: `ReportData`, filled by the sections' gatherers and read by their views.

Each section (`keras_gpu_tools.reporting.sections`) fills its fields of a `ReportData` from the
callbacks or a log directory, and its views (text, HTML, figures) read nothing else. The rows it
holds (GPUs, verdicts, profiler windows, findings) are plain dicts built by the section they belong to.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.series import Series

# The step-time split: its keys (ms per step) and their labels, in stacking order.
SPLIT_KEYS = (
    (schema.INPUT_WAIT_MS, "input wait"),
    (schema.INPUT_COMPUTE_MS, "compute"),
    (schema.INPUT_OTHER_MS, "other"),
)
SPLIT_AND_STEP_KEYS = SPLIT_KEYS + ((schema.INPUT_STEP_MS, ""),)  # the split and the whole step
JOB_STATS = ("min", "mean", "max")
# The OOM summary's figures (ReportData.oom_summary keys).
OOM_MICRO_BATCHES_NOW = "micro-batches per batch now"
OOM_FAILED_SECONDS = "seconds spent in failed attempts"


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
    breakdown: dict[str, Any] | None = None  # the step breakdown; see sections.breakdown
    oom_events: list[str] = dataclasses.field(default_factory=list)
    oom_details: list[list[str]] = dataclasses.field(default_factory=list)  # why, per event (may be shorter)
    oom_headroom: list[str] = dataclasses.field(default_factory=list)  # peak against capacity, per device
    oom_series: dict[str, Series] = dataclasses.field(default_factory=dict)
    oom_summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    oom_seen: bool = False  # an OOM callback (or its logs) was there
    profiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # see sections.profiler
    layer_table: dict[str, Any] | None = None  # the last profiled window's time per layer; see sections.layer_table
    findings: list[dict[str, str | None]] | None = None  # None: the check did not run
    plan: dict[str, Any] | None = None  # plan_batch_size's plan (None: none given or written); see sections.plan
    speedups: Any = None  # find_speedups' SpeedupReport (None: none given or written)
    training: dict[str, Series] = dataclasses.field(default_factory=dict)  # loss, val_loss, ...
    notes: list[str] = dataclasses.field(default_factory=list)
    unreadable: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # event file, what went wrong
    # A job of several processes: the indices whose runs were read (empty: one process), how many
    # the job has, and the job-wide figures (`job/...`) by tag, on the step (or epoch) axis.
    processes: list[int] = dataclasses.field(default_factory=list)
    process_count: int = 1
    job: dict[str, Series] = dataclasses.field(default_factory=dict)
    # The job's input verdict (InputBoundDetector.job_verdict, or the "job" part of its JSON): each
    # process's steady-state figures, the stragglers, the message and its advice; see sections.job.
    job_verdict: dict[str, Any] | None = None
    # MemoryLeakDetector: its verdict (see sections.memory) and its figures per epoch (`memory/...`).
    memory_verdict: dict[str, Any] | None = None
    memory_series: dict[str, Series] = dataclasses.field(default_factory=dict)
    # The job's profiler windows (process 0's job records of ProfilerWindow): see sections.profiler.
    job_profiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # Each GPU's figures per epoch (`gpu/<label>/<field>`, `<field>_max` for some; `throughput/joules_per_sample`),
    # one value per epoch (None: not reported that epoch): what the GPU health section reads (see `sections.gpu_health`).
    gpu_epochs: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    # The GPU fields a GPU or driver could not report: {gpu label: {field: reason}}.
    gpu_unsupported: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # What a section keeps that has no field above, by the section's name (`Section.name`).
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def job_rows(self) -> tuple[list[tuple[str, float | None, float | None, float | None]], list[tuple[str, float]]]:
        """The job-wide figures at their last point: (figure, min, mean, max) rows, and the other figures."""
        grouped: dict[str, dict[str, float]] = {}
        single: list[tuple[str, float]] = []
        for tag, s in sorted(self.job.items()):
            if not s.values:
                continue
            name = tag[len(schema.JOB_PREFIX) :] if tag.startswith(schema.JOB_PREFIX) else tag
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
        rows = [(name, g.get("min"), g.get("mean"), g.get("max")) for name, g in grouped.items()]  # JOB_STATS
        return rows, sorted(single)

    def oom_count(self) -> int | None:
        """Recoveries: from the callback's records, else from the logged counts."""
        if self.oom_events:
            return len(self.oom_events)
        total = self.oom_series.get(schema.OOM_EVENTS_TOTAL)
        if total is not None and total.values:
            return int(max(total.values))
        per_epoch = self.oom_series.get(schema.OOM_EVENTS)
        if per_epoch is not None and per_epoch.values:
            return int(sum(per_epoch.values))
        return 0 if self.oom_seen else None

    def gpu_indices(self) -> list[str]:
        """The GPUs' labels, in order: those of the series and those of the GPU table (linear in both)."""
        seen = {m.group(1) for key in self.series if (m := schema.GPU_KEY_RE.match(key))}
        seen.update(str(g.get("index")) for g in self.gpus)
        return sorted(seen, key=lambda s: (len(s), s))

    def is_job(self) -> bool:
        """Whether the report has a job section: several processes, or job-wide figures of any kind."""
        return self.process_count > 1 or bool(self.job) or bool(self.job_verdict) or bool(self.job_profiles)


def extend(target: dict[str, Series], tag: str, points: Series, step_offset: int = 0) -> Series:
    """Adds the series `points` (read from one run) to the series `tag` of `target`, its steps moved by `step_offset`."""
    s = target.setdefault(tag, Series(tag))
    s.merge(points, step_offset)
    return s
