"""For a fresh JAX or torch process a test starts: what it can leave out of its start without changing what it runs."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def tensorflow_hidden() -> Iterator[None]:
    """TensorFlow reads as not installed inside the block; importable again after it.

    ``keras.utils.set_random_seed`` (and ``keras.distribution.initialize``, which calls it) seeds
    TensorFlow's generator too wherever TensorFlow is installed, importing it: seconds of the start
    of a JAX or torch process that never uses it. Keras asks once and keeps the answer, so the first
    seeding inside this block is the one that decides. A no-op where TensorFlow is already imported
    (the TensorFlow backend's).
    """
    hide = "tensorflow" not in sys.modules
    if hide:
        sys.modules["tensorflow"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hide:
            del sys.modules["tensorflow"]
