"""The largest batch that fits: an exponential search, then a binary one. No framework import.

Like Lightning's ``BatchSizeFinder`` (``mode="binsearch"``) and Accelerate's
``find_executable_batch_size``, but the question "does it fit?" is answered
by a measurement (:func:`search_batch_size`'s ``measure``: a predicted or
measured peak per device), compared with each device's capacity less a
margin, so a batch that would run out of memory is usually never run.
:class:`StepPeaks` is such a ``measure`` over a backend's trial steps (an
out-of-memory error counts as not fitting), :func:`sample_batch` builds the
trial batches (or only their shapes, :class:`ArraySpec`), :class:`BatchPlan`
is what was found and :func:`plan_limit` the largest micro-batch a plan allows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.memory.freeing import free_failed_step, held_since, in_use
from keras_gpu_tools.memory.throughput import Candidate, format_table
from keras_gpu_tools.runtime.units import format_bytes
from keras_gpu_tools.runtime.validation import check_int

logger = logging.getLogger("keras_gpu_tools")


@dataclasses.dataclass
class Trial:
    """One batch size tried: its peak per device (None where it ran out of memory), and whether it fits."""

    batch_size: int  # per device
    peak_bytes: list[float] | None
    fits: bool
    note: str = ""


def search_batch_size(
    measure: Callable[[int], list[float] | None],
    limits: Sequence[float],
    *,
    start: int = 1,
    maximum: int | None = None,
    tolerance: float = 0.02,
    refuses: Callable[[int], str | None] | None = None,
) -> tuple[int, list[Trial]]:
    """The largest batch size (per device) whose peak fits every device's limit, and the trials.

    ``measure(b)`` returns the peak bytes per device of a step at ``b`` (None:
    it ran out of memory). The search doubles from ``start`` until a size does
    not fit (or ``maximum``), then halves the interval between the largest
    that fits and the smallest that does not, until it is within
    ``tolerance`` of the size found (or 1). Returns 0 when not even 1 fits.

    ``refuses(b)``, where given, is asked before each trial after the first:
    a reason stops the search there, with the largest size known to fit
    (a time budget, :class:`TrialClock`).
    """
    trials: list[Trial] = []

    def fits(b: int) -> bool:
        peaks = measure(b)
        ok = peaks is not None and all(p <= lim for p, lim in zip(peaks, limits))
        trials.append(Trial(b, None if peaks is None else [float(p) for p in peaks], ok))
        return ok

    low, high = 0, None  # the largest size that fits, the smallest that does not
    b = max(1, start if maximum is None else min(start, maximum))
    while True:
        if trials and refuses is not None and refuses(b):
            return low, trials
        if fits(b):
            low = b
            if maximum is not None and b >= maximum:
                break
            b = 2 * b if maximum is None else min(2 * b, maximum)
        else:
            high = b
            break
    while high is not None and high - low > max(1, int(tolerance * low)):
        mid = (low + high) // 2
        if refuses is not None and refuses(mid):
            break
        if fits(mid):
            low = mid
        else:
            high = mid
    return low, trials


class StepPeaks:
    """``measure`` for :func:`search_batch_size` from trial steps: the peak per device, None where one ran out of memory.

    ``step_memory(per_device)`` returns the peaks of one step at that batch
    size per device and how they were obtained (kept in ``method``). A trial
    that runs out of memory (``is_oom``) has its memory freed before the next
    one, whose peak it would otherwise count in; any other error passes through.
    ``device_memory`` is the backend's (see :func:`~keras_gpu_tools.memory.recovery.in_use`).
    """

    def __init__(
        self,
        step_memory: Callable[[int], tuple[list[float], str]],
        is_oom: Callable[[BaseException], bool],
        device_memory: Callable[[], dict[str, Any]],
        replicas: int = 1,
    ):
        self.step_memory = step_memory
        self.is_oom = is_oom
        self.device_memory = device_memory
        self.replicas = replicas
        self.method = ""

    def __call__(self, per_device: int) -> list[float] | None:
        before = in_use(self.device_memory)
        try:
            peaks, self.method = self.step_memory(per_device)
        except Exception as e:
            if not self.is_oom(e):
                raise
            failure = e
        else:
            return peaks
        logger.info("keras_gpu_tools: plan_batch_size: batch %d ran out of memory", per_device * self.replicas)
        # Left held, the failed trial's tensors would count in every later trial's peak.
        free_failed_step(failure, held_since(self.device_memory, before))
        return None


class TrialClock:
    """The memory search's share of ``max_seconds``: times each trial, and refuses one that would overrun.

    A trial at ``b`` is expected to take as long per sample as the last one
    did (a step's time grows with its batch): a trial of a million samples
    can take seconds, so searching up to the memory maximum could spend the
    whole budget before any candidate is timed. ``stopped`` says why the
    search stopped early, or is empty.
    """

    def __init__(
        self,
        measure: Callable[[int], list[float] | None],
        seconds: float,
        clock: Callable[[], float],
    ):
        self.measure = measure
        self.seconds = seconds
        self.clock = clock
        self.start = clock()
        self.last: tuple[int, float] | None = None  # (batch, seconds) of the last trial
        self.stopped = ""

    def __call__(self, per_device: int) -> list[float] | None:
        t0 = self.clock()
        try:
            return self.measure(per_device)
        finally:
            self.last = (per_device, self.clock() - t0)

    def refuses(self, per_device: int) -> str | None:
        if self.last is None:
            return None
        b, took = self.last
        expected = took * max(1.0, per_device / b)
        left = self.seconds - (self.clock() - self.start)
        if expected <= left:
            return None
        self.stopped = (
            f"the memory search stopped at per-device batch {b}: a trial at {per_device} would take about "
            f"{expected:.1f} s, more than the {max(0.0, left):.1f} s left of its {self.seconds:.0f} s share of "
            "max_seconds, so larger batches were not tried"
        )
        return self.stopped


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """An array's shape and dtype, with no data: a trial batch for a backend that compiles the step, never runs it."""

    shape: tuple[int, ...]
    dtype: Any


def sample_batch(x, y, b: int, n: int, *, shapes_only: bool = False):
    """``(x, y)`` of ``b`` samples of ``n``: the first ``b``, repeated where there are fewer.

    With ``shapes_only``, each array's :class:`ArraySpec` at ``b`` samples
    instead: no host array of the trial size is built (gigabytes at the sizes
    a large card fits), only one sample's shape and dtype are read.
    """
    import numpy as np

    index = None if shapes_only else np.arange(b) % n

    def take(a):
        if a is None:
            return None
        if isinstance(a, dict):
            return {k: take(v) for k, v in a.items()}
        if isinstance(a, (list, tuple)):
            return type(a)(take(v) for v in a)
        a = np.asarray(a)
        float64 = a.dtype == np.float64  # Keras's data adapters train on floatx
        if shapes_only:
            return ArraySpec((b, *a.shape[1:]), np.dtype("float32") if float64 else a.dtype)
        return (a.astype("float32") if float64 else a)[index]

    return take(x), take(y)


@dataclasses.dataclass
class BatchPlan:
    """What :func:`keras_gpu_tools.plan_batch_size` found.

    Attributes:
        batch_size: the largest global batch (every replica's together) that
            fits every device with ``margin`` headroom (0: not even 1 fits).
        per_device_batch_size: its share per device under data parallelism.
        devices: the devices (replicas) the batch is split over.
        peak_mib: the predicted (or measured) peak memory per device at
            ``batch_size``.
        capacity_mib: the memory each device was planned for
            (``memory_limit_mib``, or its capacity).
        margin: the share of the capacity left free.
        method: how the peaks were obtained (and, by throughput, timed).
        trials: every per-device batch size tried by the memory search.
        objective: `"memory"` (the largest batch that fits) or `"throughput"`
            (the smallest within 5% of the fastest measured).
        candidates: by throughput, one `Candidate` row per batch size
            considered (measured or not, with the reason).
        why: by throughput, why this batch (in words).
        global_batch_size: the fixed global batch whose fastest micro-batch
            `batch_size` is (None: not fixed). `micro_batches` is their ratio.
        plan_seconds: how long planning took, compiles included.
    """

    batch_size: int
    per_device_batch_size: int
    devices: int
    peak_mib: list[float]
    capacity_mib: list[float]
    margin: float
    method: str
    trials: list[Trial] = dataclasses.field(default_factory=list)
    objective: str = "memory"
    candidates: list[Candidate] = dataclasses.field(default_factory=list)
    why: str = ""
    global_batch_size: int | None = None
    plan_seconds: float | None = None

    @property
    def fits(self) -> bool:
        return self.batch_size > 0

    @property
    def micro_batches(self) -> int | None:
        """With ``global_batch_size``: the micro-batches each global batch runs as (None without)."""
        if self.global_batch_size is None or self.batch_size < 1:
            return None
        return self.global_batch_size // self.batch_size

    def __str__(self) -> str:
        if self.objective == "throughput" and self.fits:
            return self._throughput_text()
        if not self.fits:
            return (
                f"No batch fits: even 1 sample per device needs more than {100 * (1 - self.margin):.0f}% of "
                f"{', '.join(format_bytes(c * 2**20) for c in self.capacity_mib)} ({self.method})."
            )
        peaks = ", ".join(
            f"{format_bytes(p * 2**20)} of {format_bytes(c * 2**20)}" for p, c in zip(self.peak_mib, self.capacity_mib)
        )
        per = f" ({self.per_device_batch_size} per device on {self.devices} devices)" if self.devices > 1 else ""
        return (
            f"batch size {self.batch_size}{per}: predicted peak {peaks} (margin {100 * self.margin:.0f}%); "
            f"{len(self.trials)} trials; method: {self.method}"
        )

    def _throughput_text(self) -> str:
        per = f" ({self.per_device_batch_size} per device on {self.devices} devices)" if self.devices > 1 else ""
        took = "" if self.plan_seconds is None else f"; planned in {self.plan_seconds:.1f} s"
        return (
            f"batch size {self.batch_size}{per}, objective 'throughput': {self.why}{took}\n"
            f"{format_table(self.candidates, self.batch_size)}\n(* the plan; compile time is apart from "
            f"samples/s; method: {self.method})"
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> BatchPlan:
        """The plan :meth:`as_dict` wrote (its JSON in a log directory); keys it does not know are left out."""

        def known(kind: type, rec: dict[str, Any]) -> dict[str, Any]:
            names = {f.name for f in dataclasses.fields(kind)}
            return {k: v for k, v in rec.items() if k in names}

        fields = known(cls, record)
        fields["trials"] = [Trial(**known(Trial, t)) for t in record.get("trials") or []]
        fields["candidates"] = [Candidate(**known(Candidate, c)) for c in record.get("candidates") or []]
        return cls(**fields)

    def plot(self) -> Any:
        """A matplotlib `Figure` of the candidates' samples/s and peak memory against the batch size."""
        from keras_gpu_tools.memory import throughput_plot

        return throughput_plot.figure(self.candidates, self.batch_size)

    def write(self, log_dir: str, run_name: str = schema.PLAN_RUN) -> None:
        """Writes the plan to ``log_dir/run_name``: its text, its data, and with candidates a figure and scalars.

        The scalars ``plan/samples_per_sec`` and ``plan/peak_mib`` have the
        batch size as their step: TensorBoard plots them against the batch.
        The training report shows the plan (`keras_gpu_tools.report(log_dir)`).
        """
        from keras_gpu_tools.logdir.writer import EventWriter

        writer = EventWriter(os.path.join(os.fspath(log_dir), run_name))
        try:
            # An indented block: TensorBoard's Text tab shows it as written (a table).
            writer.text(schema.PLAN_SUMMARY, "\n".join("    " + line for line in str(self).splitlines()), 0)
            writer.json(schema.PLAN_SUMMARY_DATA, self.as_dict(), 0)
            for row in self.candidates:
                values = {schema.PLAN_SAMPLES_PER_SEC: row.samples_per_sec, schema.PLAN_PEAK_MIB: row.peak_mib}
                writer.scalars({k: v for k, v in values.items() if v is not None}, row.batch_size)
            if any(r.measured for r in self.candidates) and not writer.figure(schema.PLAN_FIGURE, self.plot, 0):
                logger.info(
                    "keras_gpu_tools: no matplotlib; the plan's figure is left out"
                )  # the scalars plot the same
        finally:
            writer.close()


def plan_limit(plan: BatchPlan | int | None) -> int | None:
    """The largest micro-batch a plan allows: a `BatchPlan`'s `batch_size`, or an int (validated)."""
    if plan is None:
        return None
    if hasattr(plan, "batch_size"):
        return check_int("plan.batch_size", plan.batch_size, low=1)
    return check_int("plan", plan, low=1)


__all__ = [
    "ArraySpec",
    "BatchPlan",
    "StepPeaks",
    "Trial",
    "TrialClock",
    "plan_limit",
    "sample_batch",
    "search_batch_size",
]
