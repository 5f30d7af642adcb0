"""Which calls of the train function the detector syncs and times in full, and whose fetch alone it times.

Steps 2-4 of the fit, every ``every``-th call, and the last call of each epoch
are synced (the last one's sync waits for work the framework dispatched ahead,
so the step intervals add up to the wall time); the first call of each epoch
takes the full path unsynced. Every ``FETCH_EVERY``-th call has its fetch timed
unsynced (JAX, torch): a synced call's fetch is flattered by the buffer that
refilled while the device drained.
"""

from __future__ import annotations

FETCH_EVERY = 25  # an unsynced call in this many has its fetch timed (JAX, torch)


def sampled(index: int, every: int, last: int) -> bool:
    """Whether call ``index`` is synced and timed in full (``last``: the epoch's last call, or -1)."""
    return index in (1, 2, 3) or (index > 0 and index % every == 0) or index == last


def next_sampled(index: int, every: int, first: int, last: int) -> int:
    """The next call from ``index`` on that takes the full path: a sampled one, or the first or last of an epoch."""
    nxt = index if index % every == 0 and index > 0 else index + every - index % every
    for k in (1, 2, 3, first, last):
        if index <= k < nxt:
            nxt = k
    return nxt


def next_fetched(index: int) -> int:
    """The next call from ``index`` on whose fetch alone is timed."""
    f = FETCH_EVERY
    return index if index % f == 0 else index + f - index % f


def epoch_calls(next_index: int, steps: int | None, steps_per_execution: int) -> tuple[int, int]:
    """(first, last) call index of an epoch of ``steps`` steps that starts at call ``next_index`` (last -1: unknown)."""
    if not steps:
        return next_index, -1
    calls = -(-int(steps) // max(steps_per_execution, 1))
    return next_index, next_index + calls - 1
