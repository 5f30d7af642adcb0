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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SOURCE = "torch FlopCounterMode over one real training step"
PLAN_SOURCE = "torch FlopCounterMode over one trial step"


class CountedFlops(float):
    """A step's FLOPs counted while it ran (what ``StepRecord.extra["step_args"]`` holds on torch)."""


def counted(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()``'s result and the FLOPs torch counted while it ran."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = call()
    return out, float(counter.get_total_flops())
