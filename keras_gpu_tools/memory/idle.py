"""The OOM reducer's idle path: batches whose shape already ran whole go straight to Keras's step."""

from __future__ import annotations

from collections.abc import Callable


class IdlePath:
    """The reducer's idle path, as the backend's train function reads it on every step.

    A batch whose ``batch_signature`` equals ``signature`` (a shape that already
    ran whole) runs Keras's own step through :meth:`run`, straight from the
    backend's train function, with no frame of the reducer's. ``signature``
    None: every batch takes the reducer's guarded path. ``failed(error,
    signature)`` is called on an error of the step and raises the refusal of
    an out-of-memory error; for any other error it ends the reducer's fit and
    returns, and the error goes on unchanged.

    ``free`` counts the next batches that run idle with no look at their
    tensors: where fit() cuts dense arrays into batches (Keras's ``ArrayDataAdapter``,
    a new pass each epoch), every batch of an epoch but the last has one
    shape, ``full``, and once a batch of that shape ran whole the epoch's
    other full batches need no check. The backend's train function runs such
    a batch inline, as :meth:`run` does but with a frame less (a frame
    costs microseconds a step): ``free -= 1``, the step in a
    ``try`` whose error goes to ``failed(error, full)``, ``steps += 1``. Only
    the backends that do (``Backend.counts_idle_batches``: JAX, torch) are
    given ``epoch_batches``; elsewhere ``free`` stays 0. A train step that
    other code runs from inside fit() (a callback's ``train_on_batch``) takes
    a free slot too: it runs as Keras's own step, unchecked, and the epoch's
    last full batch is then checked. Telling such a call apart would cost a
    frame lookup on every step.
    """

    __slots__ = ("signature", "steps", "failed", "free", "full", "epoch_batches", "epoch_start")

    def __init__(self, failed: Callable[[BaseException, tuple | None], None]):
        self.signature: tuple | None = None
        self.full: tuple | None = None
        self.steps = 0  # training batches run, idle or not (the reducer counts its own there)
        self.failed = failed
        self.reset(None)

    def reset(self, epoch_batches: int | None) -> None:
        """A new fit(): nothing ran whole yet; ``epoch_batches`` as for :meth:`ran`."""
        self.signature = self.full = None
        self.free = 0
        self.epoch_batches = epoch_batches  # None: batch shapes are not known in advance
        self.epoch_start = self.steps

    def new_epoch(self) -> None:
        """The epoch's batches but its last run unchecked, once their shape ran whole."""
        self.epoch_start = self.steps
        n = self.epoch_batches
        self.free = n - 1 if self.full is not None and n is not None else 0

    def ran(self, signature: tuple, whole: bool) -> None:
        """A batch of ``signature`` ran on the guarded path (``steps`` not yet counting it), whole or not."""
        if whole:
            self.signature = signature
        n = self.epoch_batches
        position = self.steps - self.epoch_start
        if n is None or position >= n - 1:
            return  # shapes unknown in advance, or an epoch's last batch: maybe partial
        # One of the epoch's full batches: the rest of them run unchecked, or all checked.
        self.full = signature if whole else None
        self.free = n - 2 - position if whole else 0

    def run(self, step: Callable, *args):
        """Keras's ``step(*args)`` in a ``try``, counted."""
        try:
            out = step(*args)
        except Exception as e:
            self.failed(e, self.signature)
            raise
        self.steps += 1
        return out
