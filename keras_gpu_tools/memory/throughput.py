"""The batch that trains fastest: the candidates, the knee rule, the time budget. No framework import.

``plan_batch_size(objective="throughput")`` measures the batch sizes users
pick that fit (:func:`candidate_sizes`: powers of two and the largest, a
multiple of 8; then :func:`finer_size`'s multiples of 8 around the knee) and
keeps one :class:`Candidate` row each, its samples/s with its uncertainty
(:func:`spread`; each timed until :func:`timing_stop`). The plan is the
smallest batch within ``tolerance`` of the best samples/s, uncertainties
counted (:func:`within`, :func:`knee`): past the knee a larger batch buys
next to nothing per second and costs compile time and memory. :class:`Budget` decides whether a
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
SATURATED_GAIN = 0.01  # a doubling of the batch known to gain less than this: the device is saturated
COMPILE_MARGIN = 2.0  # a candidate starts only where twice its expected compile fits in what is left
TARGET_UNCERTAINTY = 0.02  # a candidate is timed until its samples/s is known within ±2% (one standard error)
GRID = 8  # sizes users pick past 8: multiples of 8 (tensor cores, vector widths)
FINER_SAVING = 0.125  # a finer step pays where it may cut the planned batch by an eighth or more

# Why a candidate's timing stopped (`Candidate.stopped`).
STOP_KNOWN = "known"  # its uncertainty reached TARGET_UNCERTAINTY
STOP_SHARE = "share"  # its share of max_seconds was spent first
STOP_CAP = "cap"  # the most windows a candidate is timed over, reached first
STOP_BUDGET = "budget"  # the whole max_seconds was spent
STOP_FIXED = "fixed"  # a job's processes run a fixed number of windows (every step is collective)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One batch size of a throughput plan, measured or not.

    Attributes:
        batch_size: the global batch (every device's share together).
        per_device_batch_size: its share per device.
        fits: whether it fits every device's memory with the plan's margin.
        measured: whether its steady state was measured.
        samples_per_sec: training samples per second in the steady state
            (compile excluded): the batch over the mean step time; None
            where not measured.
        compile_seconds: the first call's time (tracing, compiling and the
            first step), never counted in `samples_per_sec`; None where not measured.
        step_seconds: one steady-state step (the mean over the timed windows);
            None where not measured.
        peak_mib: the peak memory per device (predicted or measured), the
            most over the devices; None where unknown.
        mfu: the model FLOP utilisation (FLOPs of a step over its time, over
            the devices' peak FLOP/s); None where the FLOPs or the peak are unknown.
        steps: the timed steady-state steps.
        reason: why it was not measured (empty where it was).
        uncertainty: the relative uncertainty of `samples_per_sec` (one
            standard error of the mean step time over the timed windows, over
            the mean: 0.013 is ±1.3%); None where not measured or timed over
            fewer than two windows.
        windows: the timed windows (epochs of a few steps each) the mean is over.
        stopped: why its timing stopped: `"known"` (the uncertainty reached
            ±2%), `"share"` (its share of `max_seconds` was spent first),
            `"cap"` (the most windows, reached first), `"budget"` (the whole
            `max_seconds` was spent) or `"fixed"` (a job's fixed windows);
            empty where not measured.
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
    uncertainty: float | None = None
    windows: int = 0
    stopped: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def known(self) -> bool:
        """Whether its samples/s is known within :data:`TARGET_UNCERTAINTY`."""
        return self.uncertainty is not None and self.uncertainty <= TARGET_UNCERTAINTY


def _even(b: int) -> int:
    """``b`` as users pick it: a multiple of :data:`GRID` from 8 on, an even size below (1 only where it is 1)."""
    if b >= GRID:
        return b - b % GRID
    return b if b <= 2 else b - b % 2


def candidate_sizes(largest: int, *, smallest: int = 1, divides: int | None = None) -> list[int]:
    """Per-device batch sizes to measure first: powers of two up to ``largest``, and ``largest`` as users pick it.

    The powers of two start at the largest one not above ``smallest`` (at
    least 2); ``largest`` is rounded down to a multiple of 8 from 8 on (an
    even size below): never an odd size, except 1 where nothing larger fits.
    :func:`finer_size` later adds multiples of 8 around the knee.

    With ``divides`` (a fixed per-device batch split into micro-batches), its
    divisors that are multiples of 8 (not above ``largest``, from
    ``smallest`` on), each at least twice the one before, and the largest of
    them. Where it has no such divisor: powers of two among its divisors, and
    the largest divisor not above ``largest``.
    """
    if largest < 1:
        return []
    if divides is not None:
        divisors = [d for d in range(1, min(largest, divides) + 1) if divides % d == 0]
        if not divisors:
            return []
        eights = [d for d in divisors if d % GRID == 0]
        if not eights:
            top = divisors[-1]
            picked = {d for d in divisors if d >= smallest and d & (d - 1) == 0}
            return sorted(picked | {top})
        pool = [d for d in eights if d >= smallest] or eights[-1:]
        out = [pool[0]]
        for d in pool[1:]:
            if d >= 2 * out[-1]:
                out.append(d)
        return out if out[-1] == eights[-1] else [*out, eights[-1]]
    top = _even(largest)
    if top <= 2:
        return [top]
    b, out = max(2, 1 << (max(1, smallest).bit_length() - 1)), []
    while b < top:
        out.append(b)
        b *= 2
    return [*out, top]


def finer_grid(low: int, high: int, divides: int | None = None) -> list[int]:
    """The sizes strictly between ``low`` and ``high`` a finer step may measure: multiples of 8 (dividing ``divides``).

    A fixed batch without divisors that are multiples of 8 gets none: its candidates are all its divisors' powers of two.
    """
    sizes = [b for b in range(low + 1, high) if b % GRID == 0]
    if divides is None:
        return sizes
    if not any(d % GRID == 0 for d in range(GRID, divides + 1, GRID) if divides % d == 0):
        return []
    return [b for b in sizes if divides % b == 0]


def finer_size(
    rows: Sequence[Candidate], *, divides: int | None = None, tolerance: float = KNEE_TOLERANCE
) -> int | None:
    """The per-device size to measure next between the knee and the measured size below it, or None.

    The knee (:func:`knee`) lies between the planned size ``high`` and the
    largest measured size ``low`` below it (not within ``tolerance``): the
    size of :func:`finer_grid` nearest their middle is measured next, bisecting
    towards the knee. A finer step pays while it may cut the plan by
    :data:`FINER_SAVING` or more (``high - low`` at least a quarter of
    ``high``) and the grid has a size between them not yet tried.
    """
    chosen, _ = knee(rows, tolerance)
    if chosen is None:
        return None
    high = chosen.per_device_batch_size
    below = [r.per_device_batch_size for r in rows if r.measured and r.per_device_batch_size < high]
    if not below:
        return None
    low = max(below)
    if high - low < 2 * FINER_SAVING * high:
        return None
    tried = {r.per_device_batch_size for r in rows}
    grid = [b for b in finer_grid(low, high, divides) if b not in tried]
    if not grid:
        return None
    middle = (low + high) / 2
    return min(grid, key=lambda b: (abs(b - middle), b))


def could_refine(sizes: Sequence[int], divides: int | None = None) -> bool:
    """Whether :func:`finer_size` could ever add a size between two of ``sizes`` (a job asks before it agrees on rows)."""
    ordered = sorted(sizes)
    return any(
        high - low >= 2 * FINER_SAVING * high and finer_grid(low, high, divides)
        for low, high in zip(ordered, ordered[1:])
    )


def spread(step_seconds: Sequence[float]) -> tuple[float, float | None]:
    """The mean of windows' step times and its relative standard error (None under two windows)."""
    import statistics  # where the candidates are timed only: the report imports this module

    mean = statistics.fmean(step_seconds)
    if len(step_seconds) < 2 or mean <= 0:
        return mean, None
    return mean, statistics.stdev(step_seconds) / math.sqrt(len(step_seconds)) / mean


def timing_stop(
    step_seconds: Sequence[float],
    *,
    elapsed: float,
    share: float | None,
    min_windows: int,
    max_windows: int,
    target: float = TARGET_UNCERTAINTY,
    window: float = 0.0,
) -> str:
    """Why a candidate's timing stops after these windows' step times, or "" to time another window.

    It stops once the mean is known within ``target`` (from ``min_windows``
    windows on: :data:`STOP_KNOWN`), once one more window (expected to last
    ``window`` seconds, as the last did) would take ``elapsed`` (seconds since
    the candidate started, its compile included) past its ``share`` of the
    budget (:data:`STOP_SHARE`, from two windows on, so that a spread is
    known; a timing ends within its share, not a window past it) or at
    ``max_windows`` (:data:`STOP_CAP`).
    """
    n = len(step_seconds)
    if n >= min_windows:
        _, rel = spread(step_seconds)
        if rel is not None and rel <= target:
            return STOP_KNOWN
    if share is not None and n >= 2 and elapsed + window >= share:
        return STOP_SHARE
    if n >= max_windows:
        return STOP_CAP
    return ""


def within(row: Candidate, best: Candidate, tolerance: float = KNEE_TOLERANCE) -> bool:
    """Whether ``row`` is within ``tolerance`` of ``best``, their uncertainties counted (``best`` always is).

    The rule: the ratio of ``row``'s samples/s to ``best``'s, less the ratio's
    own uncertainty (both relative uncertainties added in quadrature, one
    standard error), reaches ``1 - tolerance``. A smaller batch is planned
    only where it is within 5% of the fastest with that margin: what the plan
    says of its batch ("within 5% of the fastest") then holds in the fit,
    where a reading given the benefit of its doubt planned batches slower than
    that. Two figures known to ±2% need a ratio of 97.8%; bare figures, 95%.
    """
    r, b = row.samples_per_sec or 0.0, best.samples_per_sec or 0.0
    if row is best or r >= b:
        return True
    margin = math.hypot(row.uncertainty or 0.0, best.uncertainty or 0.0)
    return r / b - margin >= 1.0 - tolerance


def _sps(r: Candidate) -> str:
    pm = "" if r.uncertainty is None else f" ±{100 * r.uncertainty:.1f}%"
    return f"{r.samples_per_sec:,.0f}{pm}"


def knee(rows: Sequence[Candidate], tolerance: float = KNEE_TOLERANCE) -> tuple[Candidate | None, str]:
    """The smallest measured batch within ``tolerance`` of the best samples/s (see :func:`within`), and why.

    None (with the reason) where no candidate was measured. The words say
    too when the curve is flat (every measured batch within ``tolerance``),
    when only one candidate was measured (the plan is what was measured), and
    when candidates' figures stayed above ±2% because their time ran out.
    """
    measured = [r for r in rows if r.measured and r.samples_per_sec]
    if not measured:
        return None, "no candidate was measured"
    best = max(measured, key=lambda r: r.samples_per_sec or 0.0)
    chosen = min((r for r in measured if within(r, best, tolerance)), key=lambda r: r.batch_size)
    if chosen is best:
        why = f"batch {best.batch_size} trains fastest ({_sps(best)} samples/s)"
    else:
        share = 100.0 * (chosen.samples_per_sec or 0.0) / (best.samples_per_sec or 1.0)
        why = (
            f"batch {chosen.batch_size} is the smallest within {100 * tolerance:g}% of the fastest, uncertainties "
            f"counted ({_sps(chosen)} samples/s, {share:.1f}% of batch {best.batch_size}'s {_sps(best)})"
        )
    largest = max(measured, key=lambda r: r.batch_size)
    if largest is not chosen and largest.samples_per_sec:
        why += f"; the largest measured, {largest.batch_size}, runs {largest.samples_per_sec:,.0f} samples/s"
        if chosen.compile_seconds is not None and largest.compile_seconds is not None:
            why += f" and compiles in {largest.compile_seconds:.1f} s against {chosen.compile_seconds:.1f} s"
    if len(measured) >= 2 and all(within(r, best, tolerance) for r in measured):
        why += (
            f"; the curve is flat: every measured batch is within {100 * tolerance:g}% of the fastest, so the "
            "smallest is planned"
        )
    unmeasured = [r for r in rows if not r.measured and r.reason]
    if len(measured) == 1 and unmeasured:
        why += (
            f"; only batch {chosen.batch_size} was measured ({len(unmeasured)} other candidate"
            f"{'s' if len(unmeasured) > 1 else ''} not: {unmeasured[0].reason}): the plan is what was measured, "
            "not a knee"
        )
    short = [r for r in measured if r.stopped in (STOP_SHARE, STOP_BUDGET) and not r.known]
    if short:
        why += (
            f"; {len(short)} candidate{'s' if len(short) > 1 else ''} ("
            + ", ".join(str(r.batch_size) for r in short)
            + f") reached no ±{100 * TARGET_UNCERTAINTY:g}% before {'their' if len(short) > 1 else 'its'} share "
            "of max_seconds was spent (the table gives each one's ±)"
        )
    return chosen, why


def saturation(rows: Sequence[Candidate]) -> str:
    """Why no larger candidate is measured once the device is saturated, or "".

    Saturated: the last two measured candidates are a batch and its double,
    and the double is known (its samples/s over the smaller's plus that ratio's
    uncertainty) to gain less than :data:`SATURATED_GAIN`. A step's speed per
    sample rises with the batch until the device is busy and then stays flat,
    so larger batches, whose compiles grow, are not expected to change a plan
    that takes the smallest batch within 5% of the fastest.
    """
    measured = [r for r in rows if r.measured and r.samples_per_sec]
    if len(measured) < 2:
        return ""
    small, large = measured[-2], measured[-1]
    if large.batch_size != 2 * small.batch_size or small.uncertainty is None or large.uncertainty is None:
        return ""  # a figure without its uncertainty is not known to be flat
    gain = (large.samples_per_sec or 0.0) / (small.samples_per_sec or 1.0) - 1.0
    margin = math.hypot(small.uncertainty, large.uncertainty)
    if gain + margin >= SATURATED_GAIN:
        return ""
    return (
        f"batch {large.batch_size} ran {100 * gain:+.1f}% (±{100 * margin:.1f}%) against {small.batch_size}: "
        f"a doubling gains under {100 * SATURATED_GAIN:g}%, so the device is saturated and larger batches, "
        "whose compiles grow, are not timed within max_seconds"
    )


def expected_compile(measured: Sequence[tuple[float, float]]) -> float:
    """The next, larger candidate's expected compile, from the measured ones' (compile, wall) seconds.

    Compiles grow with the batch (XLA's autotuning about doubles with it): the
    last compile, grown as it grew over the one before (1x to 4x). 0 before the first.
    """
    if not measured:
        return 0.0
    compiled = measured[-1][0]
    growth = 1.0
    if len(measured) >= 2 and measured[-2][0] > 0:
        growth = min(4.0, max(1.0, compiled / measured[-2][0]))
    return compiled * growth


def expected_seconds(measured: Sequence[tuple[float, float]]) -> float:
    """What the next, larger candidate is expected to take: :func:`expected_compile` plus the last
    steady-state measurement. 0 before the first."""
    if not measured:
        return 0.0
    compiled, wall = measured[-1]
    return expected_compile(measured) + max(0.0, wall - compiled)


class Budget:
    """``max_seconds`` of planning: whether a candidate can still be measured.

    A candidate is expected to take :func:`expected_seconds`; one that would
    not finish within what is left is not measured. A compile cannot be cut
    short, and XLA's autotuning can jump far past its growth from one batch to
    the next: a candidate is started only where its expected compile fits
    :data:`COMPILE_MARGIN` times over (decision record 0014).
    """

    def __init__(self, max_seconds: float | None, clock: Callable[[], float] = time.perf_counter):
        self.max_seconds = max_seconds
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return math.inf if self.max_seconds is None else self.max_seconds - (self.clock() - self.start)

    def overrun(self, seconds: float) -> bool:
        """Whether ``seconds`` more would outlast the budget (a timing's next window, say)."""
        return self.left() <= seconds

    def refuses(self, expected_seconds: float, compile_seconds: float = 0.0) -> str | None:
        """Why a candidate expected to take ``expected_seconds`` (``compile_seconds`` of it compiling) is not
        measured, or None."""
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
        kept = expected_seconds + (COMPILE_MARGIN - 1.0) * compile_seconds
        if kept > left:
            return (
                f"its compile and measurement would take about {expected_seconds:.1f} s, and {kept:.1f} s with "
                f"its compile counted {COMPILE_MARGIN:g} times (a compile can jump past its growth), more than "
                f"the {left:.1f} s left of max_seconds={self.max_seconds:g}"
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


TABLE_HEADER = ("batch", "per device", "samples/s", "±", "compile s", "step ms", "peak", "MFU", "note")


def timing_note(r: Candidate) -> str:
    """Why a measured candidate's figure is not known to ±2% (its time ran out first), or ""."""
    if not r.measured or r.known or r.stopped in ("", STOP_KNOWN, STOP_FIXED):
        return ""
    target = f"±{100 * TARGET_UNCERTAINTY:g}%"
    windows = f"{r.windows} window{'s' if r.windows != 1 else ''}"
    if r.stopped == STOP_SHARE:
        return f"its share of max_seconds was spent before {target} ({windows})"
    if r.stopped == STOP_BUDGET:
        return f"max_seconds was spent before {target} ({windows})"
    return f"not within {target} after {windows} (the most timed)"


def table_rows(rows: Sequence[Candidate], chosen: int | None = None) -> list[tuple[str, ...]]:
    """The candidates' cells under :data:`TABLE_HEADER`; ``chosen`` is marked with ``*``.

    The ± cell is the relative uncertainty of samples/s (one standard error).
    """

    def cell(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return [
        (
            f"{'*' if r.batch_size == chosen else ''}{r.batch_size}",
            str(r.per_device_batch_size),
            cell(r.samples_per_sec, ",.0f"),
            "-" if r.uncertainty is None else f"{100 * r.uncertainty:.1f}%",
            cell(r.compile_seconds, ".2f"),
            cell(None if r.step_seconds is None else 1e3 * r.step_seconds, ".1f"),
            "-" if r.peak_mib is None else format_bytes(r.peak_mib * 2**20),
            "-" if r.mfu is None else f"{100 * r.mfu:.1f}%",
            ("" if r.fits else "does not fit; ") + (r.reason if not r.measured else timing_note(r)),
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
    "COMPILE_MARGIN",
    "GRID",
    "KNEE_TOLERANCE",
    "SATURATED_GAIN",
    "TABLE_HEADER",
    "TARGET_UNCERTAINTY",
    "Budget",
    "Candidate",
    "candidate_sizes",
    "could_refine",
    "saturation",
    "expected_compile",
    "finer_grid",
    "finer_size",
    "format_table",
    "knee",
    "slowest",
    "spread",
    "table_rows",
    "timing_note",
    "timing_stop",
    "within",
]
