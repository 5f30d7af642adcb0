"""Gathering the report from a TensorBoard log directory, after the fact.

Reads what the callbacks wrote (`keras_gpu_tools.logdir.schema` names every run and tag): the
JSON each writes next to its text (text tags ending in ``/data``), never the text itself. Keras's
own ``train``/``validation`` runs give the training curves.

A job of several processes holds, per callback, one run per process (``<run>/process_<p>``) and
process 0's job-wide figures (``<run>/job``). The GPUs of every process are read (their tags name
them apart), everything else from the lowest process alone, so nothing is counted twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import RunValues, find_runs, printable, read_run
from keras_gpu_tools.logdir.series import Series
from keras_gpu_tools.logdir.writer import check_log_dir
from keras_gpu_tools.memory.explain import headroom_lines
from keras_gpu_tools.reporting import health, rows
from keras_gpu_tools.reporting.model import (
    OOM_FAILED_SECONDS,
    OOM_MICRO_BATCHES_NOW,
    SPLIT_AND_STEP_KEYS,
    ReportData,
    extend,
)
from keras_gpu_tools.speedups.report import SpeedupReport

T = TypeVar("T")
UNSUPPORTED_DATA = schema.GPU_UNSUPPORTED_TEXT + schema.DATA_SUFFIX  # the logger's {gpu label: {field: reason}}


@dataclasses.dataclass
class _Scan:
    """What the runs hold, collected run by run before it becomes the report."""

    process_of: dict[str, int]  # a process's run: its process index
    job_runs: set[str]
    window_points: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)  # input/, throughput/
    texts: list[tuple[str, str, int, float, str]] = dataclasses.field(default_factory=list)  # run, tag, step, wall
    job_text: str = ""  # the job verdict as process 0 wrote it to the detector's job run
    job_records: dict[str, tuple[float, int, str]] = dataclasses.field(default_factory=dict)  # last JSON of a tag
    joules_per_sample: Series = dataclasses.field(default_factory=lambda: Series(schema.JOULES_PER_SAMPLE))
    gpu_epochs: dict[str, Series] = dataclasses.field(default_factory=dict)  # the logger's `gpu_epoch/...` figures
    # The detector's figures of each epoch (the "figures" of its epoch verdicts' JSON), in the order written.
    epoch_figures: list[dict[str, Any]] = dataclasses.field(default_factory=list)


#: Which runs a report of a log directory covers where it holds both a single process's runs and a job's.
LAYOUTS = ("latest", "single", "job")


def gather_log_dir(log_dir: str, title: str | None = None, layout: str = "latest") -> ReportData:
    """Reads the runs under a TensorBoard log directory into a `ReportData`.

    A log directory reused by a single-process fit (runs ``gpu``, ``input``, ...) and a job of
    several processes (``gpu/process_<p>``, ``gpu/job``, ...) holds two runs of training: the report
    covers one, never a mix. `layout`: ``"latest"`` the one whose event files were written last,
    ``"single"`` the single process's, ``"job"`` the job's. The runs left out are named in a note.
    Keras's own runs (``train``, ``validation``) and the batch size plan (``plan``, written by
    ``plan_batch_size(log_dir=...)``) belong to neither and are always read.

    Two trainings that wrote the directory at the same time (``logdir/claim.py``) are kept apart:
    the report covers the first one's runs, or with ``layout="<host>_pid<pid>"`` the other's
    (``<run>/<host>_pid<pid>``), and a note lists every training.
    """
    if layout not in LAYOUTS and not schema.TRAINING_NAME_RE.match(str(layout)):
        raise ValueError(
            f"Invalid value for argument `layout`. Received: layout={layout!r}. Expected one of {LAYOUTS}, "
            "or the name of a training that wrote the log directory beside another ('<host>_pid<pid>')."
        )
    log_dir, runs = _runs_of(log_dir)
    data = ReportData(title=title or f"Training report: {printable(log_dir)}")
    runs, layout = _one_training(data, log_dir, runs, layout)
    runs = _one_layout(data, log_dir, runs, layout)
    scan = _layout(runs)
    data.processes = sorted(set(scan.process_of.values()))
    first = data.processes[0] if data.processes else None
    read = 0
    for run, path, files in runs:
        other = run not in scan.job_runs and scan.process_of.get(run, first) != first
        # Every epoch's verdict record (its figures: the step-time table by epoch), not only the last.
        every = (schema.OOM_EVENTS_DATA, schema.INPUT_VERDICT_DATA)
        values = read_run(run, path, files, data.unreadable, _other_process_tag if other else None, every)
        read += values.events
        data.notes += values.notes
        if values.events:
            data.sources.append(run)
        if run in scan.job_runs:
            _read_job_run(data, scan, values)
        elif other:
            _read_other_process_run(data, scan, run, values)
        else:
            _read_run(data, scan, run, values)
    if not read:  # not one event (files unreadable, or empty): no report to replace an earlier one with
        n_files = sum(len(files) for _, _, files in runs)
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={log_dir!r}, but none of its "
            f"{n_files} event file(s) could be read: "
            + "; ".join(f"{p} {why}" for p, why in data.unreadable)
            + ". Expected TensorBoard event files written by the callbacks."
        )
    _split_of(data, scan.window_points)
    data.gpu_epochs = health.from_series(scan.gpu_epochs)
    if scan.joules_per_sample.values:  # one point per epoch
        data.gpu_epochs[schema.JOULES_PER_SAMPLE] = list(scan.joules_per_sample.values)
    prose, records = _records_of(data, scan)
    _epoch_split_of(data, scan.epoch_figures)
    _apply_records(data, scan, prose, records)
    return data


def _runs_of(log_dir: str) -> tuple[str, list[tuple[str, str, list[str]]]]:
    """The checked log directory and its runs; ValueError where it is missing or holds no event file."""
    checked = check_log_dir(log_dir)
    if checked is None or not os.path.isdir(checked):
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={checked!r}, which does not exist. "
            "Expected a TensorBoard log directory written by keras_gpu_tools callbacks."
        )
    runs = find_runs(checked)
    if not runs:
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={checked!r}, which holds no "
            "TensorBoard event file. Expected the `log_dir` given to the callbacks."
        )
    return checked, runs


def _one_training(
    data: ReportData, log_dir: str, runs: list[tuple[str, str, list[str]]], layout: str
) -> tuple[list[tuple[str, str, list[str]]], str]:
    """The runs of one training where several wrote the directory at the same time, and the layout left to pick.

    The first training's runs are named as the callbacks name them; each other one's carry its
    name one level down (``input/<host>_pid<pid>``). A note lists them all and how to report each.
    """
    others: dict[str, list[tuple[str, str, list[str]]]] = {}
    for r in runs:
        m = schema.TRAINING_RUN_RE.match(r[0])
        if m is not None:
            others.setdefault(m.group(2), []).append(r)
    if layout not in LAYOUTS and layout not in others:
        raise ValueError(
            f"Invalid value for argument `layout`. Received: layout={layout!r}, but the log directory "
            f"{printable(log_dir)!r} holds no run of that training. Expected one of {LAYOUTS}"
            + (f" or one of the trainings it holds: {sorted(others)}." if others else ".")
        )
    if not others:
        return runs, layout
    mine = {r[0] for named in others.values() for r in named}
    first = [r for r in runs if r[0] not in mine]
    keras_runs = {schema.KERAS_TRAIN_RUN, schema.KERAS_VALIDATION_RUN, ".", schema.PLAN_RUN}
    first_own = [r[0] for r in first if r[0] not in keras_runs]
    names = [("the first one", first_own, None)] + [(n, [r[0] for r in rs], n) for n, rs in sorted(others.items())]
    listed = "; ".join(f"{who} (runs {', '.join(rs) or 'none'})" for who, rs, _ in names)
    reported = "the first one" if layout not in others else layout
    how = ", ".join(
        f"report(log_dir, layout={n!r})" if n else "report(log_dir)" for who, _, n in names if who != reported
    )
    data.notes.append(
        f"This log directory holds {len(names)} trainings that wrote it at the same time: {listed}. "
        f"This report covers {reported}; report the other{'s' if len(names) > 2 else ''} with {how}."
    )
    if layout in others:
        return [r for r in runs if r[0] in keras_runs] + others[layout], "latest"
    return first, layout


def _one_layout(
    data: ReportData, log_dir: str, runs: list[tuple[str, str, list[str]]], layout: str
) -> list[tuple[str, str, list[str]]]:
    """The runs of one layout (see `gather_log_dir`); a note names the runs of the other one."""
    scan = _layout(runs)
    # Keras's runs, and the plan (written before training, by process 0 alone in a job), belong to neither.
    keras_runs = {schema.KERAS_TRAIN_RUN, schema.KERAS_VALIDATION_RUN, ".", schema.PLAN_RUN, schema.SPEEDUPS_RUN}
    job = [r for r in runs if r[0] in scan.process_of or r[0] in scan.job_runs]
    single = [r for r in runs if r not in job and r[0] not in keras_runs]
    if layout == "job" and not job or layout == "single" and not single:
        raise ValueError(
            f"Invalid value for argument `layout`. Received: layout={layout!r}, but the log directory "
            f"{printable(log_dir)!r} holds no run of "
            + ("a job" if layout == "job" else "a single process")
            + f". Expected a layout it holds: {'job' if job else 'single'} (or 'latest')."
        )
    if not job or not single:
        return runs
    if layout == "latest":
        layout = "job" if _last_written(job) >= _last_written(single) else "single"
    kept, left = (job, single) if layout == "job" else (single, job)
    other = "job" if layout == "single" else "single"
    what = "a job of several processes" if other == "job" else "a single process"
    data.notes.append(
        f"This log directory also holds the runs of {what} ({', '.join(r[0] for r in left)}), "
        f"{'written earlier' if _last_written(left) <= _last_written(kept) else 'written later'}: "
        f"this report leaves them out. Report them with report(log_dir, layout={other!r}) "
        f"(keras-gpu-tools report LOG_DIR --layout {other})."
    )
    return [r for r in runs if r not in left]


def _last_written(runs: list[tuple[str, str, list[str]]]) -> float:
    """When the last event file of `runs` was last written (0: none could be looked at)."""
    times = [0.0]
    for _, directory, files in runs:
        for name in files:
            try:
                times.append(os.stat(os.path.join(directory, name)).st_mtime)
            except OSError:
                pass
    return max(times)


def _layout(runs: Iterable[tuple[str, str, list[str]]]) -> _Scan:
    """Which runs are a process's of a job, and which are a job run."""
    names = [run for run, _, _ in runs]
    process_of = {run: int(m.group(2)) for run in names if (m := schema.PROCESS_RUN_RE.match(run))}
    # A job run: `<run>/job`, or `job` itself next to `process_<i>` runs (a top-level "job" alone is a user's run).
    top_level_job = any(m.group(1) is None for run in process_of if (m := schema.PROCESS_RUN_RE.match(run)))
    job_runs = {run for run in names if (m := schema.JOB_RUN_RE.match(run)) and (m.group(1) or top_level_job)}
    return _Scan(process_of=process_of, job_runs=job_runs)


def _other_process_tag(tag: str) -> bool:
    """What is read of a process other than the lowest: its GPUs."""
    return tag.startswith((schema.GPU_PREFIX, schema.GPU_EPOCH_PREFIX)) or tag == schema.GPU_DEVICES_DATA


def _add_series(data: ReportData, tag: str, points: Series) -> None:
    """A GPU or host series, and the first wall time of them all."""
    extend(data.series, tag, points)
    if points.wall:
        first = min(points.wall)
        data.t0 = first if data.t0 is None else min(data.t0, first)


def _read_job_run(data: ReportData, scan: _Scan, values: RunValues) -> None:
    """Process 0's job-wide figures, its job verdict's text and the profiler's job windows."""
    for tag, points in values.scalars.items():
        extend(data.job, tag, points)
    texts = values.texts.get(schema.INPUT_JOB_VERDICT, [])
    if texts:  # the last one: as of the last epoch end
        scan.job_text = max(texts, key=lambda e: (e.wall_time, e.step)).text
    for tag, texts in values.texts.items():  # ProfilerWindow's job windows (process 0's)
        if tag.startswith(schema.PROFILE_PREFIX) and tag.endswith(schema.DATA_SUFFIX):
            for e in texts:
                if tag not in scan.job_records or (e.wall_time, e.step) >= scan.job_records[tag][:2]:
                    scan.job_records[tag] = (e.wall_time, e.step, e.text)


def _read_other_process_run(data: ReportData, scan: _Scan, run: str, values: RunValues) -> None:
    """A run of a process other than the lowest: its GPUs alone (its other figures are its own)."""
    for tag, points in values.scalars.items():
        if tag.startswith(schema.GPU_PREFIX):
            _add_series(data, tag, points)
        elif tag.startswith(schema.GPU_EPOCH_PREFIX):
            extend(scan.gpu_epochs, tag, points)
    for tag in (schema.GPU_DEVICES_DATA, UNSUPPORTED_DATA):
        scan.texts += [(run, tag, e.step, e.wall_time, e.text) for e in values.texts.get(tag, [])]


def _read_run(data: ReportData, scan: _Scan, run: str, values: RunValues) -> None:
    """A run of one process (the lowest of a job), or Keras's own runs."""
    for tag, points in values.scalars.items():
        if tag.startswith((schema.GPU_PREFIX, schema.HOST_PREFIX)):
            _add_series(data, tag, points)
        elif tag.startswith(schema.GPU_EPOCH_PREFIX):  # the logger's, per epoch: the GPU health section's
            extend(scan.gpu_epochs, tag, points)
        elif tag == schema.JOULES_PER_SAMPLE:  # the logger's, per epoch: the GPU health section's
            scan.joules_per_sample.merge(points)
        elif tag.startswith((schema.INPUT_PREFIX, schema.THROUGHPUT_PREFIX)):
            for step, value in zip(points.steps, points.values):
                scan.window_points.setdefault(step, {})[tag] = value
        elif tag.startswith(schema.MEMORY_PREFIX):
            extend(data.memory_series, tag, points)
        elif tag.startswith(schema.OOM_PREFIX):
            data.oom_seen = True
            extend(data.oom_series, tag, points)
        elif tag.startswith(schema.KERAS_EPOCH_PREFIX):
            name = tag[len(schema.KERAS_EPOCH_PREFIX) :]
            if not name.startswith(schema.OWN_PREFIXES):
                # (our own epoch logs, which Keras's TensorBoard copies, are read from our runs)
                extend(data.training, _training_key(run, name), points, step_offset=1)
    for tag, texts in values.texts.items():
        scan.texts += [(run, tag, e.step, e.wall_time, e.text) for e in texts]


def _training_key(run: str, name: str) -> str:
    """The History key of Keras's `epoch_<name>` in a run: `loss`, `val_loss`, ..."""
    if run in (schema.KERAS_TRAIN_RUN, "."):
        return name
    if run == schema.KERAS_VALIDATION_RUN:
        return f"val_{name}"
    return f"{run.split('/')[-1][:3]}_{name}"


def _split_of(data: ReportData, window_points: dict[int, dict[str, float]]) -> None:
    """The step-time split by window (step axis), each window's step count, and the run's last figures.

    A window is one with a split or a step count (a window whose split was not measured is shown
    as such).
    """
    if not window_points:
        return
    steps = sorted(window_points)
    last = dict(window_points[steps[-1]])
    keys = [k for k, _ in SPLIT_AND_STEP_KEYS] + [schema.INPUT_STEPS]
    steps = [s for s in steps if any(window_points[s].get(k) is not None for k in keys)]
    data.split_axis = "step"
    data.split_x = [float(s) for s in steps]
    data.split = {k: [rows.finite(window_points[s].get(k)) for s in steps] for k in keys}
    data.throughput = last


def _epoch_figures(value: Any) -> dict[str, Any] | None:
    """The figures of an epoch's verdict record (``{"scope": "epoch 3", "figures": {...}}``); None for another."""
    if (
        isinstance(value, dict)
        and str(value.get("scope", "")).startswith("epoch ")
        and isinstance(value.get("figures"), dict)
    ):
        return value["figures"]
    return None


def _epoch_split_of(data: ReportData, epochs: list[dict[str, Any]]) -> None:
    """The step-time split by epoch, as the detector's `epoch_history` gives it to a report of the callbacks.

    The detector writes its scalars by window (``window`` steps, and the last one of each epoch), which
    `_split_of` reads by step; each epoch's own figures come in its epoch verdict's JSON. Where they do,
    the table has a row per epoch, the rows of the fit's own report; older logs keep the windows.
    """
    if not epochs:
        return
    data.split_axis = "epoch"
    data.split_x = [float(i + 1) for i in range(len(epochs))]
    data.split = {k: [rows.finite(e.get(k)) for e in epochs] for k, _ in SPLIT_AND_STEP_KEYS}


def _records_of(data: ReportData, scan: _Scan) -> tuple[dict[str, str], dict[str, Any]]:
    """The last text of each tag written for people, and the JSON of each ``.../data`` tag.

    OOM events are kept one per recovery, device records the last of each process (in process
    order); the job's process count is read from them.
    """
    prose: dict[str, str] = {}
    records: dict[str, Any] = {}
    oom_records: list[dict[str, Any]] = []
    devices: dict[int, Any] = {}  # the last device records of each process (-1: not a process run)
    for run, tag, _step, _wall, text in sorted(scan.texts, key=lambda t: (t[3], t[2])):
        if not tag.endswith(schema.DATA_SUFFIX):
            prose[tag] = text
            continue
        try:
            value = json.loads(text)
        except ValueError:
            data.notes.append(f"The tag {tag!r} of run {run!r} holds no valid JSON; it is left out.")
            continue
        if tag == schema.OOM_EVENTS_DATA:
            oom_records.append(value)
        elif tag == schema.GPU_DEVICES_DATA:
            devices[scan.process_of.get(run, -1)] = value
        elif tag == schema.INPUT_VERDICT_DATA and _epoch_figures(value) is not None:
            scan.epoch_figures.append(_epoch_figures(value) or {})
            records[tag] = value
        elif tag == UNSUPPORTED_DATA and isinstance(value, dict):  # every process's GPUs, the last fit's last
            for label, fields in value.items():
                if isinstance(fields, dict):
                    data.gpu_unsupported.setdefault(str(label), {}).update({str(f): str(r) for f, r in fields.items()})
        else:
            records[tag] = value
    if oom_records:
        records[schema.OOM_EVENTS_DATA] = oom_records
    if devices:  # every process's GPUs, in process order
        records[schema.GPU_DEVICES_DATA] = [
            r for p in sorted(devices) for r in (devices[p] if isinstance(devices[p], list) else [devices[p]])
        ]
        counts = [r.get(schema.PROCESS_COUNT) for r in records[schema.GPU_DEVICES_DATA] if isinstance(r, dict)]
        data.process_count = max([c for c in counts if isinstance(c, int)] + [len(data.processes), 1])
    elif data.processes:
        data.process_count = max(len(data.processes), 1)
    return prose, records


def _convert(data: ReportData, records: dict[str, Any], tag: str, convert: Callable[[Any], T]) -> T | None:
    """`convert(records[tag])`; None where the tag is missing or its JSON not shaped as expected (noted)."""
    if tag not in records:
        return None
    try:
        return convert(records[tag])
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        data.notes.append(f"The JSON of tag {tag!r} is not as expected ({type(e).__name__}: {e}); it is left out.")
        return None


def _apply_records(data: ReportData, scan: _Scan, prose: dict[str, str], records: dict[str, Any]) -> None:
    """The report's parts from the JSON records."""
    gpus = _convert(data, records, schema.GPU_DEVICES_DATA, lambda v: [rows.gpu_row(r) for r in v])
    if gpus is not None:
        data.gpus = gpus
    profiles: dict[str, dict[str, Any]] = {}
    for tag in [
        t
        for t in records
        if t.startswith(schema.PROFILE_PREFIX)
        and not t.endswith((schema.INPUT_PIPELINE_DATA_SUFFIX, schema.LAYERS_DATA_SUFFIX))
    ]:
        # profile/steps_<first>_<last>; xprof's analysis comes in a tag of its own
        window = tag[: -len(schema.DATA_SUFFIX)]
        analysis = records.get(window + schema.INPUT_PIPELINE_DATA_SUFFIX)

        def window_row(v: dict[str, Any], a: Any = analysis) -> dict[str, Any]:
            return rows.profile_row(v if a is None else {**v, "analysis": a})

        row = _convert(data, records, tag, window_row)
        if row is not None:
            profiles[window] = row
    layer_tags = [t for t in records if t.startswith(schema.PROFILE_PREFIX) and t.endswith(schema.LAYERS_DATA_SUFFIX)]
    if layer_tags:  # the last window's
        last = max(layer_tags, key=lambda t: int(t.split("_")[1]) if t.split("_")[1].isdigit() else -1)
        data.layer_table = _convert(data, records, last, rows.layer_table_dict)
    findings = _convert(
        data, records, schema.MIXED_PRECISION_FINDINGS_DATA, lambda v: [rows.finding_dict(r) for r in v]
    )
    if findings is not None:
        data.findings = findings
    plan = _convert(data, records, schema.PLAN_SUMMARY_DATA, rows.plan_row)  # the last plan written
    if plan is not None:
        data.plan = plan
    speedups = _convert(data, records, schema.SPEEDUPS_SUMMARY_DATA, SpeedupReport.from_dict)
    if speedups is not None:
        data.speedups = speedups
    oom = _convert(
        data,
        records,
        schema.OOM_EVENTS_DATA,
        lambda v: (rows.oom_lines(v), sum(float(r.get("seconds") or 0.0) for r in v)),
    )
    if oom is not None:
        data.oom_seen, (data.oom_events, data.oom_details) = True, oom[0]
        if oom[1]:
            data.oom_summary[OOM_FAILED_SECONDS] = round(oom[1], 2)
    headroom = _convert(
        data, records, schema.OOM_HEADROOM_DATA, lambda v: headroom_lines(v[-1] if v and isinstance(v[-1], list) else v)
    )
    if headroom is not None:
        data.oom_seen, data.oom_headroom = True, headroom
    text = prose.get(schema.INPUT_VERDICT, "")  # the last one written: the whole fit's, like its JSON
    verdict = _convert(
        data,
        records,
        schema.INPUT_VERDICT_DATA,
        lambda v: (rows.verdict_dict(v["verdict"], text, v.get("fit_figures")), rows.floats(v["figures"])),
    )
    if verdict is not None:
        data.verdict = verdict[0]
        data.throughput.update(verdict[1])
    breakdown = _convert(data, records, schema.STEP_BREAKDOWN_DATA, rows.breakdown_dict)
    if breakdown is not None:
        data.breakdown = breakdown
    memory = _convert(
        data, records, schema.MEMORY_VERDICT_DATA, lambda v: rows.memory_verdict_dict(v["verdict"], v.get("fits"))
    )
    if memory is not None:
        data.memory_verdict = memory
    _apply_job(data, scan, records)
    data.profiles = sorted(profiles.values(), key=lambda p: p["start"])
    micro = data.oom_series.get(schema.OOM_MICRO_BATCHES)
    if micro is not None and micro.values:  # the last split in use, as the callback's `micro_batches`
        data.oom_summary = {OOM_MICRO_BATCHES_NOW: int(micro.values[-1]), **data.oom_summary}


def _apply_job(data: ReportData, scan: _Scan, records: dict[str, Any]) -> None:
    """The job's verdict (the "job" part of process 0's JSON, else the job run's text) and profiler windows."""

    def job_part(v: dict[str, Any]) -> dict[str, Any] | None:
        return rows.job_verdict_dict(v[schema.JOB], scan.job_text) if v.get(schema.JOB) is not None else None

    job_verdict = _convert(data, records, schema.INPUT_VERDICT_DATA, job_part)
    if job_verdict is None and scan.job_text:
        job_verdict = rows.job_verdict_dict({}, scan.job_text)
    data.job_verdict = job_verdict
    if job_verdict is not None and len(job_verdict["processes"]) > data.process_count:
        data.process_count = len(job_verdict["processes"])
    data.job_profiles = _job_profiles_of(data, {tag: text for tag, (_, _, text) in scan.job_records.items()})
    if data.job_profiles and max(p["processes"] for p in data.job_profiles) > data.process_count:
        data.process_count = max(p["processes"] for p in data.job_profiles)


def _job_profiles_of(data: ReportData, texts: dict[str, str]) -> list[dict[str, Any]]:
    """The job's profiler windows from the JSON texts of the profiler's job run, by tag."""
    out = []
    for tag in sorted(t for t in texts if not t.endswith(schema.INPUT_PIPELINE_DATA_SUFFIX)):
        window = tag[: -len(schema.DATA_SUFFIX)]
        try:
            rec = json.loads(texts[tag])
            analysis = (
                json.loads(texts[window + schema.INPUT_PIPELINE_DATA_SUFFIX])
                if window + schema.INPUT_PIPELINE_DATA_SUFFIX in texts
                else None
            )
            row = rows.job_profile_row(rec, analysis)
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            data.notes.append(
                f"The JSON of tag {tag!r} of the job run is not as expected ({type(e).__name__}: {e}); it is left out."
            )
            continue
        if row is not None:
            out.append(row)
    return sorted(out, key=lambda p: p["start"])
