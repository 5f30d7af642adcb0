"""LeanCallback: the base of every callback of the package, with nothing per step it does not use.

Its own module, importing only Keras, so that a callback built on it alone
(``LiveView``, ``MixedPrecisionCheck``) loads nothing else.
"""

from __future__ import annotations

import keras

from keras_gpu_tools.runtime.typing_compat import override


class LeanCallback(keras.callbacks.Callback):
    """Base of every callback of the package: nothing per step unless a subclass asks.

    Keras calls every callback's six batch hooks on every step, whether it
    overrides them or not, and its defaults call the ``on_batch_*`` aliases in
    turn: two Python calls per hook per step. Here each is one call that
    returns; a subclass overrides the few it needs. ``async_safe``: the batch
    hooks only count, so they are safe in Keras's thread pool of batch-end
    hooks, and a monitoring callback does not force a device sync per step on
    JAX.
    """

    async_safe = True

    @override
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        pass

    @override
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        pass

    @override
    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        pass

    @override
    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        pass

    @override
    def on_predict_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        pass

    @override
    def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None:
        pass
