"""The job's view of the input pipeline: every process's figures, job-wide keys, stragglers.

Nothing here knows about Keras or a framework. At each epoch end every
process of a job sends one :func:`process_row` over the job's channel; every
process gets the same list back and computes the same :func:`job_logs` and
:func:`job_verdict` from it, so all of them agree.

A straggler is a process whose figures stand out from the others'. The rule
(:func:`find_stragglers`) compares each process with the median of the
*others*, so one slow process among many cannot drag the reference towards
itself, and needs both a relative and an absolute margin, so the noise of a
busy host (a few points of wait, a fraction of a millisecond per step) does
not name anyone:

- input wait: its wait share is at least ``WAIT_POINTS`` (10 points) above
  the others' median and at least ``WAIT_RATIO`` (2x) of it;
- step time: its step is more than ``STEP_RATIO`` (1.25x) the others' median
  and at least ``STEP_AT_LEAST_MS`` (1 ms) longer.

Under synchronous data parallelism every process runs at the slowest one's
pace (the others wait for it in the gradient all-reduce), so step times are
alike and the straggler shows in its input wait: the others' wait is inside
their step (the collective), not in their input. A process held back by its
GPU shows in neither: where every process sends its GPUs' health (a
``GPUUtilizationLogger`` in its fit), a process whose GPU stands out
(throttled, a lower SM clock, another program on it; the rule of
:mod:`~keras_gpu_tools.input.health_cause`) is named a straggler of kind
"GPU health", and a slow step's straggler gets its GPU's cause named.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.input.health_cause import Cause, has_health, health_causes, slowdown
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.units import format_milliseconds, format_percent

WAIT_POINTS = 0.10
WAIT_RATIO = 2.0
STEP_RATIO = 1.25
STEP_AT_LEAST_MS = 1.0

# What each process sends of a Measurement's logs, under short names.
_FIGURES = {
    "steps": schema.INPUT_STEPS,
    "step_ms": schema.INPUT_STEP_MS,
    "wait_fraction": schema.INPUT_WAIT_FRACTION,
    "wait_ms": schema.INPUT_WAIT_MS,
    "compute_ms": schema.INPUT_COMPUTE_MS,
    "samples_per_sec": schema.SAMPLES_PER_SEC,
}


def figures(logs: dict[str, float]) -> dict[str, float | None]:
    """The figures a process sends, from a Measurement's ``logs()`` (unknown: None)."""
    return {k: logs.get(key) for k, key in _FIGURES.items()}


def process_row(
    index: int,
    host: str,
    epoch: dict[str, float],
    steady: dict[str, float],
    scope: str = "",
    category: str = "unknown",
    advice: Sequence[str] = (),
    peak_flops: float | None = None,
    health: dict[str, list[Any]] | None = None,
) -> dict[str, Any]:
    """One process's message of an epoch end (JSON-ready): this epoch's and its steady state's figures.

    ``health``: its GPUs' health in the epoch (:func:`~keras_gpu_tools.input.health_cause.process_health`),
    None where no GPUUtilizationLogger runs in its fit.
    """
    return {
        "process": int(index),
        "host": host,
        "epoch": figures(epoch),
        "steady": dict(figures(steady), scope=scope, category=category, advice=list(advice)),
        "peak_flops": peak_flops,
        "health": health,
    }


def _argmax(values: Sequence[float | None]) -> int | None:
    known = [(v, i) for i, v in enumerate(values) if v is not None]
    return max(known, key=lambda t: (t[0], -t[1]))[1] if known else None


def job_logs(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The job-wide epoch keys from every process's epoch figures (unknown figures are left out).

    ``job/step_ms_max`` and ``job/step_ms_slowest_process`` (its index),
    ``job/input_wait_fraction_max`` and ``job/input_wait_process``,
    ``job/samples_per_sec`` (the sum; left out unless every process knows its own).
    """
    out: dict[str, float] = {}
    procs = [int(r["process"]) for r in rows]
    steps = [r["epoch"].get("step_ms") for r in rows]
    waits = [r["epoch"].get("wait_fraction") for r in rows]
    i = _argmax(steps)
    if i is not None:
        out[schema.JOB_STEP_MS_MAX] = float(steps[i])
        out[schema.JOB_STEP_MS_SLOWEST_PROCESS] = float(procs[i])
    i = _argmax(waits)
    if i is not None:
        out[schema.JOB_INPUT_WAIT_FRACTION_MAX] = float(waits[i])
        out[schema.JOB_INPUT_WAIT_PROCESS] = float(procs[i])
    rates = [r["epoch"].get("samples_per_sec") for r in rows]
    if rates and all(r is not None for r in rates):
        out[schema.JOB_SAMPLES_PER_SEC] = float(sum(rates))
    return out


@dataclasses.dataclass
class Straggler:
    """A process that stands out: by ``kind`` ("input wait", "step time" or "GPU health"), ``value`` against the
    others' median; ``causes``: what its GPU's health says (the first cause's figures are those of "GPU health")."""

    process: int
    kind: str
    value: float
    others_median: float
    causes: list[Cause] = dataclasses.field(default_factory=list)


def find_stragglers(rows: Sequence[dict[str, Any]], part: str = "steady") -> list[Straggler]:
    """The processes whose input wait or step time stands out (see the module docstring for the rule)."""
    out: list[Straggler] = []
    if len(rows) < 2:
        return out
    for r in rows:
        others = [o[part] for o in rows if o is not r]
        own = r[part]
        w = own.get("wait_fraction")
        ow = [o.get("wait_fraction") for o in others if o.get("wait_fraction") is not None]
        if w is not None and ow:
            med = statistics.median(ow)
            if w - med >= WAIT_POINTS - 1e-9 and w >= WAIT_RATIO * med:  # (0.15 - 0.05 < 0.10 in floats)
                out.append(Straggler(int(r["process"]), "input wait", float(w), float(med)))
                continue
        s = own.get("step_ms")
        os_ = [o.get("step_ms") for o in others if o.get("step_ms")]
        if s and os_:
            med = statistics.median(os_)
            if s > STEP_RATIO * med and s - med >= STEP_AT_LEAST_MS - 1e-9:
                out.append(Straggler(int(r["process"]), "step time", float(s), float(med)))
    return out


@dataclasses.dataclass
class JobVerdict:
    """The job's verdict: every process's steady-state figures, the stragglers, what to change."""

    processes: list[dict[str, Any]]  # by process index: figures, scope, category
    stragglers: list[Straggler]
    message: str
    advice: list[str] = dataclasses.field(default_factory=list)

    @property
    def straggler_processes(self) -> list[int]:
        return [s.process for s in self.stragglers]

    def text(self) -> str:
        """The per-process table, the verdict and the advice (plain text, valid Markdown)."""
        lines = [
            "| process | host | scope | steps | wait for input | step | samples/s | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in self.processes:
            mark = " (straggler)" if p["process"] in self.straggler_processes else ""
            lines.append(
                f"| {p['process']}{mark} | {p.get('host') or '?'} | {p.get('scope') or '?'} | "
                f"{_num(p.get('steps'), '.0f')} | {format_percent(p.get('wait_fraction'))} | {format_milliseconds(p.get('step_ms'))} | "
                f"{_num(p.get('samples_per_sec'), '.0f')} | {p.get('category') or '?'} |"
            )
        lines += ["", self.message]
        if self.advice:
            lines += ["", "What to change:"] + [f"- {a}" for a in self.advice]
        return "\n".join(lines)


def _num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _range(values: Sequence[float | None], fmt) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    lo, hi = fmt(min(known)), fmt(max(known))
    return lo if lo == hi else f"{lo} to {hi}"


def job_verdict(rows: Sequence[dict[str, Any]]) -> JobVerdict:
    """The job's verdict over every process's steady state; the same on every process for the same rows."""
    rows = sorted(rows, key=lambda r: int(r["process"]))
    procs = [dict(r["steady"], process=int(r["process"]), host=r.get("host")) for r in rows]
    for p in procs:
        p.pop("advice", None)
    found = find_stragglers(rows)
    named = {s.process for s in found}
    for s in found:  # a straggler for its step or its input may have a throttled GPU too: say so beside it
        s.causes = health_causes(rows, s.process)
    for r in rows:  # held back by its GPU, which neither its step nor its wait shows
        causes = [] if int(r["process"]) in named else health_causes(rows, int(r["process"]))
        if causes:
            found.append(Straggler(int(r["process"]), "GPU health", causes[0].value, causes[0].others_median, causes))
    by_index = {int(r["process"]): r for r in rows}
    n = len(rows)
    if not found:
        waits = [p.get("wait_fraction") for p in procs]
        message = (
            f"No process stands out: over the {n} processes the input wait is {_range(waits, format_percent)} of the step "
            f"and the step {_range([p.get('step_ms') for p in procs], format_milliseconds)}."
        )
        if all(p.get("category") in ("highly input-bound", "moderately input-bound") for p in procs):
            message += " Every process waits for its input alike: the job is input-bound as a whole; see each process's advice."
        return JobVerdict(procs, [], message)
    sentences, advice = [], []
    for s in found:
        own = by_index[s.process]["steady"]
        others = [p for p in procs if p["process"] != s.process]
        others_step = _range([p.get("step_ms") for p in others], format_milliseconds)
        if s.kind == "input wait":
            sentences.append(
                f"Process {s.process} holds the job back: it waits for input {format_percent(s.value)} of its step time "
                f"({format_milliseconds(own.get('wait_ms'))} of a {format_milliseconds(own.get('step_ms'))} step) where the other processes wait "
                f"{format_percent(s.others_median)} (median). Under synchronous data parallelism the others wait for it in the "
                f"gradient all-reduce, so their step time ({others_step}) is inflated too: their wait sits in the "
                f"collective, not in their input, and the whole job runs at process {s.process}'s input rate."
            )
            if s.causes:
                sentences.append(
                    f"Its GPU needs a look too, though its input is what holds the job back now: "
                    f"{'; '.join(c.text for c in s.causes)}."
                )
            tips = list(own.get("advice") or [])
            advice += [c.advice for c in s.causes] + [f"Process {s.process}: {t}" for t in tips]
            advice.append(
                f"Process {s.process}: check what differs from the others: its host "
                f"({by_index[s.process].get('host') or '?'}: other jobs on its CPUs, a slower disk or network), and its "
                "shard of the data (larger or slower-to-decode files). Changing the other processes' pipelines "
                "will not help."
            )
        elif s.kind == "GPU health":
            why = "; ".join(c.text for c in s.causes)
            sentences.append(f"Process {s.process}'s GPU holds the job back: {why}; {slowdown(rows, s.process)}.")
            advice += [c.advice for c in s.causes]
        else:
            sentences.append(
                f"Process {s.process} is slower: its steps take {format_milliseconds(s.value)} where the other processes take "
                f"{format_milliseconds(s.others_median)} (median), and its input wait ({format_percent(own.get('wait_fraction'))}) is not what "
                "stands out. If the processes train in step (synchronous data parallelism), the others wait for it "
                "and their step time is inflated too."
            )
            sentences.append(_step_cause(s, by_index[s.process]))
            advice += [c.advice for c in s.causes] or [
                f"Process {s.process}: look at its device and host (another job on its GPU or CPUs, a slower or "
                "throttled GPU, a smaller share of the interconnect)"
                + (
                    "."
                    if has_health(by_index[s.process])
                    else "; a GPUUtilizationLogger in every process's fit lets this verdict name a throttled or "
                    "slower GPU."
                )
            ]
    return JobVerdict(procs, found, " ".join(s for s in sentences if s), advice)


def _step_cause(s: Straggler, row: dict[str, Any]) -> str:
    """What a slow step's process's GPU health says ("" where it sent none)."""
    if s.causes:
        slower = f"its steps were {100 * (s.value / s.others_median - 1):.0f}% slower"
        return f"Its GPU says why: {'; '.join(c.text for c in s.causes)}; {slower}."
    if has_health(row):
        return (
            "Its GPU's health does not explain it: no throttling, lower SM clock or other program on its GPU stands "
            "out against the other processes' in the last epoch."
        )
    return ""


def job_peak(rows: Sequence[dict[str, Any]], devices_in_step: int) -> float | None:
    """The summed peak FLOP/s of the step's devices, from each process's per-device peak.

    Each process drives ``devices_in_step / processes`` of the step's devices.
    None if a process does not know its peak (MFU is then left out everywhere).
    """
    peaks: list[Any] = [r.get("peak_flops") for r in rows]  # what each process sent
    if not peaks or any(p is None for p in peaks):
        return None
    share = max(int(devices_in_step), 1) / len(peaks)
    return float(sum(float(p) * share for p in peaks))
