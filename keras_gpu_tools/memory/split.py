"""The split policy: in how many micro-batches a batch runs, before and after an out-of-memory error.

:class:`SplitController` decides it: after an out-of-memory error the split
doubles (2, 4, 8, ...) until a micro-batch would be smaller than
``min_batch_size``; later batches start at the micro-batch size that worked;
with ``regrow_after`` a smaller split is tried again after that many good
steps. Nothing here knows about Keras or a framework.
"""

from __future__ import annotations

import math


def split_sizes(n: int, k: int, granule: int = 1) -> list[int]:
    """Sizes of ``k`` micro-batches of a batch of ``n`` (as even as possible, larger first).

    Under data parallelism over ``granule`` devices (or replicas) each
    device's share of the batch is split, so every micro-batch is a multiple
    of ``granule``: ``granule`` times the split of ``n / granule``.
    """
    if n < 1 or k < 1:
        raise ValueError(f"split_sizes needs n >= 1 and k >= 1, got n={n}, k={k}")
    if granule > 1 and n % granule == 0:
        return [granule * size for size in split_sizes(n // granule, k)]
    k = min(k, n)
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def describe_split(n: int, k: int, granule: int = 1) -> str:
    sizes = split_sizes(n, k, granule)
    if len(set(sizes)) == 1:
        return f"{len(sizes)} x {sizes[0]}"
    counts: dict[int, int] = {}
    for s in sizes:
        counts[s] = counts.get(s, 0) + 1
    return " + ".join(f"{c} x {s}" for s, c in sorted(counts.items(), reverse=True))


class SplitController:
    """Chooses the split of each batch; knows nothing of models.

    The state is the micro-batch size that works (``None`` until an
    out-of-memory error). A batch of ``n`` runs as ``ceil(n / micro_size)``
    micro-batches, so the last, smaller batch of an epoch keeps the same
    micro-batch size. No micro-batch is ever smaller than ``min_batch_size``:
    where a batch cannot be split into micro-batches of at most
    ``micro_size`` that are all at least ``min_batch_size``, it runs as the
    fewest micro-batches that respect the minimum (or whole).

    Args:
        min_batch_size: the smallest micro-batch to try. Defaults to `1`.
        regrow_after: after this many good steps at a split, try half as many
            micro-batches again (a failure doubles the wait). `None` never
            regrows. Defaults to `None`.
        max_micro_size: the largest micro-batch known to fit (a batch-size
            plan): batches above it start split, and regrowing never goes
            past it. `None` for no limit. Defaults to `None`.
    """

    def __init__(self, min_batch_size: int = 1, regrow_after: int | None = None, max_micro_size: int | None = None):
        self.min_batch_size = max(1, int(min_batch_size))
        self.regrow_after = regrow_after
        self.max_micro_size = max_micro_size
        self.micro_size: int | None = None  # None: whole batches (or the plan's size)
        self._good_steps = 0
        self._regrow_wait = regrow_after
        self._trial_from: int | None = None  # micro size before a regrow trial
        self.granule = 1  # data-parallel devices: set per fit by the callback

    def _most(self, n: int) -> int:
        """The most micro-batches a batch of ``n`` may run as: each at least ``min_batch_size``, one sample per device."""
        return max(1, min(n // self.min_batch_size, n // max(1, self.granule)))

    def split_for(self, n: int) -> int:
        """Micro-batches for a batch of ``n`` (1 = unsplit), regrow trials included."""
        micro = self.micro_size if self.micro_size is not None else self.max_micro_size
        if micro is None or n <= micro:
            return 1
        return min(n, math.ceil(n / micro), self._most(n))

    def next_split(self, n: int, k: int) -> int | None:
        """The split to try after ``k`` micro-batches of a batch of ``n`` ran out of memory.

        Twice as many micro-batches, and in any case a largest micro-batch
        strictly smaller than the one that failed; None where that would
        need a micro-batch below ``min_batch_size``.
        """
        failed = math.ceil(n / k)  # the largest micro-batch of the failed attempt
        if failed <= 1:
            return None
        target = min(math.ceil(n / (2 * k)), failed - 1)  # the largest micro-batch at twice the split
        nxt = math.ceil(n / target)  # the fewest micro-batches with that largest one
        most = self._most(n)
        if nxt > most:
            # As small as the minimum allows, if that is still smaller than what failed.
            if math.ceil(n / most) >= failed:
                return None
            nxt = math.ceil(n / math.ceil(n / most))
        return nxt

    def on_oom(self, n: int, k: int) -> int | None:
        """Records a failure at ``k``; returns the next split, or None to give up."""
        self._good_steps = 0
        if self._trial_from is not None:  # a regrow trial failed: back to what worked
            self.micro_size = self._trial_from
            self._trial_from = None
            if self.regrow_after is not None:
                self._regrow_wait = 2 * (self._regrow_wait or self.regrow_after)
            return self.split_for(n)
        nxt = self.next_split(n, k)
        if nxt is not None:
            self.micro_size = math.ceil(n / nxt)
        return nxt

    @property
    def in_trial(self) -> bool:
        return self._trial_from is not None

    def on_success(self, n: int, k: int) -> None:
        if self._trial_from is not None:
            self._trial_from = None
            self._regrow_wait = self.regrow_after
        self._good_steps += 1
        if (
            self.regrow_after is not None
            and self.micro_size is not None
            and self._good_steps >= (self._regrow_wait or self.regrow_after)
        ):
            self._good_steps = 0
            grown = 2 * self.micro_size  # half as many micro-batches
            if self.max_micro_size is not None:
                grown = min(grown, self.max_micro_size)  # never past the plan
            if grown > self.micro_size:
                self._trial_from = self.micro_size
                self.micro_size = grown

    def reset(self) -> None:
        self.micro_size = None
        self._good_steps = 0
        self._regrow_wait = self.regrow_after
        self._trial_from = None
