"""What each speed-up is worth, decided from measured figures. No framework import.

A :class:`SpeedupRow` holds one change: its figures (samples/s before and
after, each with its relative uncertainty), its numerical check and its
status. The decisions are plain functions of the figures, so they are tested
on fixed numbers: :func:`paid` (a speed-up beyond noise and
:data:`MIN_GAIN`), :func:`loss_check` (a loss that diverges makes a change
unsafe), :func:`dispatch_seconds` (the per-call host time, the intercept of
step time over batch size in the planner's measured candidates) and
:func:`steps_per_execution` (how many steps a call must run to hide it);
:func:`between` and :func:`read_again` read each row against the baseline
as at the row's own time, on the line between its two timings;
:func:`against_parts` says when a combination is slower than one of its parts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

# A row's status.
BASELINE = "baseline"  # the fit as given
CEILING = "ceiling"  # one batch repeated: the most any input change can give
PAID = "paid"  # faster beyond noise and MIN_GAIN
NO_GAIN = "no gain"  # measured, not faster beyond noise
UNSAFE = "unsafe"  # the loss diverged under it: never a speed-up
NOT_APPLICABLE = "not applicable"  # the change raised, or the backend or the input has no such change
NOT_MEASURED = "not measured"  # it would not finish in max_seconds, or nothing on this machine to measure
STATUSES = (BASELINE, CEILING, PAID, NO_GAIN, UNSAFE, NOT_APPLICABLE, NOT_MEASURED)
COMBINED = "combined"  # the kind of the last row: the changes that paid, together
# The rows' kinds in the order a report lists them (the guides').
ORDER = (BASELINE, CEILING, "input", "batch_size", "steps_per_execution", "jit_compile", "mixed_precision", COMBINED)

MIN_GAIN = 0.03  # a change pays from 3% faster on, and beyond twice the figures' combined uncertainty
LOSS_TOLERANCE = 0.25  # a loss after K steps more than 25% above the float32 baseline's (or its gain) has diverged
LOSS_STEPS = 8  # K: the steps of the numerical check


@dataclasses.dataclass(frozen=True)
class SpeedupRow:
    """One change measured (or why not).

    Attributes:
        change: what changes, e.g. `"steps_per_execution=32"`.
        kind: the family: `"input"`, `"steps_per_execution"`, `"jit_compile"`,
            `"mixed_precision"`, `"batch_size"`, or `"baseline"`, `"ceiling"`, `"combined"`.
        code: the line of code that applies it.
        status: one of :data:`STATUSES`.
        before, after: samples/s without and with the change; None where not measured.
        before_uncertainty, after_uncertainty: their relative uncertainties (one standard error).
        check: the numerical check: the loss after K steps against the float32 baseline's ("" where none).
        cost: what the change costs or changes besides speed.
        reason: why it is not applicable, not measured or unsafe ("" otherwise).
        compile_args: the `model.compile` arguments it sets (what `apply` re-compiles with).
        settings: what it sets, by name: `{"workers": 8, "use_multiprocessing": False}` for a
            `PyDataset`, `{"batch_size": 256}`, `{"dtype_policy": "mixed_bfloat16"}`, the compile arguments;
            for a combination slower than one of its parts alone, `{"instead": that part's change}`.
    """

    change: str
    kind: str
    code: str = ""
    status: str = NOT_MEASURED
    before: float | None = None
    after: float | None = None
    before_uncertainty: float | None = None
    after_uncertainty: float | None = None
    check: str = ""
    cost: str = ""
    reason: str = ""
    compile_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        """``after / before``; None where either is not measured."""
        if not self.before or self.after is None:
            return None
        return self.after / self.before

    @property
    def paid(self) -> bool:
        return self.status == PAID

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "speedup": self.speedup}


def noise(*uncertainties: float | None) -> float:
    """The combined relative uncertainty of a ratio of figures (unknown ones count as 0)."""
    return math.sqrt(sum((u or 0.0) ** 2 for u in uncertainties))


def paid(before: float, before_uncertainty: float | None, after: float, after_uncertainty: float | None) -> bool:
    """Whether ``after`` samples/s beats ``before`` by :data:`MIN_GAIN` and twice their combined uncertainty."""
    if before <= 0:
        return False
    return after / before - 1.0 > max(MIN_GAIN, 2.0 * noise(before_uncertainty, after_uncertainty))


def loss_check(
    baseline: float,
    changed: float,
    steps: int = LOSS_STEPS,
    reference: str = "float32",
    initial: float | None = None,
) -> tuple[bool, str]:
    """Whether the loss after ``steps`` steps under a change is safe against the ``reference`` run's, and the words.

    Unsafe where it is not finite, or above the reference's by more than
    :data:`LOSS_TOLERANCE` of the larger of the reference's loss and what the
    reference's steps gained from the ``initial`` loss (where given): two runs
    whose dropout draws differ (a compiled step draws its own) end their
    steps apart by a share of what they learnt, while a diverging run loses
    what it learnt. A lower loss is never unsafe.
    """
    if not math.isfinite(changed):
        return False, f"loss after {steps} steps is {changed} ({reference}: {baseline:.4g}): it diverged"
    gained = 0.0 if initial is None or not math.isfinite(initial) else initial - baseline
    scale = max(abs(baseline), gained, 1e-6)
    rel = (changed - baseline) / max(abs(baseline), 1e-6)
    text = f"loss after {steps} steps {changed:.4g} vs {baseline:.4g} ({reference}), {100 * rel:+.1f}%"
    if initial is not None and gained > abs(baseline):
        text += f" (from {initial:.4g})"
    if math.isfinite(baseline) and changed - baseline > LOSS_TOLERANCE * scale:
        if scale == gained:
            return (
                False,
                text + f": above it by more than {100 * LOSS_TOLERANCE:g}% of what its steps gained, it diverged",
            )
        return False, text + f": more than {100 * LOSS_TOLERANCE:g}% above, it diverged"
    return True, text


def decide(row: SpeedupRow, after: float, after_uncertainty: float | None, safe: bool = True) -> SpeedupRow:
    """``row`` with its measured ``after`` figure and its status (unsafe wins over any speed-up)."""
    status = NO_GAIN
    if not safe:
        status = UNSAFE
    elif row.before is not None and paid(row.before, row.before_uncertainty, after, after_uncertainty):
        status = PAID
    return dataclasses.replace(row, after=after, after_uncertainty=after_uncertainty, status=status)


Timed = tuple[float | None, float]  # a timing of the baseline: when (None where not known), samples/s


def between(first: Timed, second: Timed, at: float | None) -> float:
    """The baseline's samples/s at time ``at``, from its two timings ``(time, samples/s)``: on the line through them
    (a host whose pace drifts over the search moves each row's "before" with it), held at the nearer one outside
    them, and their mean where a time is not known."""
    (t1, s1), (t2, s2) = first, second
    if at is None or t1 is None or t2 is None or not t2 > t1:
        return (s1 + s2) / 2
    return s1 + min(1.0, max(0.0, (at - t1) / (t2 - t1))) * (s2 - s1)


def read_again(
    rows: Sequence[SpeedupRow],
    base: SpeedupRow,
    timed_again: SpeedupRow,
    timings: tuple[Timed, Timed],
    at: Mapping[str, float],
    uncertainty: float,
    apart: Collection[str] = (),
) -> list[SpeedupRow]:
    """``rows`` once the baseline ``base`` is ``timed_again``: each row measured against it (not one whose change is
    in ``apart``) gets as its "before" the baseline :func:`between` its two ``timings`` as at the row's own time (in
    ``at``, by change), with ``uncertainty``, and is decided again."""
    out = []
    for row in rows:
        if row is base:
            row = timed_again
        elif row.change not in apart:
            before = between(*timings, at.get(row.change))
            row = dataclasses.replace(row, before=before, before_uncertainty=uncertainty)
            if row.kind == CEILING and row.after is not None:
                row = dataclasses.replace(row, cost=ceiling_cost(row.before, row.after))
            elif row.after is not None and row.status in (PAID, NO_GAIN):
                row = decide(row, row.after, row.after_uncertainty)
        out.append(row)
    return out


def dispatch_seconds(points: Sequence[tuple[int, float]]) -> float | None:
    """The per-call host time: the intercept of step seconds over batch size (least squares), or None.

    ``points`` are ``(batch size, step seconds)`` of measured candidates. A
    step costs a fixed host part (dispatch, launch) plus a part that grows
    with the batch; the fixed part is what several steps per call share.
    None under two sizes; 0 where the intercept is not positive.
    """
    pts = [(float(b), float(s)) for b, s in points if b > 0 and s > 0]
    if len({b for b, _ in pts}) < 2:
        return None
    mb = sum(b for b, _ in pts) / len(pts)
    ms = sum(s for _, s in pts) / len(pts)
    slope = sum((b - mb) * (s - ms) for b, s in pts) / sum((b - mb) ** 2 for b, _ in pts)
    return max(0.0, ms - slope * mb)


def steps_per_execution(dispatch: float, step: float) -> int:
    """Steps per call so that the per-call ``dispatch`` falls under a tenth of the rest of a ``step``."""
    from keras_gpu_tools.input.breakdown_advice import steps_per_execution_for

    return steps_per_execution_for(dispatch, max(step - dispatch, 1e-9))


def against_parts(combined: SpeedupRow, parts: Sequence[SpeedupRow]) -> SpeedupRow:
    """The ``combined`` row, no longer paid where one of its ``parts`` alone ran faster beyond noise: its changes
    hold each other back (a larger batch leaves input workers fewer batches to fetch ahead), and that part alone is
    the faster fit to take."""
    best = max((p for p in parts if p.after is not None), key=lambda p: p.after or 0.0, default=None)
    if combined.status != PAID or combined.after is None or best is None or best.after is None:
        return combined
    if not paid(combined.after, combined.after_uncertainty, best.after, best.after_uncertainty):
        return combined
    reason = (
        f"slower than {best.change} alone ({best.after:,.0f} samples/s): its changes hold each other back; "
        "that change alone is the faster fit"
    )
    return dataclasses.replace(combined, status=NO_GAIN, reason=reason, settings={"instead": best.change})


def order(row: SpeedupRow) -> int:
    """A row's place in a report (:data:`ORDER`; a kind not listed there goes last)."""
    return ORDER.index(row.kind) if row.kind in ORDER else len(ORDER)


def ceiling_cost(before: float | None, after: float) -> str:
    """The ceiling row's cost: how much of the step the input holds back."""
    share = 1.0 - (before or 0.0) / after if after else 0.0
    if share > 0:
        return f"the most any input change can give: the input holds back {100 * max(0.0, share):.0f}% of the step"
    return "the input holds nothing back"


__all__ = [
    "BASELINE",
    "CEILING",
    "COMBINED",
    "LOSS_STEPS",
    "LOSS_TOLERANCE",
    "MIN_GAIN",
    "NOT_APPLICABLE",
    "NOT_MEASURED",
    "NO_GAIN",
    "ORDER",
    "PAID",
    "STATUSES",
    "UNSAFE",
    "SpeedupRow",
    "against_parts",
    "between",
    "ceiling_cost",
    "decide",
    "dispatch_seconds",
    "loss_check",
    "noise",
    "order",
    "paid",
    "read_again",
    "steps_per_execution",
]
