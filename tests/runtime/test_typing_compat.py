"""``override`` on every supported Python, also without typing_extensions."""

from __future__ import annotations

import builtins
import importlib
import sys

from keras_gpu_tools.runtime import typing_compat


def test_override_marks_the_method():
    def hook(self):
        return 1

    assert typing_compat.override(hook) is hook and hook.__override__ is True


def test_without_typing_extensions_a_marking_decorator_stands_in(monkeypatch):
    if sys.version_info >= (3, 12):  # typing.override: nothing to fall back from
        return
    real_import = builtins.__import__

    def no_typing_extensions(name, *args, **kwargs):
        if name == "typing_extensions":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_typing_extensions)
    try:
        fallback = importlib.reload(typing_compat)

        def hook(self):
            return 1

        assert fallback.override(hook) is hook and hook.__override__ is True
        assert fallback.override(property(hook)) is not None  # an object without attributes passes unchanged
    finally:
        monkeypatch.undo()
        importlib.reload(typing_compat)
