"""A robust growth rate: Theil-Sen's estimator (the median of the slopes between every pair of points).

One point far off (a garbage collection, an allocator handing memory back)
moves a least-squares line; it barely moves the median of pairwise slopes.
The points are thinned to ``MAX_POINTS`` evenly spaced ones first, so that the
cost stays the same however many epochs a fit has.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

MAX_POINTS = 24  # at most 276 pairs: a few tens of microseconds


@dataclasses.dataclass(frozen=True)
class Slope:
    """A growth rate and how consistently the points rise."""

    per_unit: float  # units of y per unit of x (MiB per epoch, MiB per fit)
    rising: float  # share of the pairwise slopes that are positive (0..1): ~0.5 for noise, ~1 for steady growth
    points: int  # the points it was computed from (before thinning)


def evenly(n: int, m: int = MAX_POINTS) -> list[int]:
    """``m`` indices of ``range(n)`` spread evenly, the first and last included (all of them where ``n <= m``)."""
    if n <= m:
        return list(range(n))
    return sorted({round(i * (n - 1) / (m - 1)) for i in range(m)})


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> Slope | None:
    """The median slope over every pair of points with distinct x (None with fewer than 2 of them)."""
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length: {len(xs)} and {len(ys)}")
    keep = evenly(len(xs))
    px, py = [float(xs[i]) for i in keep], [float(ys[i]) for i in keep]
    slopes = [
        (py[j] - py[i]) / (px[j] - px[i]) for i in range(len(px)) for j in range(i + 1, len(px)) if px[j] != px[i]
    ]
    if not slopes:
        return None
    return Slope(statistics.median(slopes), sum(s > 0 for s in slopes) / len(slopes), len(xs))
