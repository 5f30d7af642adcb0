"""What the OOM reducer records: one :class:`OOMEvent` per out-of-memory error, and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.memory.split import describe_split


@dataclass
class OOMEvent:
    """One out-of-memory error that was recovered from (or not)."""

    step: int  # global step (train-function call) of the failed attempt
    batch_size: int
    failed_split: int  # micro-batches in the attempt that failed
    next_split: int | None  # the split tried next (None: gave up)
    kind: str  # backend of the error
    regrow: bool = False  # the failed attempt was a regrow trial
    seconds: float = 0.0  # time of the failed attempt
    phase: str = "train"  # "train", "test" (evaluate() and validation) or "predict"
    explanation: dict[str, Any] | None = None  # why (OOMExplanation.as_dict()), where it could be told
    granule: int = 1  # data-parallel devices (replicas): each one's share is split, see split_sizes
    # seconds of each part of the attempt: "agree", "predict", "protect" (the state's copy), "run" (to the
    # error), "explain", "free" (the failed step's memory), "restore" (the state put back)
    phases: dict[str, float] = field(default_factory=dict)

    def why(self) -> list[str]:
        """The explanation's readable lines (empty where none was recorded)."""
        return list((self.explanation or {}).get("lines") or [])

    def line(self) -> str:
        where = {"test": "evaluation step", "predict": "prediction step"}.get(self.phase, "step")
        what = f"out of memory at batch {self.batch_size}"
        if self.failed_split > 1:
            what += f" (as {describe_split(self.batch_size, self.failed_split, self.granule)})"
        if self.kind == "predicted":
            what = "predicted " + what
        if self.next_split is None:
            return f"{where} {self.step}: {what}; no smaller split is allowed"
        if self.regrow:
            return f"{where} {self.step}: {what} while trying a smaller split; back to {describe_split(self.batch_size, self.next_split, self.granule)}"
        return (
            f"{where} {self.step}: {what}, retrying as {describe_split(self.batch_size, self.next_split, self.granule)}"
        )
