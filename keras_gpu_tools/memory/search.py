"""The largest batch that fits: an exponential search, then a binary one. No framework import.

Like Lightning's ``BatchSizeFinder`` (``mode="binsearch"``) and Accelerate's
``find_executable_batch_size``, but the question "does it fit?" is answered
by a measurement (:func:`search_batch_size`'s ``measure``: a predicted or
measured peak per device), compared with each device's capacity less a
margin, so a batch that would run out of memory is usually never run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.runtime.units import format_bytes


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
) -> tuple[int, list[Trial]]:
    """The largest batch size (per device) whose peak fits every device's limit, and the trials.

    ``measure(b)`` returns the peak bytes per device of a step at ``b`` (None:
    it ran out of memory). The search doubles from ``start`` until a size does
    not fit (or ``maximum``), then halves the interval between the largest
    that fits and the smallest that does not, until it is within
    ``tolerance`` of the size found (or 1). Returns 0 when not even 1 fits.
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
        if fits(mid):
            low = mid
        else:
            high = mid
    return low, trials


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
        method: how the peaks were obtained.
        trials: every per-device batch size tried.
    """

    batch_size: int
    per_device_batch_size: int
    devices: int
    peak_mib: list[float]
    capacity_mib: list[float]
    margin: float
    method: str
    trials: list[Trial] = dataclasses.field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.batch_size > 0

    def __str__(self) -> str:
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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


__all__ = ["BatchPlan", "Trial", "search_batch_size"]
