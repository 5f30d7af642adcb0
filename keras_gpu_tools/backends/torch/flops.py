"""The FLOPs of one torch training step: ``torch.utils.flop_counter.FlopCounterMode`` over a real step.

The detector counts the step the user trains anyway: one sampled call of the
fit, after the first of its batch shape, runs inside the counter (the count
costs that one step Python time per op, so its timing is left out like a
warm-up step's); each batch shape of Keras's train function is counted once,
and a later fit reuses the count. Nothing is repeated or added: no second forward pass,
no extra optimizer update, which a count on a copy would need (a copy of the
model, or a forward and backward pass that moves BatchNorm's statistics and
the dropout generator). The counter covers the forward and backward matmuls,
convolutions and attention torch registers formulas for; elementwise work and
the optimizer's update count nothing.

Where a profiled window's layer ranges are in place (``layer_scopes.py``), the
counter also books each op to the Keras layer that runs it, forward and
backward (:func:`layer_counter`): the layer table's FLOPs per layer, which add
up to the step's count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SOURCE = "torch FlopCounterMode over one real training step"


LAYER_SOURCE = "torch FlopCounterMode over one real training step of the window, by the Keras layer running each op"


class CountedFlops(float):
    """A step's FLOPs counted while it ran (what ``StepRecord.extra["step_args"]`` holds on torch).

    ``by_layer``: its FLOPs per Keras layer path ("" for the ops in no layer),
    where the layers' ranges were in place as it ran; else None.
    """

    by_layer: dict[str, float] | None = None


def layer_counter(steps: int = 1) -> Any:
    """A ``FlopCounterMode`` that also books each op's FLOPs to the layer running it (its ``by_layer``)."""
    from torch.utils.flop_counter import FlopCounterMode

    from keras_gpu_tools.backends.torch.layer_scopes import CURRENT

    class LayerFlopCounter(FlopCounterMode):
        def __init__(self) -> None:
            super().__init__(display=False)
            self.by_layer: dict[str, float] | None = {} if CURRENT.installed else None

        def __enter__(self):
            CURRENT.counting, CURRENT.backward = self.by_layer is not None, ""
            return super().__enter__()

        def __exit__(self, *args):
            CURRENT.counting, CURRENT.backward = False, ""
            return super().__exit__(*args)

        def _count_flops(self, func_packet, out, args, kwargs):
            if self.by_layer is not None and func_packet in self.flop_registry:
                flops = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
                path = CURRENT.path()
                self.by_layer[path] = self.by_layer.get(path, 0.0) + flops / steps
            return super()._count_flops(func_packet, out, args, kwargs)

    return LayerFlopCounter()


def counted(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()``'s result and the FLOPs torch counted while it ran."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = call()
    return out, float(counter.get_total_flops())
