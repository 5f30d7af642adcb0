"""The batch that trains fastest: the candidates, the knee rule, the time budget. No framework import.

``plan_batch_size(objective="throughput")`` measures a few batch sizes that
fit (:func:`candidate_sizes`) and keeps one :class:`Candidate` row each. The
plan is the smallest batch within ``tolerance`` of the best samples/s
(:func:`knee`): past the knee a larger batch buys next to nothing per second
and costs compile time and memory. :class:`Budget` decides whether a
candidate is still measured within ``max_seconds``; :func:`slowest` merges
the rows of a job's processes (each candidate's slowest figure), so that
every process picks the same batch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.runtime.units import format_bytes

KNEE_TOLERANCE = 0.05  # a batch within 5% of the best samples/s is as good as the best


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One batch size of a throughput plan, measured or not.

    Attributes:
        batch_size: the global batch (every device's share together).
        per_device_batch_size: its share per device.
        fits: whether it fits every device's memory with the plan's margin.
        measured: whether its steady state was measured.
        samples_per_sec: training samples per second in the steady state
            (compile excluded); None where not measured.
        compile_seconds: the first call's time (tracing, compiling and the
            first step), never counted in `samples_per_sec`; None where not measured.
        step_seconds: one steady-state step; None where not measured.
        peak_mib: the peak memory per device (predicted or measured), the
            most over the devices; None where unknown.
        mfu: the model FLOP utilisation (FLOPs of a step over its time, over
            the devices' peak FLOP/s); None where the FLOPs or the peak are unknown.
        steps: the timed steady-state steps.
        reason: why it was not measured (empty where it was).
    """

    batch_size: int
    per_device_batch_size: int
    fits: bool
    measured: bool = False
    samples_per_sec: float | None = None
    compile_seconds: float | None = None
    step_seconds: float | None = None
    peak_mib: float | None = None
    mfu: float | None = None
    steps: int = 0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def candidate_sizes(largest: int, *, smallest: int = 1, divides: int | None = None) -> list[int]:
    """Per-device batch sizes to measure: powers of two from ``smallest`` up to ``largest``, and ``largest``.

    With ``divides`` (a fixed per-device batch split into micro-batches), only
    the sizes that divide it: powers of two among its divisors, and the
    largest divisor not above ``largest``.
    """
    if largest < 1:
        return []
    if divides is not None:
        divisors = [d for d in range(1, min(largest, divides) + 1) if divides % d == 0]
        if not divisors:
            return []
        top = divisors[-1]
        picked = {d for d in divisors if d >= smallest and d & (d - 1) == 0}
        return sorted(picked | {top})
    out, b = [], max(1, smallest)
    while b < largest:
        out.append(b)
        b *= 2
    return [*out, largest]


def knee(rows: Sequence[Candidate], tolerance: float = KNEE_TOLERANCE) -> tuple[Candidate | None, str]:
    """The smallest measured batch within ``tolerance`` of the best samples/s, and why (in words).

    None (with the reason) where no candidate was measured.
    """
    measured = [r for r in rows if r.measured and r.samples_per_sec]
    if not measured:
        return None, "no candidate was measured"
    best = max(measured, key=lambda r: r.samples_per_sec or 0.0)
    floor = (1.0 - tolerance) * (best.samples_per_sec or 0.0)
    chosen = min((r for r in measured if (r.samples_per_sec or 0.0) >= floor), key=lambda r: r.batch_size)
    if chosen is best:
        why = f"batch {best.batch_size} trains fastest ({best.samples_per_sec:,.0f} samples/s)"
    else:
        share = 100.0 * (chosen.samples_per_sec or 0.0) / (best.samples_per_sec or 1.0)
        why = (
            f"batch {chosen.batch_size} is the smallest within {100 * tolerance:g}% of the fastest "
            f"({chosen.samples_per_sec:,.0f} samples/s, {share:.1f}% of batch {best.batch_size}'s "
            f"{best.samples_per_sec:,.0f})"
        )
    largest = max(measured, key=lambda r: r.batch_size)
    if largest is not chosen and largest.samples_per_sec:
        why += f"; the largest measured, {largest.batch_size}, runs {largest.samples_per_sec:,.0f} samples/s"
        if chosen.compile_seconds is not None and largest.compile_seconds is not None:
            why += f" and compiles in {largest.compile_seconds:.1f} s against {chosen.compile_seconds:.1f} s"
    return chosen, why


def expected_seconds(measured: Sequence[tuple[float, float]]) -> float:
    """What the next, larger candidate is expected to take, from the measured ones' (compile, wall) seconds.

    Compiles grow with the batch (XLA's autotuning about doubles with it): the
    last compile, grown as it grew over the one before (1x to 4x), plus the
    last steady-state measurement. 0 before the first.
    """
    if not measured:
        return 0.0
    compiled, wall = measured[-1]
    growth = 1.0
    if len(measured) >= 2 and measured[-2][0] > 0:
        growth = min(4.0, max(1.0, compiled / measured[-2][0]))
    return compiled * growth + max(0.0, wall - compiled)


class Budget:
    """``max_seconds`` of planning: whether a candidate can still be measured.

    A candidate is expected to take :func:`expected_seconds`; one that would
    not finish within what is left is not measured (a compile cannot be cut short).
    """

    def __init__(self, max_seconds: float | None, clock: Callable[[], float] = time.perf_counter):
        self.max_seconds = max_seconds
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return math.inf if self.max_seconds is None else self.max_seconds - (self.clock() - self.start)

    def refuses(self, expected_seconds: float) -> str | None:
        """Why a candidate expected to take ``expected_seconds`` is not measured, or None."""
        if self.max_seconds is None:
            return None
        left = self.left()
        if left <= 0:
            return f"the budget of {self.max_seconds:g} s was spent"
        if expected_seconds > left:
            return (
                f"its compile and measurement would take about {expected_seconds:.1f} s (compiles grow with the "
                f"batch), more than the {left:.1f} s left of max_seconds={self.max_seconds:g}"
            )
        return None


def slowest(per_process: Sequence[Sequence[dict[str, Any]]]) -> list[Candidate]:
    """Every process's rows merged: per batch size, the slowest process's figures (the job runs at its pace).

    A candidate measured in one process and not in another counts as not
    measured (with the other's reason); peaks and compile times are the most.
    """
    merged: list[Candidate] = []
    for i in range(len(per_process[0])):
        rows = [Candidate(**proc[i]) for proc in per_process]
        missing = next((r for r in rows if not r.measured), None)
        peaks = [r.peak_mib for r in rows if r.peak_mib is not None]
        compiles = [r.compile_seconds for r in rows if r.compile_seconds is not None]
        slow = min(rows, key=lambda r: r.samples_per_sec or 0.0)
        merged.append(
            dataclasses.replace(
                slow if missing is None else missing,
                fits=all(r.fits for r in rows),
                peak_mib=max(peaks) if peaks else None,
                compile_seconds=max(compiles) if compiles else None,
                mfu=min((r.mfu for r in rows if r.mfu is not None), default=None),
            )
        )
    return merged


TABLE_HEADER = ("batch", "per device", "samples/s", "compile s", "step ms", "peak", "MFU", "note")


def table_rows(rows: Sequence[Candidate], chosen: int | None = None) -> list[tuple[str, ...]]:
    """The candidates' cells under :data:`TABLE_HEADER`; ``chosen`` is marked with ``*``."""

    def cell(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return [
        (
            f"{'*' if r.batch_size == chosen else ''}{r.batch_size}",
            str(r.per_device_batch_size),
            cell(r.samples_per_sec, ",.0f"),
            cell(r.compile_seconds, ".2f"),
            cell(None if r.step_seconds is None else 1e3 * r.step_seconds, ".1f"),
            "-" if r.peak_mib is None else format_bytes(r.peak_mib * 2**20),
            "-" if r.mfu is None else f"{100 * r.mfu:.1f}%",
            ("" if r.fits else "does not fit; ") + (r.reason if not r.measured else ""),
        )
        for r in rows
    ]


def format_table(rows: Sequence[Candidate], chosen: int | None = None) -> str:
    """The candidates as an aligned table; ``chosen`` is marked with ``*``."""
    lines = [(*TABLE_HEADER[:-1], ""), *table_rows(rows, chosen)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(TABLE_HEADER) - 1)]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line[:-1], widths)) + (f"  {line[-1]}" if line[-1] else "")
        for line in lines
    )


__all__ = [
    "KNEE_TOLERANCE",
    "TABLE_HEADER",
    "Budget",
    "Candidate",
    "candidate_sizes",
    "format_table",
    "knee",
    "slowest",
    "table_rows",
]
