"""The small model and data the find_speedups tests train: an MLP with dropout, and 16 features to 1 target."""

import keras
import numpy as np


def mlp(seed=0, scale=1.0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Rescaling(scale),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.2),  # draws from its SeedGenerator in every training step
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def data(n=256):
    r = np.random.RandomState(0)
    return r.rand(n, 16).astype("float32"), r.rand(n, 1).astype("float32")


def against_baseline(row, base):
    """Whether ``row`` is read against the baseline row ``base``: as at the row's own time, between the baseline's
    two timings, so within its ± (at least half their difference); the baseline itself where it was timed once."""
    u = base.after_uncertainty if "timed before and after" in base.cost else 0.0
    return base.after * (1 - u) * (1 - 1e-9) <= row.before <= base.after * (1 + u) * (1 + 1e-9)
