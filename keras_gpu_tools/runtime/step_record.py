"""The step hook's record of one call of the train function, handed to every observer.

:class:`~keras_gpu_tools.runtime.step_hook.StepHook` fills it (times in
seconds, from the hook's clock); the input-timing statistics
(:mod:`keras_gpu_tools.input.timing`) and the callbacks read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class StepRecord:
    """One call of the train function (``steps`` training steps)."""

    index: int  # call number since the hook was installed (0 = first call)
    sampled: bool = False  # synced and timed in full
    warmup: bool = False  # compilation or first trace: left out of the statistics
    steps: int = 1
    samples: int | None = None  # examples in the call's batches, where known
    start: float | None = None  # clock at the start (after a sampled step's pre-sync)
    end: float | None = None  # clock when the call returned (after the sync if sampled)
    fetch: float | None = None  # seconds blocked fetching this call's batches
    compute: float | None = None  # seconds from fetched to done (sampled calls)
    dispatch: float | None = None  # host seconds launching the step, where told apart from compute
    gap: float | None = None  # seconds from return to the next call, less its fetch
    interval: float | None = None  # seconds from this call's start to the next's
    covers: int = 0  # steps of fast-path calls after this one, inside its interval, not measured themselves
    covered_fetch: float = 0.0  # seconds fetching, summed over the covered calls whose fetch alone was timed
    covered_fetch_steps: int = 0  # the steps of those calls
    after_sync: bool = False  # this call or the one before was synced: its fetch found a refilled buffer
    epoch_end: bool = False  # the epoch's last call (its batch may be partial)
    signature: Any = None  # shapes/dtypes of the batch (sampled calls)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # for observers
