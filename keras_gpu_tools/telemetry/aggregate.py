"""Folding samples (flat ``{key: float}`` dicts) into an epoch's or a point's means, sums and maxima."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from keras_gpu_tools.telemetry.health_fields import LAST_FIELDS, SUM_FIELDS

# Keys whose epoch maximum is logged too (as `<key>_max`).
MAX_KEYS = frozenset({"memory_used_mib", "allocator_memory_mib", "power_watts", "temperature_celsius", "rss_mib"})


@functools.lru_cache(maxsize=8192)
def field_of(key: str) -> str:
    """The field of a key (``gpu/0/power_watts`` -> ``power_watts``); cached: a fit has a fixed set of keys."""
    return key.rsplit("/", 1)[-1]


class Aggregate:
    """Running count, sum and max per key."""

    __slots__ = ("count", "sums", "maxs", "counts", "last")

    def __init__(self):
        self.count = 0
        self.sums: dict[str, float] = {}
        self.maxs: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def add(self, sample: dict[str, float]) -> None:
        self.count += 1
        for key, value in sample.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + 1
            prev = self.maxs.get(key)
            self.maxs[key] = value if prev is None or value > prev else prev
        self.last = sample

    def counts_only(self) -> Aggregate:
        """A new aggregate with this one's counts per sample (energy, XID events) alone, nothing else."""
        out = Aggregate()
        for key, total in self.sums.items():
            if field_of(key) in SUM_FIELDS:
                out.sums[key], out.counts[key], out.maxs[key] = total, self.counts[key], self.maxs[key]
        return out

    def means(self) -> dict[str, float]:
        """Each key's epoch value: the mean; for counts per sample the sum, for running totals the last."""
        out = {}
        for key, total in self.sums.items():
            field = field_of(key)
            if field in SUM_FIELDS:
                out[key] = total
            elif field in LAST_FIELDS:
                out[key] = self.maxs[key]  # a running total only grows within a span
            else:
                out[key] = total / self.counts[key]
        return out

    def summary(
        self,
        max_keys: frozenset = MAX_KEYS,
        keys: Sequence[str] | None = None,
        latest: dict[str, float] | None = None,
    ) -> dict[str, float]:
        """Means, plus ``<key>_max`` for the keys where the peak matters.

        With ``keys``, exactly those keys (and their ``_max``) in that order:
        one with no value here takes its value in ``latest`` (mean and max),
        but a count per sample (energy, XID events) is 0 (what it counts is in
        the next sample, and so in the next span), or NaN where it stopped
        reporting.
        """
        means = self.means()
        if keys is None:
            out = means
            for key, peak in self.maxs.items():
                if field_of(key) in max_keys:
                    out[key + "_max"] = peak
            return out
        latest = latest or {}
        out = {}
        for key in keys:
            value = means.get(key, latest.get(key))
            if key not in means and value is not None and field_of(key) in SUM_FIELDS:
                value = value if math.isnan(value) else 0.0
            if value is not None:
                out[key] = value
        for key in keys:
            if field_of(key) in max_keys:
                value = self.maxs.get(key, latest.get(key))
                if value is not None:
                    out[key + "_max"] = value
        return out
