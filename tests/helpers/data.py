"""Small arrays for the tests' fits: (x, y) pairs of float32, the same for the same arguments."""

from __future__ import annotations

import numpy as np


def regression_data(n: int, features: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``features`` standard-normal inputs and one standard-normal target."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def uniform_regression_data(n: int, features: int = 8, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``features`` inputs and one target, uniform in [0, 1)."""
    rng = np.random.default_rng(seed)
    return rng.random((n, features), dtype="float32"), rng.random((n, 1), dtype="float32")


def numbered_samples(num_samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Samples whose first column is their id (counted by ``models.SeenCounter``), then 3 features."""
    r = np.random.RandomState(seed)
    x = r.randn(num_samples, 3).astype("float32")
    y = (x.sum(1, keepdims=True) + 0.1 * r.randn(num_samples, 1)).astype("float32")
    return np.concatenate([np.arange(num_samples, dtype="float32")[:, None], x], 1), y
