"""torch: a ``record_function`` range around each Keras layer's call, installed for a profiled window only.

Keras's torch backend opens no profiler range per layer, so a torch trace
cannot tell one Conv2D from another. During a window each layer's ``call``
is shadowed by an instance attribute that runs the same bound method inside
``torch.profiler.record_function("keras_layer::<path>")``; removing it puts the
class's method back. Arguments and results pass through untouched.

While torch's FLOP counter runs a step (``backends/torch/flops.py``), the
wrapper also says which layer runs (:data:`CURRENT`): forward, the innermost
layer call; backward, the layer whose call made the autograd node that runs
(each node its call made is tagged, with a hook before and after it, for that
step only). Outside a counted step it does nothing more than the range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.profiling.layer_trace import TORCH_SCOPE
from keras_gpu_tools.runtime.batches import leaves


class _Current:
    """The layer that runs now, for the FLOP counter of a counted step (one step at a time per process)."""

    def __init__(self) -> None:
        self.counting = False  # a counted step runs (set by the counter)
        self.installed = 0  # layers wrapped now
        self.forward: list[str] = []  # the layer calls open now, innermost last
        self.backward = ""  # the layer of the autograd node that runs now

    def path(self) -> str:
        """The layer path the op that runs now belongs to ("" in none)."""
        return self.backward or (self.forward[-1] if self.forward else "")


#: What the wrappers say to the FLOP counter.
CURRENT = _Current()
_TAG = "keras_gpu_tools_layer"


def _tag_backward(outputs: Any, inputs: Any, path: str) -> None:
    """Tags the autograd nodes the call made (from its outputs back to its inputs) with ``path``, innermost first."""
    import torch

    def grad_fns(tree):
        return [t.grad_fn for t in leaves(tree) if isinstance(t, torch.Tensor) and t.grad_fn is not None]

    stop, seen = set(grad_fns(inputs)), set()
    stack = grad_fns(outputs)
    while stack:
        node = stack.pop()
        if node is None or node in stop or node in seen or type(node).__name__ == "AccumulateGrad":
            continue  # (a parameter's AccumulateGrad node outlives the step: never hooked)
        seen.add(node)
        if _TAG not in node.metadata:  # an inner layer's node stays the inner layer's
            node.metadata[_TAG] = path
            node.register_prehook(lambda grads, _p=path: _enter_backward(_p))
            node.register_hook(lambda _grads_in, _grads_out: _enter_backward(""))
        stack.extend(n for n, _ in node.next_functions)


def _enter_backward(path: str) -> None:
    CURRENT.backward = path


def install(layers: Sequence[tuple[Any, str]]) -> Callable[[], None]:
    """Wraps each ``(layer, path)``'s call in its range; returns the function that takes every wrapper off."""
    import torch

    record = torch.profiler.record_function
    wrapped = []
    for layer, path in layers:
        if "call" in vars(layer):  # already shadowed (by the user, or a window not cleaned): left alone
            continue
        original, name = layer.call, TORCH_SCOPE + path

        def scoped(*args, _call=original, _name=name, _path=path, **kwargs):
            if not CURRENT.counting:
                with record(_name):
                    return _call(*args, **kwargs)
            CURRENT.forward.append(_path)
            try:
                with record(_name):
                    out = _call(*args, **kwargs)
            finally:
                CURRENT.forward.pop()
            _tag_backward(out, (args, kwargs), _path)
            return out

        scoped._keras_gpu_tools_scope = True  # type: ignore[attr-defined]
        object.__setattr__(layer, "call", scoped)  # past Keras's attribute tracking: a plain function
        wrapped.append(layer)
    CURRENT.installed += len(wrapped)

    def remove() -> None:
        for layer in wrapped:
            if getattr(vars(layer).get("call"), "_keras_gpu_tools_scope", False):
                object.__delattr__(layer, "call")
        CURRENT.installed -= len(wrapped)
        wrapped.clear()

    return remove
