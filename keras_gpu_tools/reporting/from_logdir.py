"""Gathering the report from a TensorBoard log directory, after the fact.

Reads what the callbacks wrote (`keras_gpu_tools.logdir.schema` names every run and tag): the
JSON each writes next to its text (text tags ending in ``/data``), never the text itself. Keras's
own ``train``/``validation`` runs give the training curves.

A job of several processes holds, per callback, one run per process (``<run>/process_<p>``) and
process 0's job-wide figures (``<run>/job``). The GPUs of every process are read (their tags name
them apart), everything else from the lowest process alone, so nothing is counted twice.

This module picks the runs of one training and reads them into a `Logs`; each section
(`Section.from_logdir`) then takes its tags from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import find_runs, printable, read_run
from keras_gpu_tools.logdir.writer import check_log_dir
from keras_gpu_tools.reporting import registry
from keras_gpu_tools.reporting.logs import JOB, OTHER, OWN, Logs, Run
from keras_gpu_tools.reporting.model import ReportData

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
    logs = _layout(runs)
    data.processes = sorted(set(logs.process_of.values()))
    first = data.processes[0] if data.processes else None
    job_runs = _job_runs(runs, logs.process_of)
    every = tuple(dict.fromkeys(tag for section in registry.SECTIONS for tag in section.every_record))
    read = 0
    for run, path, files in runs:
        kind = JOB if run in job_runs else OWN if logs.process_of.get(run, first) == first else OTHER
        values = read_run(run, path, files, data.unreadable, _other_process_tag if kind == OTHER else None, every)
        read += values.events
        data.notes += values.notes
        if values.events:
            data.sources.append(run)
        logs.runs.append(Run(run, kind, values))
    if not read:  # not one event (files unreadable, or empty): no report to replace an earlier one with
        n_files = sum(len(files) for _, _, files in runs)
        raise ValueError(
            f"Invalid value for argument `log_dir`. Received: log_dir={log_dir!r}, but none of its "
            f"{n_files} event file(s) could be read: "
            + "; ".join(f"{p} {why}" for p, why in data.unreadable)
            + ". Expected TensorBoard event files written by the callbacks."
        )
    logs.read_texts(data)
    for section in registry.SECTIONS:
        section.from_logdir(data, logs)
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
    process_of = _layout(runs).process_of
    job_runs = _job_runs(runs, process_of)
    # Keras's runs, and the plan (written before training, by process 0 alone in a job), belong to neither.
    keras_runs = {schema.KERAS_TRAIN_RUN, schema.KERAS_VALIDATION_RUN, ".", schema.PLAN_RUN, schema.SPEEDUPS_RUN}
    job = [r for r in runs if r[0] in process_of or r[0] in job_runs]
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


def _layout(runs: Iterable[tuple[str, str, list[str]]]) -> Logs:
    """The runs that are a process's of a job, with its index."""
    names = [run for run, _, _ in runs]
    return Logs(process_of={run: int(m.group(2)) for run in names if (m := schema.PROCESS_RUN_RE.match(run))})


def _job_runs(runs: Iterable[tuple[str, str, list[str]]], process_of: dict[str, int]) -> set[str]:
    """The job runs: `<run>/job`, or `job` itself next to `process_<i>` runs (a top-level "job" alone is a user's run)."""
    top_level_job = any(m.group(1) is None for run in process_of if (m := schema.PROCESS_RUN_RE.match(run)))
    return {run for run, _, _ in runs if (m := schema.JOB_RUN_RE.match(run)) and (m.group(1) or top_level_job)}


def _other_process_tag(tag: str) -> bool:
    """What is read of a process other than the lowest: its GPUs."""
    return tag.startswith((schema.GPU_PREFIX, schema.GPU_EPOCH_PREFIX)) or tag == schema.GPU_DEVICES_DATA
