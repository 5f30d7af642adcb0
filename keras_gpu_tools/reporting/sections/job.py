"""A job of several processes: whose runs the report read, the job-wide figures, each process's input
verdict and the stragglers, and the job's profiler windows (gathered by `profiler`).

From `GPUUtilizationLogger` and `InputBoundDetector` (their ``topology``, ``job/...`` epoch figures,
``job_verdict``) or the job runs process 0 writes (``<run>/job``: ``job/...`` scalars, the text
``input/job_verdict``) and the ``job`` part of process 0's ``input/verdict/data``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.reporting.logs import JOB, Logs
from keras_gpu_tools.reporting.markup import bullets, e, prose, table
from keras_gpu_tools.reporting.model import ReportData, Series, extend
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sections.gpus import device_records
from keras_gpu_tools.reporting.sections.profiler import job_profile_html, job_profile_lines
from keras_gpu_tools.reporting.sources import gpu_logger, input_detector, name_of, set_processes
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.runtime.units import format_metric, format_milliseconds, format_number, format_percent

JOB_VERDICT_HEADER = ("process", "host", "scope", "steps", "wait for input", "step", "samples/s", "verdict")


def job_verdict_dict(rec: dict[str, Any], text: str = "") -> dict[str, Any]:
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
                "steps": finite(p.get("steps")),
                "wait_fraction": finite(p.get("wait_fraction")),
                "step_ms": finite(p.get("step_ms")),
                "samples_per_sec": finite(p.get("samples_per_sec")),
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


def job_heading(data: ReportData) -> str:
    return f"Job of {data.process_count} processes" if data.process_count > 1 else "Job"


def job_intro(data: ReportData) -> str | None:
    """Whose runs the report read, in a job (None: one process)."""
    if len(data.processes) > 1:
        return (
            f"Runs of processes {', '.join(map(str, data.processes))}: the GPUs of every process; "
            f"the other sections are process {data.processes[0]}'s."
        )
    if data.processes:
        return f"The figures of process {data.processes[0]}; the job-wide ones below are every process's."
    return None


def job_process_rows(jv: dict[str, Any]) -> list[tuple[str, ...]]:
    """The per-process table of a job verdict: process (marked when a straggler), host, scope, steps, wait, step, samples/s, verdict."""
    slow = {p: kind for p, kind in jv["stragglers"]}
    return [
        (
            f"{p['process']}" + (f" (straggler: {slow[p['process']]})" if p["process"] in slow else ""),
            p["host"],
            p["scope"],
            format_number(p["steps"], decimals=0),
            format_percent(p["wait_fraction"]),
            format_milliseconds(p["step_ms"]),
            format_number(p["samples_per_sec"], decimals=0),
            p["category"],
        )
        for p in jv["processes"]
    ]


def _add_job_figures(data: ReportData, history: Iterable[dict[str, Any]]) -> None:
    """The job-wide keys (`job/...`) of per-epoch logs, one point per epoch."""
    for epoch, values in enumerate(history):
        for key, value in values.items():
            v = finite(value)
            if key.startswith(schema.JOB_PREFIX) and v is not None:
                data.job.setdefault(key, Series(key)).add(0.0, epoch + 1, v)


class Job(BaseSection):
    name = "job"
    badge_rank = -1  # the page's summary says first what kind of run it is

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        lg = gpu_logger(source)
        if lg is not None:
            set_processes(data, lg, only_if_unset=False)
            _add_job_figures(data, list(lg.epoch_history))
            return name_of(lg)
        det = input_detector(source)
        if det is None:
            return None
        job_verdict = getattr(det, "job_verdict", None)
        if job_verdict is not None:  # a job of several processes: every process has the same
            data.job_verdict = job_verdict_dict(to_plain(job_verdict), job_verdict.text())
            set_processes(data, det)
        _add_job_figures(data, list(det.epoch_history))  # as the logger's
        return name_of(det)

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        job_text = ""  # the job verdict as process 0 wrote it to the detector's job run
        for run in logs.runs:
            if run.kind != JOB:
                continue
            for tag, points in run.values.scalars.items():
                extend(data.job, tag, points)
            texts = run.values.texts.get(schema.INPUT_JOB_VERDICT, [])
            if texts:  # the last one: as of the last epoch end
                job_text = max(texts, key=lambda t: (t.wall_time, t.step)).text
        records = device_records(logs)
        if records is not None:  # the job's process count, from every process's GPUs
            counts = [r.get(schema.PROCESS_COUNT) for r in records if isinstance(r, dict)]
            data.process_count = max([c for c in counts if isinstance(c, int)] + [len(data.processes), 1])
        elif data.processes:
            data.process_count = max(len(data.processes), 1)

        def job_part(v: dict[str, Any]) -> dict[str, Any] | None:
            return job_verdict_dict(v[schema.JOB], job_text) if v.get(schema.JOB) is not None else None

        job_verdict = logs.convert(data, schema.INPUT_VERDICT_DATA, job_part)
        if job_verdict is None and job_text:
            job_verdict = job_verdict_dict({}, job_text)
        data.job_verdict = job_verdict
        if job_verdict is not None and len(job_verdict["processes"]) > data.process_count:
            data.process_count = len(job_verdict["processes"])

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.job:
            data.job = other.job
        if not data.processes:
            data.processes, data.process_count = other.processes, other.process_count
        if data.job_verdict is None:
            data.job_verdict = other.job_verdict

    def text(self, data: ReportData) -> TextSection | None:
        if not data.is_job():
            return None
        intro = job_intro(data)
        body = [] if intro is None else [intro]
        rows, single = data.job_rows()
        if rows or single:
            body.append("Job-wide figures at the last epoch:")
        if rows:
            body.append(f"{'figure':42s} {'min':>9s} {'mean':>9s} {'max':>9s}")
            for name, *stats in rows:
                body.append(f"{name:42s} " + " ".join(f"{format_number(v, decimals=1):>9s}" for v in stats))
        body += [f"{name}: {format_metric(name, value)}" for name, value in single]
        if not rows and not single and not data.job_profiles:  # (ProfilerWindow alone writes no job/ figure)
            body.append("No job-wide figures were written (one process, or its channel failed).")
        jv = data.job_verdict
        if jv is not None:
            body += ["", "Input pipeline of each process (its steady state):"]
            if jv["processes"]:
                rows_ = [JOB_VERDICT_HEADER, *job_process_rows(jv)]
                widths = [max(len(r[i]) for r in rows_) for i in range(len(JOB_VERDICT_HEADER))]
                body += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows_]
                body.append(jv["message"])
                if jv["advice"]:
                    body += ["What to change:"] + [f"- {a}" for a in jv["advice"]]
            else:  # only the job run's text (no JSON): as process 0 wrote it
                body += jv["text"].splitlines()
        if data.job_profiles:
            body += ["", "Profiler windows of the job (one session, one trace per process):"]
            for p in data.job_profiles:
                body += job_profile_lines(p)
        return job_heading(data), body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if not data.is_job():
            return []
        parts = [f"<h3>{e(job_heading(data))}</h3>"]
        rows, single = data.job_rows()
        intro = job_intro(data)
        if intro is not None:
            parts.append(f"<p>{prose(intro)}</p>")
        if rows:
            parts.append(
                table(
                    ["job-wide figure at the last epoch", "min", "mean", "max"],
                    [(n, *(format_number(v, decimals=1) for v in stats)) for n, *stats in rows],
                )
            )
        if single:
            parts.append(table(["figure", "value"], [(n, format_metric(n, v)) for n, v in single]))
        jv = data.job_verdict
        if jv is not None:
            parts.append("<p>Input pipeline of each process (its steady state):</p>")
            if jv["processes"]:
                parts.append(table(JOB_VERDICT_HEADER, job_process_rows(jv)))
                cls = "kgt-straggler" if jv["stragglers"] else "kgt-no-straggler"
                parts.append(f'<p class="{cls}">{prose(jv["message"])}</p>')
                if jv["advice"]:
                    parts.append("<p>What to change:</p>" + bullets(jv["advice"]))
            else:
                parts.append(f"<pre>{prose(jv['text'])}</pre>")
        if data.job_profiles:
            parts.append("<p>Profiler windows of the job (one session, one trace per process):</p>")
            for p in data.job_profiles:
                parts += job_profile_html(p)
        return parts

    def badges(self, data: ReportData) -> list[Badge]:
        out: list[Badge] = []
        if data.process_count > 1:
            out.append((f"job of {data.process_count} processes", "info"))
        if data.job_verdict is not None and data.job_verdict["processes"]:
            slow = sorted({p for p, _ in data.job_verdict["stragglers"]})
            if slow:
                out.append((f"straggler: process {', '.join(map(str, slow))}", "bad"))
            else:
                out.append(("no straggler", "ok"))
        return out


SECTION = Job()
