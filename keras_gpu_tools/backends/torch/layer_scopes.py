"""torch: a ``record_function`` range around each Keras layer's call, installed for a profiled window only.

Keras's torch backend opens no profiler range per layer, so a torch trace
cannot tell one Conv2D from another. During a window each layer's ``call``
is shadowed by an instance attribute that runs the same bound method inside
``torch.profiler.record_function("keras_layer::<path>")``; removing it puts the
class's method back. Arguments and results pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.profiling.layer_trace import TORCH_SCOPE


def install(layers: Sequence[tuple[Any, str]]) -> Callable[[], None]:
    """Wraps each ``(layer, path)``'s call in its range; returns the function that takes every wrapper off."""
    import torch

    record = torch.profiler.record_function
    wrapped = []
    for layer, path in layers:
        if "call" in vars(layer):  # already shadowed (by the user, or a window not cleaned): left alone
            continue
        original, name = layer.call, TORCH_SCOPE + path

        def scoped(*args, _call=original, _name=name, **kwargs):
            with record(_name):
                return _call(*args, **kwargs)

        scoped._keras_gpu_tools_scope = True  # type: ignore[attr-defined]
        object.__setattr__(layer, "call", scoped)  # past Keras's attribute tracking: a plain function
        wrapped.append(layer)

    def remove() -> None:
        for layer in wrapped:
            if getattr(vars(layer).get("call"), "_keras_gpu_tools_scope", False):
                object.__delattr__(layer, "call")

    return remove
