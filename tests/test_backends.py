"""Runs the ``multibackend`` tests again under the JAX and torch backends.

Keras fixes its backend at import, so each backend needs its own process.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("backend, module", [("jax", "jax"), ("torch", "torch")])
def test_multibackend_suite(backend, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    env = dict(os.environ, KERAS_BACKEND=backend)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--disable-warnings",
            "-rfE",
            "-m",
            "multibackend",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    print(tail)
    assert proc.returncode == 0, f"{backend} backend: multibackend tests failed\n{tail}"
