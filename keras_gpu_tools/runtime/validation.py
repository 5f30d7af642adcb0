"""Argument checks shared by every callback, with Keras-style messages.

Each ``check_*`` function validates one constructor argument and returns it
normalised (an ``int``, a ``float``, a ``bool``, a ``str`` path), or raises
``ValueError``/``TypeError`` with a message naming the argument, the value
received and what is expected::

    Invalid value for argument `interval`. Received: interval=inf. Expected a
    finite number of seconds > 0 and <= 3600.

A wrong type is a ``TypeError`` for flags, paths, names and collections; for
numbers it is a ``ValueError``, like a number out of range (what the callbacks
raised before these checks were shared). Nothing here imports a framework or
numpy: numpy scalars are recognised by duck typing.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, overload

T = TypeVar("T")

# Paths on remote file systems: not checked here, the writer reports problems.
REMOTE_PREFIXES = ("gs://", "s3://", "hdfs://")


def _error(cls: type[Exception], name: str, value: Any, expected: str, detail: str = "") -> Exception:
    return cls(f"Invalid value for argument `{name}`. Received: {name}={value!r}{detail}. Expected {expected}.")


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, numbers.Integral) else format(x, "g")


def _is_bool(value: Any) -> bool:
    # numpy.bool_ is no subclass of bool; recognised without importing numpy.
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


def _bounds(low, high, exclusive_low: bool, exclusive_high: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if exclusive_low else '>='} {_fmt(low)}")
    if high is not None:
        parts.append(f"{'<' if exclusive_high else '<='} {_fmt(high)}")
    return " and ".join(parts)


# -- numbers -----------------------------------------------------------------------------
def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None, allow_none: bool = False):
    """An integer (numpy integers too; not a bool, not a float) in ``[low, high]``; returns an ``int``."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Integral) and not _is_bool(value)
    if ok and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    if low == 1 and high is None:
        expected = "a positive integer"
    else:
        bounds = _bounds(low, high, False, False)
        expected = f"an integer {bounds}" if bounds else "an integer"
    raise _error(ValueError, name, value, expected + (" or None" if allow_none else ""))


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    finite: bool = True,
    exclusive_low: bool = False,
    exclusive_high: bool = False,
    allow_none: bool = False,
    what: str = "number",
):
    """A real number (not a bool, not a string) within the bounds; returns a ``float``.

    ``what`` names the quantity in the message ("number of seconds"). NaN is
    always rejected; infinities unless ``finite=False``.
    """
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Real) and not _is_bool(value)
    if ok:
        x = float(value)
        ok = not math.isnan(x) and (math.isfinite(x) or not finite)
        if ok and low is not None:
            ok = x > low if exclusive_low else x >= low
        if ok and high is not None:
            ok = x < high if exclusive_high else x <= high
        if ok:
            return x
    bounds = _bounds(low, high, exclusive_low, exclusive_high)
    expected = f"{'a finite' if finite else 'a'} {what}" + (f" {bounds}" if bounds else "")
    raise _error(ValueError, name, value, expected + (" or None" if allow_none else ""))


# -- flags and choices -------------------------------------------------------------------
def check_bool(name: str, value: Any) -> bool:
    """``True`` or ``False`` (numpy bools too); not a truthy string or number."""
    if _is_bool(value):
        return bool(value)
    raise _error(TypeError, name, value, "True or False")


def check_verbose(name: str, value: Any, *, max_level: int = 2) -> int:
    """A verbosity like Keras's: 0 (silent), 1, 2 or a bool; returns an ``int``."""
    if _is_bool(value):
        return int(bool(value))
    if isinstance(value, numbers.Integral) and 0 <= int(value) <= max_level:
        return int(value)
    levels = ", ".join(str(i) for i in range(max_level + 1))
    raise _error(ValueError, name, value, f"{levels} or a bool")


def check_choice(name: str, value: Any, choices: Sequence[T]) -> T:
    """One of ``choices``, of the same type (1 is not True, "1" is not 1); returns the choice."""
    if _is_bool(value):
        value = bool(value)
    for choice in choices:
        # 1 == True and "1" != 1: compare only within the same kind; and an
        # array-like value must not raise from `==`.
        if isinstance(choice, bool) != isinstance(value, bool) or isinstance(choice, str) != isinstance(value, str):
            continue
        try:
            if bool(value == choice):
                return choice
        except Exception:
            continue
    raise _error(ValueError, name, value, "one of " + ", ".join(repr(c) for c in choices))


def check_choices(name: str, value: Any, choices: Sequence[str]) -> list[str]:
    """A list (any iterable but a string) of values from ``choices``."""
    expected = f"a list of values from {list(choices)}"
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _error(TypeError, name, value, expected)
    items = list(value)
    for item in items:
        if not isinstance(item, str) or item not in choices:
            raise _error(ValueError, name, items, expected, f"; {item!r} is not one of them")
    return items


def check_callable(
    name: str, value: Any, *, allow_none: bool = True, what: str = "a function"
) -> Callable[..., Any] | None:
    if (value is None and allow_none) or callable(value):
        return value
    raise _error(TypeError, name, value, what + (", or None" if allow_none else ""))


# -- paths -------------------------------------------------------------------------------
@overload
def check_log_dir(name: str, value: Any, *, allow_none: Literal[False]) -> str: ...
@overload
def check_log_dir(name: str, value: Any, *, allow_none: bool = True) -> str | None: ...
def check_log_dir(name: str, value: Any, *, allow_none: bool = True) -> str | None:
    """A log directory, existing or to be created; returns it as a ``str``. Creates nothing.

    Accepts a ``str`` or an ``os.PathLike`` of ``str`` (``None`` where
    ``allow_none``). Rejects bytes paths, an empty path, a NUL, an existing
    file, and a path whose nearest existing parent is not a writable
    directory. Remote paths (``gs://``, ``s3://``, ``hdfs://``) are passed
    through.
    """
    if value is None:
        if allow_none:
            return None
        raise _error(ValueError, name, value, "a directory to write to (a str or os.PathLike)")
    try:
        path = os.fspath(value)
    except TypeError:
        raise _error(
            TypeError, name, value, "a path (str or os.PathLike) or None", f" of type {type(value).__name__}"
        ) from None
    if isinstance(path, bytes):
        raise _error(
            TypeError,
            name,
            value,
            "a str path or an os.PathLike of str; decode it first, e.g. with os.fsdecode()",
            ", a bytes path",
        )
    if not path:
        raise _error(ValueError, name, value, "a non-empty path (use '.' for the current directory)")
    if "\0" in path:
        raise _error(ValueError, name, value, "a path without NUL characters")
    if path.startswith(REMOTE_PREFIXES):
        return path
    probe = os.path.abspath(path)
    if os.path.exists(probe) and not os.path.isdir(probe):
        raise _error(ValueError, name, path, "a directory (existing or to be created)", ", which is a file")
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise _error(
            ValueError,
            name,
            path,
            "a directory this process can create and write to",
            f", but {probe!r} is not a writable directory",
        )
    return path


def check_run_name(name: str, value: Any) -> str:
    """The name of one directory: a TensorBoard run under the log directory."""
    expected = "a non-empty directory name without path separators, such as 'gpu'"
    if not isinstance(value, str):
        raise _error(TypeError, name, value, expected)
    seps = [s for s in (os.sep, os.altsep) if s]
    problem = ""
    if not value:
        problem = ", an empty name"
    elif value in (".", ".."):
        problem = ", which names no directory of its own"
    elif "\0" in value:
        problem = ", which holds a NUL character"
    elif any(s in value for s in seps):
        problem = ", which holds a path separator"
    elif value != value.strip():
        problem = ", which starts or ends with whitespace"
    if problem:
        raise _error(ValueError, name, value, expected, problem)
    return value


def check_run_dir(
    log_dir: str | None, run_name: str, *, log_dir_name: str = "log_dir", run_name_name: str = "run_name"
) -> str | None:
    """``log_dir/run_name``, checked to be a directory or creatable; None without a log directory.

    Run after :func:`check_log_dir` and :func:`check_run_name`. A file (or a
    dangling link) in the run directory's place would make the writer fail
    in ``on_train_begin``, once training has been set up.
    """
    if log_dir is None:
        return None
    if log_dir.startswith(REMOTE_PREFIXES):
        return os.path.join(log_dir, run_name)
    run_dir = os.path.join(log_dir, run_name)
    problem = ""
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        problem = "exists and is not a directory"
    elif os.path.isdir(run_dir) and not os.access(run_dir, os.W_OK | os.X_OK):
        problem = "is a directory this process cannot write to"
    if problem:
        raise ValueError(
            f"Invalid value for arguments `{log_dir_name}` and `{run_name_name}`. "
            f"Received: {log_dir_name}={log_dir!r}, {run_name_name}={run_name!r}, but {run_dir!r} {problem}. "
            f"Expected a run directory that does not exist yet or is a writable directory "
            f"(remove the file or choose another `{run_name_name}`)."
        )
    return run_dir


# -- collections -------------------------------------------------------------------------
@overload
def check_pairs(
    name: str,
    value: Any,
    *,
    fields: tuple[str, str] = ...,
    lows: tuple[int, int] = ...,
    non_empty: bool = ...,
    allow_none: Literal[False] = ...,
) -> list[tuple[int, int]]: ...
@overload
def check_pairs(
    name: str,
    value: Any,
    *,
    fields: tuple[str, str] = ...,
    lows: tuple[int, int] = ...,
    non_empty: bool = ...,
    allow_none: bool,
) -> list[tuple[int, int]] | None: ...
def check_pairs(
    name: str,
    value: Any,
    *,
    fields: tuple[str, str] = ("start_step", "num_steps"),
    lows: tuple[int, int] = (0, 1),
    non_empty: bool = False,
    allow_none: bool = False,
) -> list[tuple[int, int]] | None:
    """A list of integer pairs, such as ``[(start_step, num_steps), ...]``; returns a list of tuples."""
    if value is None and allow_none:
        return None
    expected = f"a list of ({', '.join(fields)}) pairs" + (" or None" if allow_none else "")
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _error(TypeError, name, value, expected)
    items = list(value)
    shown = value if isinstance(value, (list, tuple)) else items  # an iterator's items, not the iterator
    if non_empty and not items:
        raise _error(ValueError, name, shown, f"at least one ({', '.join(fields)}) pair")
    out = []
    for item in items:
        pair = None
        if not isinstance(item, (str, bytes)) and isinstance(item, Iterable):
            pair = tuple(item)
        if pair is None or len(pair) != 2:
            raise _error(ValueError, name, shown, expected, f"; entry {item!r} is not a pair")
        for field, x, low in zip(fields, pair, lows):
            if not isinstance(x, numbers.Integral) or _is_bool(x) or x < low:
                raise _error(ValueError, name, shown, f"an integer >= {low}", f"; {field}={x!r} in {item!r}")
        out.append((int(pair[0]), int(pair[1])))
    return out


def check_devices(name: str, value: Any) -> list[int | str] | None:
    """GPUs to use: a list of indices (ints >= 0, as the framework numbers them) or UUID strings, or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, numbers.Number)) or not isinstance(value, Iterable):
        raise _error(
            TypeError,
            name,
            value,
            "a list of GPU indices (ints, as the framework numbers them) or UUID strings, or None",
        )
    items = list(value)
    for d in items:
        ok = (isinstance(d, numbers.Integral) and not _is_bool(d) and int(d) >= 0) or (isinstance(d, str) and d != "")
        if not ok:
            raise _error(
                ValueError,
                name,
                items,
                "GPU indices >= 0 or UUID strings such as 'GPU-5c2f...'",
                f"; entry {d!r} is not valid",
            )
    return [int(d) if isinstance(d, numbers.Integral) else d for d in items]


__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_choices",
    "check_devices",
    "check_int",
    "check_log_dir",
    "check_number",
    "check_pairs",
    "check_run_dir",
    "check_run_name",
    "check_verbose",
]
