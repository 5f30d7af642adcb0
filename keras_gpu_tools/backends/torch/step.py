"""The torch step: the step hook's callers, the device sync, and timing fit()'s fetches.

torch's train function is ``f(batches)`` with the batches already fetched by
fit()'s epoch iterator, so fetch time is measured by wrapping that iterator
(``keras_internals.time_epoch_iterator``) and falls before the call. A sync is
``torch.cuda.synchronize()``, on CUDA only; there a sampled step's host time is
told apart from the device's (``eager_split``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.torch.flops import LAYER_SOURCE, SOURCE, CountedFlops, layer_counter
from keras_gpu_tools.backends.torch.layer_scopes import CURRENT
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import leading_dim

logger = logging.getLogger("keras_gpu_tools")

# Keras's train function -> {batch signature: FLOPs per step}: each shape is counted once.
_COUNTS: weakref.WeakKeyDictionary[Callable, dict[Any, CountedFlops]] = weakref.WeakKeyDictionary()


def _call_torch(hook, data):
    rec = hook.begin(lambda: hook.sync(True))
    if rec.sampled:
        try:
            hook.check_signature(rec, data[0])
        except (TypeError, IndexError):
            pass
    rec.start = hook.clock()
    if hook.capture_args and rec.sampled and not rec.warmup:
        out = _counted_step(hook, rec, data)
    else:
        out = hook.around(rec, lambda: hook.inner(data))
    returned = hook.clock()
    if rec.sampled:
        hook.sync(True)
    rec.end = hook.clock()
    rec.steps = _steps_of(data)
    try:
        n = leading_dim(data[0])
        rec.samples = n * len(data) if n is not None else None
    except (TypeError, IndexError):
        pass
    if rec.sampled:
        if _cuda_in_use():
            rec.dispatch, rec.compute = eager_split(returned - rec.start, rec.end - returned)
        else:
            rec.compute = rec.end - rec.start
    return out


#: The device's work left when the call returns, over the host's time in the call, at and above which the
#: step waits on the device (below it, on the host).
DEVICE_BOUND_TAIL = 0.1


def eager_split(host: float, tail: float) -> tuple[float | None, float]:
    """(dispatch, compute) seconds of an eager step on an asynchronous device (CUDA), from what was timed.

    ``host``: the call, from its start (the device idle) to its return, every kernel launched;
    ``tail``: the wait for the device after it. Eager torch launches each kernel as the host
    reaches it, so the device works while the host runs. A device that is done within a tenth
    of the host time after the return was waiting for the host: the step is the host's
    launches (dispatch) and that tail (compute). One still busy longer was the bottleneck,
    the launches hidden under its work: the whole call is compute, dispatch not told apart.
    """
    if tail >= DEVICE_BOUND_TAIL * host:
        return None, host + tail
    return host, tail


def _cuda_in_use() -> bool:
    torch = deps.loaded("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


def _counted_step(hook, rec, data):
    """The user's step, run once inside torch's FLOP counter (see ``backends.torch.flops``).

    Counting costs the step Python time per op, so its time is left out of
    the statistics, as a warm-up step's is. A counter that fails leaves the
    step to run as always.
    """
    hook.capture_args = False  # one count per fit; the observer asks again where it needs one
    counts = _COUNTS.setdefault(hook.original, {})
    known = counts.get(rec.signature)
    if known is not None and (known.by_layer is not None or not CURRENT.installed):
        rec.extra["step_args"] = known  # this step on this batch shape was counted before (per layer where asked)
        return hook.around(rec, lambda: hook.inner(data))
    rec.warmup = True
    steps = max(_steps_of(data), 1)
    try:
        counter = layer_counter(steps)
        counter.__enter__()
    except Exception as e:
        logger.debug("keras_gpu_tools: torch's FLOP counter is unavailable (%s)", e)
        return hook.around(rec, lambda: hook.inner(data))
    try:
        out = hook.around(rec, lambda: hook.inner(data))
    finally:
        counter.__exit__(None, None, None)
    counts[rec.signature] = flops = CountedFlops(counter.get_total_flops() / steps)
    flops.by_layer = counter.by_layer
    rec.extra["step_args"] = flops
    return out


def _light_torch(hook, data):
    """The light path: Keras's step; its fetch, timed before the call, goes to the pending record."""
    seconds = hook.take_fetch()
    out = hook.inner(data)
    hook.add_covered_fetch(seconds, _steps_of(data))
    return out


def _steps_of(data) -> int:
    """The steps of one train-function call: Keras hands torch's a list of batches, one per step."""
    try:
        return max(len(data), 1)
    except TypeError:
        return 1


def _install_fetch_timer(hook) -> None:
    ei = ki.find_epoch_iterator(hook.model_ref)
    if ei is None:
        logger.warning(
            "keras_gpu_tools: could not find fit()'s epoch iterator (Keras %s); input fetch time is not measured on torch.",
            ki.keras_version(),
        )
        return
    hook.fetch_known = True
    hook.undo_fetch_timer = ki.time_epoch_iterator(ei, hook.on_fetch, hook.clock, when=hook.wants_full)


class TorchStep(Backend):
    """The step hook's side of the torch backend (see :class:`~keras_gpu_tools.backends.protocols.StepBackend`)."""

    traced_flops = True

    def shape_specs(self, args):
        """On torch the step's FLOPs were counted as it ran: ``args`` is that count."""
        return args if isinstance(args, CountedFlops) else None

    def step_flops(self, train_function: Callable, specs) -> tuple[float | None, str]:
        return (float(specs), SOURCE) if isinstance(specs, CountedFlops) and specs > 0 else (None, "")

    def layer_flops(self, train_function: Callable, specs) -> tuple[list[tuple[str, float]] | None, str]:
        """The counted step's FLOPs per layer path, where the window's layer ranges were in place as it ran."""
        by_layer = specs.by_layer if isinstance(specs, CountedFlops) else None
        if not by_layer:
            return None, "no step of the window ran inside torch's FLOP counter (a window of one step?)"
        return list(by_layer.items()), LAYER_SOURCE

    def uses_tf32(self) -> bool:
        torch = deps.loaded("torch")
        return bool(torch is not None and torch.backends.cuda.matmul.allow_tf32)

    def sync(self, outputs) -> None:
        torch = deps.loaded("torch")
        if outputs is not None and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def step_caller(self, hook) -> Callable:
        return lambda data: _call_torch(hook, data)

    def fetch_caller(self, hook) -> Callable:
        return lambda data: _light_torch(hook, data)

    def prepare_hook(self, hook) -> None:
        _install_fetch_timer(hook)
