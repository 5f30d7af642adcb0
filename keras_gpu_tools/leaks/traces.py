"""The traces of a model's compiled functions, read at every epoch end without walking their closures each time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class TraceReader:
    """Reads ``backend.compiled_functions(model)``: the same counts, its compiled functions found once.

    Finding them walks the closures of the model's train/test/predict
    functions; they are found again only when one of those is replaced (a
    recompile, the test function made by the first validation, a step hook
    attached) or while none was found.
    """

    def __init__(self, backend: Any, model: Any, names: tuple[str, ...]):
        self.backend, self.model, self.names = backend, model, names
        self._functions: tuple[Any, ...] | None = None  # the model's functions when they were found (strong refs)
        self._read: Callable[[], dict[int, int] | None] | None = None

    def __call__(self) -> dict[int, int] | None:
        functions = tuple(getattr(self.model, name, None) for name in self.names)
        known = self._functions
        if self._read is None or known is None or any(a is not b for a, b in zip(functions, known)):
            self._functions, self._read = functions, self.backend.trace_counter(self.model, self.names)
        counts = self._read()
        if counts is None:
            self._read = None  # none found: looked for again next time
        return counts
