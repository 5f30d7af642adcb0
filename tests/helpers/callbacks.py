"""Keras callbacks that act on a test's fit from outside."""

import keras


class InterruptAt(keras.callbacks.Callback):
    """Raises ``KeyboardInterrupt`` at the end of training batch ``batch``, as a user's Ctrl-C would."""

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt
