"""PEP 562 lazy attributes for the package's `__init__` modules (no framework import)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_module(module_name: str, names: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """A module's `__getattr__` and `__dir__` that import each public name's module on first use.

    Args:
        module_name: the package's `__name__`, for the error message.
        names: public name -> the module that defines it.
        namespace: the package's `globals()`; a resolved name is stored there, so later
            lookups do not call `__getattr__` again.
    """

    def __getattr__(name: str) -> Any:
        try:
            module = names[name]
        except KeyError:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
