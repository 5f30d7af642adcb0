"""TensorFlow with xprof, for the tests that convert a real trace (skipped on the other backends or without xprof)."""

import pytest


def tensorflow_with_xprof(backend: str, why: str):
    """The `tensorflow` module where the backend is TensorFlow and xprof converts traces; else the test is skipped."""
    if backend != "tensorflow":
        pytest.skip(why)
    pytest.importorskip("xprof.convert.raw_to_tool_data")
    import tensorflow

    return tensorflow
