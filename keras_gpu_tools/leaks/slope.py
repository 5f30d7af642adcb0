"""A robust growth rate: Theil-Sen's estimator (the median of the slopes between every pair of points).

One point far off (a garbage collection, an allocator handing memory back)
moves a least-squares line; it barely moves the median of pairwise slopes.
The points are thinned to ``MAX_POINTS`` evenly spaced ones first, so that the
cost stays the same however many epochs a fit has.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

MAX_POINTS = 24  # at most 276 pairs: a few tens of microseconds (in numpy, a few)


HALVES_FROM = 8  # points from which the earlier and later halves get slopes of their own


@dataclasses.dataclass(frozen=True)
class Slope:
    """A growth rate, how consistently the points rise, and how certain the rise is."""

    per_unit: float  # units of y per unit of x (MiB per epoch, MiB per fit)
    rising: float  # share of the pairwise slopes that are positive (0..1): ~0.5 for noise, ~1 for steady growth
    points: int  # the points it was computed from (before thinning)
    # The confidence that the slope is above 0: Mann-Kendall's test, the one behind Theil-Sen's confidence
    # interval (its lower bound is above 0 exactly when this passes). ~0.5 for noise, ~1 for a steady rise.
    confidence: float = 0.0
    early: float | None = None  # the slope of the earlier half of the points (None: too few points)
    late: float | None = None  # of the later half: a rise that levels off (a cache filling) has late << early


def confidence(increases: int, decreases: int, n: int) -> float:
    """P(slope > 0) from Mann-Kendall's S over ``n`` points (normal approximation, ties not credited)."""
    s = increases - decreases
    if n < 3 or s <= 0:
        return 0.0 if s < 0 else 0.5
    var = n * (n - 1) * (2 * n + 5) / 18
    return 0.5 * (1 + math.erf((s - 1) / math.sqrt(var) / math.sqrt(2)))  # with the continuity correction


def evenly(n: int, m: int = MAX_POINTS) -> list[int]:
    """``m`` indices of ``range(n)`` spread evenly, the first and last included (all of them where ``n <= m``)."""
    return list(_evenly(n, m))


@functools.lru_cache(maxsize=8)
def _evenly(n: int, m: int) -> tuple[int, ...]:
    """:func:`evenly`, kept for the few ``n`` of an epoch end (its rates, their halves, the epoch time read alike).

    Where ``n > m`` the spacing exceeds 1, so the rounded indices strictly rise: no duplicates, already sorted.
    """
    if n <= m:
        return tuple(range(n))
    return tuple(round(i * (n - 1) / (m - 1)) for i in range(m))


@functools.lru_cache(maxsize=MAX_POINTS + 1)
def _pairs(n: int):
    """Every pair i < j of ``range(n)``, in the order of a loop over i then j (made once per ``n``: read-only)."""
    import numpy as np

    i, j = np.triu_indices(n, 1)
    i.flags.writeable = j.flags.writeable = False
    return i, j


def _median_slope(px, py):
    """The median pairwise slope of points ``px``, ``py`` (numpy arrays), and the slopes (None: no pair)."""
    import numpy as np

    i, j = _pairs(len(px))  # every pair i < j, in the order of a loop over i then j
    dx, dy = px[j] - px[i], py[j] - py[i]
    if not dx.all():  # (points of one x: only the pairs of distinct x count)
        distinct = dx != 0
        dx, dy = dx[distinct], dy[distinct]
    slopes = dy / dx  # IEEE division: the figures of a loop in Python
    n = len(slopes)
    if not n:
        return None, slopes
    # Slopes that compare equal are the same float but 0.0 and -0.0: any sort gives the same middle unless it is
    # a zero, and then the stable sort's order (sorted()'s) says which zero it is.
    ordered, mid = np.sort(slopes), n // 2
    if ordered[mid] == 0 or ordered[mid - 1] == 0:
        ordered = np.sort(slopes, kind="stable")
    median = float(ordered[mid]) if n % 2 else (float(ordered[mid - 1]) + float(ordered[mid])) / 2  # statistics'
    return median, slopes


def theil_sen(xs: Sequence[float], ys: Sequence[float], halves: bool = True) -> Slope | None:
    """The median slope over every pair of points with distinct x (None with fewer than 2 of them).

    With its confidence (Mann-Kendall) and, from `HALVES_FROM` points, the slopes of the two halves
    (``halves=False``: not computed, ``early`` and ``late`` None; the rest the same, at a third of the work).
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length: {len(xs)} and {len(ys)}")
    import numpy as np

    px, py = _kept(xs), _kept(ys)
    median, slopes = _median_slope(px, py)
    if median is None:
        return None
    up, down = int(np.count_nonzero(slopes > 0)), int(np.count_nonzero(slopes < 0))
    early, late = _halves(px, py) if halves else (None, None)
    return Slope(median, up / len(slopes), len(xs), confidence(up, down, len(px)), early, late)


def _kept(values: Sequence[float]):
    """The evenly spaced ``MAX_POINTS`` of ``values`` (all where there are no more) as a float64 array."""
    import numpy as np

    if len(values) <= MAX_POINTS:  # (float64 from each value, as float() makes it)
        return np.array(values, dtype=np.float64)
    return np.array([float(values[i]) for i in _evenly(len(values), MAX_POINTS)])


def with_halves(s: Slope, xs: Sequence[float], ys: Sequence[float]) -> Slope:
    """``s``, made by ``theil_sen(xs, ys, halves=False)``, with its halves' slopes: ``theil_sen(xs, ys)`` exactly."""
    early, late = _halves(_kept(xs), _kept(ys))
    return dataclasses.replace(s, early=early, late=late)


def _halves(px, py) -> tuple[float | None, float | None]:
    """The median slopes of the earlier and later halves of the kept points (None, None: under `HALVES_FROM`)."""
    if len(px) < HALVES_FROM:
        return None, None
    half = len(px) // 2
    early, _ = _median_slope(px[: half + 1], py[: half + 1])  # the middle point in both halves
    late, _ = _median_slope(px[half:], py[half:])
    return early, late
