"""The categories of a verdict, by the thresholds of TensorBoard's input-pipeline analyzer (xprof)."""

from __future__ import annotations

HIGH = "highly input-bound"
MODERATE = "moderately input-bound"
NOT = "not input-bound"
UNKNOWN = "unknown"

# TensorBoard's input-pipeline analyzer (xprof): >= 20 % HIGHLY, >= 5 % MODERATELY.
XPROF_HIGH = 0.20
XPROF_MODERATE = 0.05


def classify(wait_fraction: float | None, moderate: float = XPROF_MODERATE, high: float = XPROF_HIGH) -> str:
    if wait_fraction is None:
        return UNKNOWN
    if wait_fraction >= high:
        return HIGH
    if wait_fraction >= moderate:
        return MODERATE
    return NOT
