"""Per-step host cost of the callbacks, checked in CI (the figures are in benchmarks/RESULTS.md).

The check is exact, against a regression of tens of microseconds per step: the Python
bytecode instructions that the package itself executes per training step with every
callback attached (counted with an opcode tracer limited to the package's frames; the same
on every machine for one Python). The time a step gains is measured by
benchmarks/per_step_cost.py (A/B beside A/A), which holds the goal: a timed test could
only print it, as a loaded machine moves it.
"""

import sys
import warnings

import keras
import numpy as np
import pytest

import keras_gpu_tools as kgt

pytestmark = pytest.mark.multibackend

PACKAGE_DIR = kgt.__file__.rsplit("/", 1)[0]


def model_and_data(steps):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 32, 16)).astype("float32")
    y = rng.integers(0, 3, size=(steps * 32,)).astype("int32")
    return model, x, y


def every_callback(tmp_path, reducer=True):
    return [
        kgt.GPUUtilizationLogger(log_dir=tmp_path / "logs"),
        kgt.InputBoundDetector(log_dir=tmp_path / "logs", verbose=0),
        kgt.ProfilerWindow(log_dir=tmp_path / "logs", start_step=10**9, verbose=0),
        *([kgt.OOMBatchSizeReducer(log_dir=tmp_path / "logs", verbose=0)] if reducer else []),
        kgt.LiveView(),
        kgt.MixedPrecisionCheck(),
    ]


class OpcodeCounter:
    """Counts the bytecode instructions executed in the package's own frames, on this thread."""

    def __init__(self):
        self.count = 0

    def _local(self, frame, event, arg):
        if event == "opcode":
            self.count += 1
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            return self._local
        return None

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def test_the_package_runs_few_instructions_per_step(tmp_path):
    # The difference between a long and a short fit is the per-step cost; what
    # a fit costs once (on_train_begin, epoch ends) cancels out.
    short_steps, long_steps = 100, 500
    model, x, y = model_and_data(long_steps)
    cbs = every_callback(tmp_path)
    counts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x[:640], y[:640], batch_size=32, verbose=0, callbacks=cbs)  # compiles every path
        for steps in (short_steps, long_steps):
            with OpcodeCounter() as counter:
                model.fit(x[: steps * 32], y[: steps * 32], batch_size=32, verbose=0, shuffle=False, callbacks=cbs)
            counts[steps] = counter.count
    per_step = (counts[long_steps] - counts[short_steps]) / (long_steps - short_steps)
    print(f"{keras.backend.backend()}: {per_step:.0f} package bytecode instructions per step")
    # Measured (Python 3.11): 105 on JAX, 128 on torch, 154 on TensorFlow (the reducer
    # fetches in Python there; on JAX and torch these arrays' full batches run unchecked). A per-step regression of tens of microseconds is
    # thousands of instructions.
    assert per_step < 600, per_step
