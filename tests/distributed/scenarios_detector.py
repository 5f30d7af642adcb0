"""InputBoundDetector in a job of several JAX processes (see ``launch.py``); each returns a JSON-ready dict.

The job is real (its processes, their collectives, the exchange of figures at each epoch end), its time is not:
each process's detector reads a fake clock that its loader and its step move by fixed amounts
(:func:`fixed_clock`), so every figure, and the verdict taken from them, is exact whatever the machine's load.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np

from tests.distributed.scenarios import data_parallel
from tests.helpers.models import tiny_dense_model
from tests.helpers.step_records import FakeClock

BATCH = 16  # per process
COMPUTE = 0.005  # seconds of (fake) compute per step


def batches(index: int, delay: float, batch: int = BATCH, clock: FakeClock | None = None):
    """This process's batches, endless; each takes ``delay`` seconds of ``clock`` to "load" (a slow disk, a busy
    host)."""
    rng = np.random.default_rng(10 + index)
    x = rng.random((8 * batch, 32), dtype="float32")
    y = rng.random((8 * batch, 1), dtype="float32")
    while True:
        for i in range(0, len(x), batch):
            if delay and clock is not None:
                clock.advance(delay)
            yield x[i : i + batch], y[i : i + batch]


def fixed_clock(det, compute: float) -> FakeClock:
    """Makes ``det`` measure on a fake clock: the step hook's and the detector's (windows, epochs).

    Each training step moves it by ``compute`` (after the step's fetch, which the loader moves it by), and the
    host's CPU use reads as unknown (it would be this process's real use). Returns the clock.
    """
    from keras_gpu_tools.callbacks import input_bound_detector
    from keras_gpu_tools.runtime.step_hook import StepHook

    clock = FakeClock()
    attach = StepHook.attach.__func__

    def attach_on_the_clock(cls, model, observer, backend, session, **_):
        return attach(cls, model, observer, backend, session, clock=clock)

    StepHook.attach = classmethod(attach_on_the_clock)  # the default clock is bound at definition: not patchable
    input_bound_detector.time = types.SimpleNamespace(time=clock)

    class NoCpuMeter:
        def __init__(self, every=None):
            pass

        def restart(self):
            return self

        def read(self):
            return {}

    input_bound_detector.CpuMeter = NoCpuMeter

    def inner(step):  # the hook wraps the train function in its observers' `inner`, on every path
        def timed_step(*args):
            out = step(*args)
            clock.advance(compute)
            return out

        return timed_step

    det.inner = inner
    return clock


def fit_job(
    index: int,
    count: int,
    out: Path,
    delays: list[float] | None = None,
    epochs: int = 3,
    steps: int = 30,
    batch: int = BATCH,
    distribute: bool = True,
    peaks: list[float] | None = None,
    health: list[dict] | None = None,
) -> dict:
    """A data-parallel fit with the detector; process ``i`` loads each batch in ``delays[i]`` (fake) seconds.

    Each step computes in ``COMPUTE`` seconds plus what the process waits for the slowest loader in the
    gradient all-reduce (``max(delays) - delays[i]``): the processes train in step, as in a real job.

    ``peaks[i]``: process ``i``'s per-device ``peak_flops`` (as if its GPUs were another model).
    ``health[i]``: process ``i``'s GPU figures of each epoch, published as a GPUUtilizationLogger would.
    """
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector

    if distribute:
        data_parallel()
    m = tiny_dense_model(features=32, hidden=64)
    delay = (delays or [0.0] * count)[index]
    peak = (peaks or [1e12] * count)[index]
    det = InputBoundDetector(log_dir=str(out / "logs"), window=10, sample_every=10, verbose=0, peak_flops=peak)
    clock = fixed_clock(det, COMPUTE + max(delays or [0.0]) - delay)
    cbs: list = [det]
    if health is not None:
        from tests.helpers.gpu_health import FakeGPUHealth, publisher

        cbs.insert(0, publisher(FakeGPUHealth({str(index): health[index]})))
    hist = m.fit(batches(index, delay, batch, clock), steps_per_epoch=steps, epochs=epochs, callbacks=cbs, verbose=0)
    jv = det.job_verdict
    return {
        "pid": os.getpid(),
        "history": {k: v for k, v in hist.history.items() if k.startswith(("job/", "input/", "throughput/"))},
        "flops_per_step": det._fit.flops,
        "flops_source": det.flops_source,
        "devices_in_step": det.topology.devices_in_step,
        "category": det.verdict.category,
        "job_stragglers": None if jv is None else jv.straggler_processes,
        "job_message": None if jv is None else jv.message,
        "job_advice": None if jv is None else jv.advice,
        "job_text": None if jv is None else jv.text(),
        "summary": det.summary(),
        "run_dir": det.run_dir,
        "job_run_dir": det.job_run_dir,
        "warnings": det.warnings.messages,
        "collective_reason": det.breakdown.collective_reason if det.breakdown else None,
        "history_keys": sorted(hist.history),
    }
