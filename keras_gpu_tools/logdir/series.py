"""A metric over time whose memory is bounded: exact figures, a bounded sample of its points.

A long run logs a GPU's figures a million times; the report needs their min, mean, max and last
value (exact, computed as the points stream by) and a plot, for which a few thousand points are
plenty. `Series` keeps every `stride`-th point (the first and the last always) and doubles the
stride whenever more than `MAX_POINTS` are kept, so which points are kept depends only on how many
there are: deterministic, the same whether the points come one by one or in chunks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

#: Points kept per series for the plots: between half of this and this (plus the last point).
MAX_POINTS = 2048


@dataclasses.dataclass
class Series:
    """One metric over time: wall-clock seconds, the training step, the value.

    ``wall``, ``steps`` and ``values`` hold the kept points (every ``stride``-th of ``count``
    points, and the last); `stats()` is exact over all of them.
    """

    key: str
    wall: list[float] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)
    values: list[float] = dataclasses.field(default_factory=list)
    count: int = 0  # points added (or kept from another series, see `merge`)
    n: int = 0  # points that `stats()` covers
    stride: int = 1  # every stride-th point (index 0, stride, 2 stride, ...) is kept
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")
    _tail: bool = False  # the last kept point is there only as the last (its index is not a multiple)

    def add(self, wall: float, step: int, value: float) -> None:
        self.extend([float(wall)], [int(step)], [float(value)])

    def extend(self, wall: Sequence[float], steps: Sequence[int], values: Sequence[float]) -> None:
        """Adds points in order (the three sequences of the same length)."""
        if not values:
            return
        self._count_in(values)
        self._keep(
            len(values), lambda first, stride: (wall[first::stride], steps[first::stride], values[first::stride])
        )

    def extend_points(self, points: Sequence[tuple[float, int, float]]) -> None:
        """Adds ``(wall, step, value)`` points in order; those whose value is not finite are left out."""
        values = [p[2] for p in points]
        if not math.isfinite(sum(values)):  # NaN or infinities among them (rare): left out
            points = [p for p in points if math.isfinite(p[2])]
            values = [p[2] for p in points]
        if not values:
            return
        self._count_in(values)

        def take(first: int, stride: int):
            kept = points[first::stride]
            return [p[0] for p in kept], [p[1] for p in kept], [p[2] for p in kept]

        self._keep(len(points), take)

    def merge(self, other: Series, step_offset: int = 0) -> None:
        """Adds the points of `other` (another run's): its kept points, and its exact figures."""
        if not other.values:
            return
        steps = [s + step_offset for s in other.steps]
        self._keep(
            len(other.values),
            lambda first, stride: (other.wall[first::stride], steps[first::stride], other.values[first::stride]),
        )
        self.n, self.total = self.n + other.n, self.total + other.total
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)

    def _count_in(self, values: Sequence[float]) -> None:
        self.n += len(values)
        self.total = sum(values, self.total)  # in order: the sum a single pass over every point gives
        self.low, self.high = min(self.low, min(values)), max(self.high, max(values))

    def _keep(self, n: int, take: Callable[[int, int], tuple[Sequence, Sequence, Sequence]]) -> None:
        """Keeps the multiples of the stride among the next ``n`` points (``take(first, stride)`` slices them).

        The stride is first raised to what the new count needs (the kept points thinned to its
        multiples), so a long chunk is sliced once, never appended whole and then thinned.
        """
        if self._tail:
            self._drop_last()
        count = self.count + n
        while -(-count // self.stride) > MAX_POINTS:  # points that are multiples of the stride, from index 0
            del self.wall[1::2], self.steps[1::2], self.values[1::2]
            self.stride *= 2
        first = -self.count % self.stride  # the first index of this chunk that is a multiple of the stride
        wall, steps, values = take(first, self.stride)
        self.wall += wall
        self.steps += steps
        self.values += values
        self.count = count
        self._tail = (count - 1) % self.stride != 0
        if self._tail:
            last_wall, last_steps, last_values = take(n - 1, 1)
            self.wall += last_wall
            self.steps += last_steps
            self.values += last_values

    def _drop_last(self) -> None:
        del self.wall[-1], self.steps[-1], self.values[-1]

    @property
    def sampled(self) -> bool:
        """Whether points were left out of ``values`` (the plots say so)."""
        return self.n > len(self.values)

    def stats(self) -> tuple[float, float, float, float]:
        """min, mean, max and last value, over every point added."""
        return self.low, self.total / self.n, self.high, self.values[-1]
