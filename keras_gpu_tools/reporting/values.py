"""Numbers as the report keeps them: finite floats, or None."""

from __future__ import annotations

import math
from typing import Any


def finite(v: Any) -> float | None:
    """`v` as a float; None when it is not a number or not finite."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def floats(figures: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of `figures`, as floats."""
    return {str(k): float(v) for k, v in figures.items() if finite(v) is not None}
