"""fit()'s callback list: what Keras's progress bar, History and TensorBoard callbacks see of the epoch logs.

Keras's ``CallbackList`` appends its ``History`` and then its ``ProgbarLogger``
after the user's callbacks and hands every callback the same ``logs`` dict at
each epoch end, so a key a callback of ours adds there reaches ``History``,
``CSVLogger`` and the user's callbacks, and also the progress bar (which prints
every key it is given) and ``keras.callbacks.TensorBoard`` (which writes every
key again as ``epoch_<key>``). :func:`view_epoch_end` gives one callback its
own view of those logs, through an ``on_epoch_end`` set on the instance (looked
up before the class's method), removed again when the fit ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LogsView = Callable[[Any], Any]  # the logs a callback is given -> the logs it sees


def epoch_log_readers(callbacks: list[Any]) -> tuple[list[Any], list[Any], Any | None]:
    """The progress bars (``ProgbarLogger``) and ``keras.callbacks.TensorBoard`` callbacks among ``callbacks``,
    and the callback whose epoch end comes last of the progress bars and ``History`` (None: neither is there)."""
    import keras

    bars = [c for c in callbacks if isinstance(c, keras.callbacks.ProgbarLogger)]
    boards = [c for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)]
    last = next(
        (c for c in reversed(callbacks) if isinstance(c, (keras.callbacks.ProgbarLogger, keras.callbacks.History))),
        None,
    )
    return bars, boards, last


def view_epoch_end(callback: Any, view: LogsView | None, after: Callable[[], None] | None = None) -> Callable[[], None]:
    """Makes ``callback.on_epoch_end`` see ``view(logs)`` (None: the logs as given), then calls ``after()``.

    Returns the function that puts back what was there. ``after`` runs also
    when the callback's epoch end raises.
    """
    had = "on_epoch_end" in vars(callback)
    own = vars(callback).get("on_epoch_end")
    original = callback.on_epoch_end

    def on_epoch_end(epoch, logs=None):
        try:
            original(epoch, view(logs) if view is not None else logs)
        finally:
            if after is not None:
                after()

    callback.on_epoch_end = on_epoch_end

    def restore() -> None:
        if vars(callback).get("on_epoch_end") is not on_epoch_end:
            return  # someone set their own since: theirs stays
        if had:
            callback.on_epoch_end = own
        else:
            del callback.on_epoch_end

    return restore
