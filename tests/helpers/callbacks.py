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


class KeepTensors(keras.callbacks.Callback):
    """Keeps a new tensor of ``mib`` MiB at each epoch's end, in a list: the leak a user writes by accident.

    ``keras.ops.full`` writes every element, so the memory is really in use (resident on the host, or
    allocated on the device the backend puts tensors on).
    """

    def __init__(self, mib: float):
        super().__init__()
        self.mib = mib
        self.kept = []

    def on_epoch_end(self, epoch, logs=None):
        if self.mib:
            n = int(self.mib * 2**20) // 4
            self.kept.append(keras.ops.full((n,), float(epoch + 1), dtype="float32"))
