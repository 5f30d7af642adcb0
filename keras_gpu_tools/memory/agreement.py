"""What the processes of a job agree about an attempt before any of them runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Agreement:
    """What the processes of a job agreed about one attempt, before any of them ran it.

    In a job of several processes every step is one program over all their
    devices, with collectives: a process that runs out of memory before the
    collective leaves the others waiting in it for good (a real CPU job over
    gloo does; NCCL does the same). So each process first rehearses the attempt
    on one of its own devices, with no collective, and the outcomes are
    gathered through the job's coordination service (which needs no device
    memory); the attempt runs only where every process fits it.
    """

    fits: bool
    error: BaseException | None = None  # this process's own out-of-memory error in the rehearsal
    kind: str = "agreed"  # the event's kind on a process that did not run out of memory itself
    note: str = ""  # who ran out of memory, for the messages
    explanation: dict[str, Any] | None = None
