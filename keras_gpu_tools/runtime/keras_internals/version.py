"""The installed Keras version against the tested range, and the error raised where an internal has changed."""

from __future__ import annotations

import warnings

from keras_gpu_tools.errors import KerasInternalsError, KerasVersionWarning
from keras_gpu_tools.runtime.keras_internals.registry import TESTED, TESTED_KERAS

_version_warned = False


def keras_version() -> str:
    try:
        import keras

        return keras.__version__
    except Exception:  # pragma: no cover - keras is a requirement
        return "unknown"


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def check_keras_version(version: str | None = None) -> bool:
    """Warns once per process when Keras is outside :data:`TESTED_KERAS`; returns whether it is inside."""
    global _version_warned
    v = version or keras_version()
    low, high = _version_tuple(TESTED_KERAS[0]), _version_tuple(TESTED_KERAS[-1])
    inside = v != "unknown" and low <= _version_tuple(v) <= high
    if not inside and not _version_warned:
        _version_warned = True
        warnings.warn(
            f"keras_gpu_tools relies on Keras internals checked with keras {TESTED_KERAS[0]} to {TESTED_KERAS[-1]}; "
            f"this is keras {v}. It fails with a clear error where an internal has changed; please report it.",
            KerasVersionWarning,
            stacklevel=3,
        )
    return inside


def internals_error(what: str) -> KerasInternalsError:
    """The error for a Keras internal that this Keras does not have, naming its version and the one checked."""
    return KerasInternalsError(
        f"keras_gpu_tools relies on a Keras internal that this Keras ({keras_version()}) "
        f"does not have: {what}. It was written against keras {TESTED}; "
        "please report this with your Keras version."
    )
