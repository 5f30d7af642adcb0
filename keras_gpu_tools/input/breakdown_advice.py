"""The fit's step breakdown in words: which part limits the step, and the change that fits it.

:func:`fit_breakdown` sums the epochs of a :class:`~keras_gpu_tools.input.breakdown.StepBreakdown`
(each part's time over the fit: per-step figure times the epoch's steps;
compilation in seconds) and names the largest; :class:`FitBreakdown` carries
the figures, the advice, its report section and its JSON record.

An epoch whose device compute was not measured (no sampled call ran a batch
shape seen before, as in a retrace storm) has its step, less its known parts,
in ``unmeasured``: never in ``other``, and never named the largest, so no host
advice (``steps_per_execution``) is read from it. Retraces are named the
largest when their compile time is the largest part of the fit, or at least
the steady steps' whole time (``RETRACE_SHARE``): they then cost the fit more
than training does, whatever the split of the step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.input.breakdown import StepBreakdown
from keras_gpu_tools.input.categories import XPROF_MODERATE
from keras_gpu_tools.runtime.units import format_ms, format_percent

LABELS = {
    "compile": "compile/trace",
    "retraces": "retraces",
    "input": "input wait",
    "dispatch": "host dispatch",
    "compute": "device compute",
    "collective": "collectives",
    "other": "other (callbacks, Python)",
    "unmeasured": "not split (compute not measured)",
}
#: The host's parts of the step, as the advice names them.
HOST_PART = {"dispatch": "Launching the step from the host", "other": "The host's other work (callbacks, Python)"}
HOST_SHARE = 0.1  # steps_per_execution: enough steps per call that the host's part falls under this share of compute
MAX_STEPS_PER_EXECUTION = 1024
RETRACE_SHARE = 1.0  # retraces' compile seconds from this multiple of the steady steps' time on: they are the cause
INPUT_SHARE = XPROF_MODERATE  # a wait from this share of the step on is input-bound: compute-bound is not said


@dataclasses.dataclass
class FitBreakdown:
    """The fit's breakdown: per-step parts (seconds, steady), compilation, the largest part and the advice."""

    parts: dict[str, float]  # the steady step's parts, per step, time-weighted over the epochs
    step: float | None
    steps: int
    compile_seconds: float
    first_call_seconds: float
    retraces: int
    shapes: list[str]
    largest: str | None
    advice: list[str]
    collective_reason: str | None = None
    collective_how: str | None = None  # how the collectives' time was measured, where it was

    def section(self) -> list[str]:
        """The report's "Step breakdown" lines (Markdown table, then the compilation and the advice)."""
        lines = ["Step breakdown (steady step, compilation apart):", "", "| part | per step | share |", "|---|---|---|"]
        for name, v in self.parts.items():
            share = v / self.step if self.step else None
            lines.append(f"| {LABELS[name]} | {format_ms(v)} | {format_percent(share)} |")
        lines.append(f"| step | {format_ms(self.step)} | 100% |")
        traced = f"compile/trace: {self.compile_seconds:.2f} s, first call {self.first_call_seconds:.2f} s"
        lines += ["", f"{traced}; {self.retraces} retrace{'s' if self.retraces != 1 else ''}."]
        if self.collective_reason:
            lines.append(f"Collectives left out: {self.collective_reason}.")
        elif self.collective_how:
            lines.append(f"Collectives: {collective_note(self.collective_how)}")
        if self.largest is not None:
            lines.append(f"Largest part: {LABELS[self.largest]}.")
        lines += [f"- {a}" for a in self.advice]
        return lines

    def record(self) -> dict[str, Any]:
        """The JSON record the report reads (``step/breakdown/data``)."""
        return dataclasses.asdict(self)


def collective_note(how: str) -> str:
    """How the collectives' figure was measured, and what it does not see."""
    return (
        f"{how}. The step's own all-reduce can overlap its backward pass; "
        "where it does, it costs less than this, and device compute holds the difference."
    )


def shape_text(sig: Any) -> str:
    """A batch signature as its shapes, e.g. ``(10, 32) (10, 1)``."""
    try:
        shapes = [tuple(int(d) if d is not None else None for d in s[0]) for s in sig]
        return " ".join(str(s) for s in shapes)
    except Exception:
        return str(sig)[:80]


def steps_per_execution_for(host: float, compute: float) -> int:
    """Steps per call so that the host's per-call time, shared by them, is under ``HOST_SHARE`` of compute."""
    if compute <= 0:
        return MAX_STEPS_PER_EXECUTION
    return int(min(max(math.ceil(host / (HOST_SHARE * compute)), 2), MAX_STEPS_PER_EXECUTION))


def fit_breakdown(
    b: StepBreakdown,
    jit_compile: bool | None = None,
    several_steps_per_call: bool = True,
    steady: Sequence[bool] | None = None,
) -> FitBreakdown | None:
    """The fit's breakdown from its epochs; None before an epoch with a step time ended.

    ``jit_compile``: the model's (False: compiling the step is advised to a host-bound one);
    ``several_steps_per_call``: whether the backend runs ``steps_per_execution > 1`` (torch does not);
    ``steady``: per epoch, whether the input verdict counts it: the parts then cover the verdict's
    scope (warm-up epochs left out as it leaves them out); compilation is the whole fit's.
    """
    kept = b.epochs
    if steady is not None and len(steady) == len(b.epochs) and any(steady):
        kept = [e for e, s in zip(b.epochs, steady) if s]
    epochs = [e for e in kept if e.step is not None and e.steps]  # (a step all compilation is 0: still an epoch)
    if not epochs:
        return None
    steps = sum(e.steps for e in epochs)
    parts: dict[str, float] = {}
    for name in ("input", "dispatch", "compute", "collective", "other"):
        # A part unknown in an epoch counts 0 there; what its step's known parts leave is `unmeasured`.
        if any(getattr(e, name) is not None for e in epochs):
            parts[name] = sum(e.steps * (getattr(e, name) or 0.0) for e in epochs) / steps
    unsplit = sum(e.steps * max(0.0, (e.step or 0.0) - sum(e.parts().values())) for e in epochs if e.other is None)
    if unsplit > 0:
        parts["unmeasured"] = unsplit / steps
    step = sum(e.steps * (e.step or 0.0) for e in epochs) / steps
    shapes = [shape_text(s) for s in b.shapes]
    fb = FitBreakdown(
        parts, step, steps, b.compile_seconds, b.first_call_seconds, b.retraces, shapes, None, [],
        next((e.collective_reason for e in reversed(epochs) if e.collective_reason), None),
        b.collective_how if "collective" in parts else None,
    )  # fmt: skip
    totals = {name: v * steps for name, v in parts.items()}
    totals["compile"] = b.compile_seconds
    largest: str | None = max(totals, key=lambda k: totals[k])
    retraced = b.compile_seconds - b.first_call_seconds
    if b.retraces and (
        (largest == "compile" and retraced > b.first_call_seconds) or retraced >= RETRACE_SHARE * step * steps
    ):
        largest = "retraces"
    fb.largest = None if largest == "unmeasured" else largest  # a part not measured is named no cause
    fb.advice = _advice(fb, b, totals, jit_compile, several_steps_per_call)
    return fb


def _advice(
    fb: FitBreakdown, b: StepBreakdown, totals: dict[str, float], jit_compile: bool | None, several: bool
) -> list[str]:
    p, step, spent = fb.parts, fb.step or 0.0, sum(totals.values())
    share = format_percent(totals[fb.largest] / spent if spent and fb.largest in totals else None)
    share += " of the fit's time, compilation included"
    if fb.largest is None:
        said = (
            f"Device compute was not measured on {format_percent(p.get('unmeasured', 0.0) / step if step else None)} "
            "of the steady step (no sampled call ran a batch shape seen before): that time is not split into "
            "compute and host time, and no part is named the largest."
        )
        return [said] + (_retrace_advice(fb) if fb.retraces else [])
    if fb.largest == "retraces":
        return _retrace_advice(fb)
    if fb.largest == "compile":
        cache = b.compile_line or "this backend has no persistent compilation cache for the step"
        xla = " (it keeps compiled programs: with `jit_compile=True`)" if jit_compile is False else ""
        return [
            f"Compilation took {fb.compile_seconds:.2f} s, {share}; keep it across runs "
            f"with the persistent compilation cache{xla}: `{cache}`."
        ]
    if fb.largest in ("dispatch", "other"):
        host, compute = p.get(fb.largest, 0.0), p.get("compute", 0.0)
        if compute <= 0:  # no steps per call can be derived from a compute that was not measured
            return [f"{HOST_PART[fb.largest]} takes {format_ms(host)} of a {format_ms(step)} step; "
                    "device compute was not measured, so no change is derived from it."]  # fmt: skip
        n = steps_per_execution_for(host, compute)
        said = f"{HOST_PART[fb.largest]} takes {format_ms(host)} of a {format_ms(step)} step (device compute {format_ms(compute)})"
        if several:
            tips = [
                f"{said}: run several steps per call, `model.compile(..., steps_per_execution={n})`, so it is paid once per {n} steps."
            ]
        else:  # torch runs one step per call
            tips = [
                f"{said}: it is paid once per step, so a batch {n} times larger pays it once per {n} times the samples."
            ]
        if jit_compile is False:
            tips.append("Compile the step into one program: `model.compile(..., jit_compile=True)`.")
        return tips
    if fb.largest == "collective":
        mib = (b.allreduce_bytes or 0.0) / 2**20
        return [
            f"The gradient all-reduce ({mib:.1f} MiB per step) takes {format_ms(p['collective'])} of the step; "
            "its cost is fixed by the weights, not the batch: a per-device batch k times larger divides its "
            f"share by about k, which pays while compute ({format_ms(p.get('compute'))}) is not well above it."
        ]
    if fb.largest == "compute":
        wait = p.get("input", 0.0) / step if step else 0.0
        if wait >= INPUT_SHARE:  # input-bound by the verdict's measure too: not called compute-bound
            bound = f"the wait for input is {format_percent(wait)} of the step too (see the input verdict)"
        else:
            bound = "the step is compute-bound"
        said = f"Device compute is the largest part ({share}): {bound}; a ProfilerWindow shows the heaviest layers"
        if b.tensor_cores is False:  # a CPU, or GPUs without tensor cores: mixed precision would not pay
            return [said + "."]
        return [
            said + ", and mixed precision (`keras.mixed_precision.set_global_policy`) halves "
            "the matmuls' time on a GPU with tensor cores."
        ]
    return ["Waiting for input is the largest part: see the input-bound verdict's advice."]


def _retrace_advice(fb: FitBreakdown) -> list[str]:
    """The retraces' cost, the batch shapes seen, and how to give every batch one shape."""
    shown = ", ".join(fb.shapes[:6]) or "not seen on a timed step"
    return [
        f"{fb.retraces} retraces of the train step (new batch shapes) cost "
        f"{fb.compile_seconds - fb.first_call_seconds:.2f} s; shapes: {shown}. Give every batch one shape: "
        "drop the last partial batch (`drop_remainder=True` in `Dataset.batch`), pad to a fixed shape, "
        "or bucket lengths into a few shapes (`Dataset.bucket_by_sequence_length`)."
    ]
