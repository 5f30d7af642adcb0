"""How the package writes sizes and durations in messages, advice and reports.

One form for each unit: bytes in binary units (``"1.5 GiB"``, ``"512 B"``),
durations in milliseconds with two decimals (``"12.34 ms"``) and seconds with
two (``"3.21 s"``), plain figures and rates with four significant digits and
thousands separators, never in scientific notation (``"38,650 samples/s"``,
``"0.25"``). A figure that is not known is written ``"n/a"`` (``"unknown"``
for a size). `format_metric` writes a logged figure in the unit its key names.
"""

from __future__ import annotations

import math

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


def format_number(x: float | None, digits: int = 4, decimals: int | None = None) -> str:
    """A figure with no unit, never in scientific notation, its thousands separated.

    ``digits`` significant digits, every digit of the whole part kept (``38650.2`` ->
    ``"38,650"``, ``0.2512`` -> ``"0.2512"``, ``93.40`` -> ``"93.4"``), or ``decimals`` places
    exactly (``format_number(1234.5, decimals=1)`` -> ``"1,234.5"``). ``"n/a"`` for None or NaN.
    """
    if x is None or math.isnan(x):
        return MISSING
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if decimals is not None:
        return f"{x:,.{decimals}f}"
    if x == 0:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def format_rate(per_second: float | None, what: str) -> str:
    """A rate: ``format_rate(38650.2, "samples")`` -> ``"38,650 samples/s"``, or ``"n/a"``."""
    return MISSING if per_second is None else f"{format_number(per_second)} {what}/s"


def format_flops(per_second: float | None) -> str:
    """A FLOP rate in the largest decimal unit below it: ``"312.40 TFLOP/s"``, or ``"n/a"``."""
    if per_second is None:
        return MISSING
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if per_second >= scale:
            return f"{per_second / scale:.2f} {unit}FLOP/s"
    return f"{format_number(per_second)} FLOP/s"


def format_metric(key: str, value: float | None) -> str:
    """A logged figure, written in the unit its key names (``input/wait_ms``, ``throughput/samples_per_sec``).

    ``_ms``: milliseconds; ``_seconds``: seconds; ``_fraction`` and ``mfu``: a percentage;
    ``_percent``: a percentage already; ``_mib``: a size; ``flops_per_sec``: a FLOP rate;
    ``<what>_per_sec``: a rate of ``<what>``; anything else a plain number (`format_number`).
    """
    if value is None or not math.isfinite(value):
        return MISSING
    name = key.rsplit("/", 1)[-1]
    if name.endswith("_ms"):
        return format_milliseconds(value)
    if name.endswith("_seconds"):
        return format_seconds(value)
    if name.endswith("_fraction") or name == "mfu":
        return format_percent(value)
    if name.endswith("_percent"):
        return f"{value:.1f}%"
    if name.endswith("_mib"):
        return format_bytes(value * 2**20)
    if "flops_per_sec" in name:
        return format_flops(value) + (" per device" if name.endswith("_per_device") else "")
    if name.endswith("_per_sec"):
        return format_rate(value, name[: -len("_per_sec")].replace("_", " "))
    return format_number(value)
