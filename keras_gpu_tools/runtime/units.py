"""How the package writes sizes and durations in messages, advice and reports.

One form for each unit: bytes in binary units (``"1.5 GiB"``, ``"512 B"``),
durations in milliseconds with two decimals (``"12.34 ms"``) and seconds with
two (``"3.21 s"``). A figure that is not known is written ``"n/a"``
(``"unknown"`` for a size).
"""

from __future__ import annotations

#: What an unknown duration is written as.
MISSING = "n/a"


def format_bytes(n: float | None) -> str:
    """``n`` bytes in the largest binary unit below 1024 of it: ``"512 B"``, ``"1.5 KiB"`` ... ``"2.0 TiB"``."""
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return f"{n:.1f} TiB"  # pragma: no cover


def format_milliseconds(ms: float | None, digits: int = 2) -> str:
    """A duration given in milliseconds: ``"12.34 ms"``, or ``"n/a"``."""
    return MISSING if ms is None else f"{ms:.{digits}f} ms"


def format_ms(seconds: float | None, digits: int = 2) -> str:
    """A duration given in seconds, written in milliseconds: ``"12.34 ms"``, or ``"n/a"``."""
    return format_milliseconds(None if seconds is None else 1e3 * seconds, digits)


def format_seconds(seconds: float | None, digits: int = 2) -> str:
    """A duration in seconds: ``"3.21 s"``, or ``"n/a"``."""
    return MISSING if seconds is None else f"{seconds:.{digits}f} s"


def format_percent(fraction: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.123`` -> ``"12.3%"``, or ``"n/a"``."""
    return MISSING if fraction is None else f"{100 * fraction:.{digits}f}%"
