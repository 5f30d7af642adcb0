"""Headroom: the allocator's peak per device in a run against its capacity, and the batch that would fit.

Framework-free: the peaks come from the backend (``Backend.device_peaks``);
the rows are what the reducer's ``headroom()`` returns, the report shows and
:func:`~keras_gpu_tools.memory.explain.headroom_lines` says in words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The share of a device's capacity the estimate of the batch that would fit leaves free.
MARGIN = 0.1


class Headroom:
    """The highest peak seen per device in a run, against its capacity.

    Args:
        plan_size: the largest micro-batch of a batch-size plan, which is the
            batch that fits where one was given; None for an estimate.
    """

    def __init__(self, plan_size: int | None = None):
        self.plan_size = plan_size
        self.peaks: dict[int, tuple[float, float | None]] = {}  # device -> (peak bytes, capacity)

    def record(self, device_peaks: Callable[[], dict[int, tuple[float, float | None]]]) -> None:
        """Takes in the allocator's peak per device now (none where the backend cannot tell)."""
        try:
            peaks = device_peaks()
        except Exception:
            peaks = {}
        for i, (peak, capacity) in peaks.items():
            old = self.peaks.get(i, (0.0, None))
            self.peaks[i] = (max(old[0], peak), capacity or old[1])

    def rows(self, batch_size: int | None, state_bytes: float) -> list[dict[str, Any]]:
        """Per device: ``peak_bytes``, ``capacity_bytes`` and, where known, ``fits_batch`` and ``fits_from``.

        ``fits_batch`` is the plan's size where a plan was given, else a
        linear estimate from the peak at ``batch_size`` (the micro-batch size
        in use; the memory grows with the batch, the ``state_bytes`` do not).
        """
        out = []
        for i, (peak, capacity) in sorted(self.peaks.items()):
            row: dict[str, Any] = {"device": i, "peak_bytes": int(peak), "capacity_bytes": capacity}
            if self.plan_size:
                row["fits_batch"], row["fits_from"] = self.plan_size, "plan"
            elif capacity and batch_size and peak > 0:
                per_sample = max(1.0, (peak - state_bytes) / batch_size)
                row["fits_batch"] = max(0, int(((1 - MARGIN) * capacity - state_bytes) // per_sample))
                row["fits_from"] = "estimate (linear in the batch, 10% margin)"
            out.append(row)
        return out


__all__ = ["Headroom"]
