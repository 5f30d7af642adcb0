"""fit() itself: its frame and locals, the train/test/predict functions it reads at every step.

The step hook recognises its own fit() by the frame of ``model.fit``; the
callbacks find the epoch iterator and the callback list among that frame's
locals; the step hook and the OOM reducer replace the functions fit(),
evaluate() and predict() read anew at every step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime.keras_internals.version import internals_error

_FIT_NAMES = ("fit",)


def find_fit_frame(model, start=None):
    """The innermost frame of ``model.fit`` on the current stack, or None.

    Keras's ``fit`` is wrapped by its traceback filter; the frame we want is
    the trainer's own ``fit`` (its code is named ``fit`` and ``self`` is the model).
    """
    frame = start or sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _FIT_NAMES and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


def get_train_function(model) -> Callable:
    if not hasattr(model, "train_function") or not hasattr(model, "make_train_function"):
        raise internals_error("`model.train_function` / `model.make_train_function`")
    fn = model.train_function
    if fn is None:  # on_train_begin runs after make_train_function; be safe anyway
        model.make_train_function()
        fn = model.train_function
    if not callable(fn):
        raise internals_error("a callable `model.train_function` at on_train_begin")
    return fn


def set_train_function(model, fn: Callable) -> None:
    model.train_function = fn


_EVAL_ATTRIBUTES = {"test": "test_function", "predict": "predict_function"}


def eval_function(model, kind: str) -> Callable | None:
    """``model.test_function`` (``kind="test"``) or ``model.predict_function`` (``"predict"``), or None."""
    return getattr(model, _EVAL_ATTRIBUTES[kind], None)


def set_eval_function(model, kind: str, fn: Callable) -> None:
    """Replaces the test or predict function; evaluate()/predict() read it anew at every step."""
    setattr(model, _EVAL_ATTRIBUTES[kind], fn)


def steps_per_execution(model) -> int:
    """Training steps per call of the train function (``model.steps_per_execution``), at least 1."""
    return max(1, int(getattr(model, "steps_per_execution", 1) or 1))


def fit_locals(model) -> dict[str, Any]:
    """The locals of the running ``model.fit`` (empty outside fit)."""
    frame = find_fit_frame(model, sys._getframe(1))
    if frame is None:
        return {}
    try:
        return dict(frame.f_locals)
    finally:
        del frame


def find_callback_list(model) -> list[Any]:
    """The callbacks of the running fit(), or [] where they cannot be found."""
    cbs = fit_locals(model).get("callbacks")
    inner = getattr(cbs, "callbacks", None)
    return list(inner) if isinstance(inner, list) else []


def find_epoch_iterator(model):
    """The training ``EpochIterator`` of the running fit(), or None."""
    ei = fit_locals(model).get("epoch_iterator")
    if ei is None or not hasattr(ei, "_get_iterator") or not hasattr(ei, "data_adapter"):
        return None
    return ei


def training_data(model) -> dict[str, Any]:
    """What fit() is training on: the adapter and the user's ``x``."""
    loc = fit_locals(model)
    ei = loc.get("epoch_iterator")
    return {"adapter": getattr(ei, "data_adapter", None), "x": loc.get("x")}
