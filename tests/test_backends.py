"""Runs the ``multibackend`` tests again under the JAX and torch backends.

Keras fixes its backend at import, so each backend needs its own process. A
backend whose framework is not installed (torch where CI cannot install it
cheaply) is skipped with that reason; a subprocess that fails, or collects no
test (pytest's exit code 5), fails here.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.parametrize("backend, module", [("jax", "jax"), ("torch", "torch")])
def test_multibackend_suite(backend, module, record_subrun):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: the {backend} backend is not tested in this environment")
    env = dict(os.environ, KERAS_BACKEND=backend)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--disable-warnings",
            "-rfEs",
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
    record_subrun(f"{backend} backend, multibackend tests", proc.stdout)
    if proc.returncode == 5:
        pytest.fail(f"{backend} backend: no multibackend test was collected\n{tail}")
    assert proc.returncode == 0, f"{backend} backend: multibackend tests failed (exit code {proc.returncode})\n{tail}"
