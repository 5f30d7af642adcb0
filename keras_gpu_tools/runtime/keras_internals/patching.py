"""Setting an attribute on one object for the duration of a block, and putting back what was there."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def patched(obj, name: str, value):
    """``obj.<name> = value`` while the block runs (nothing where ``value`` is None); the instance's own attribute after."""
    if value is None:
        yield
        return
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        if had:
            object.__setattr__(obj, name, old)
        else:
            try:
                object.__delattr__(obj, name)
            except AttributeError:
                pass
