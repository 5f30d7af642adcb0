"""InputBoundDetector in a job of several JAX processes (see ``launch.py``); each returns a JSON-ready dict."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from tests.distributed.scenarios import data_parallel
from tests.helpers.models import tiny_dense_model

BATCH = 16  # per process


def batches(index: int, delay: float, batch: int = BATCH):
    """This process's batches, endless; each takes ``delay`` seconds to "load" (a slow disk, a busy host)."""
    rng = np.random.default_rng(10 + index)
    x = rng.random((8 * batch, 32), dtype="float32")
    y = rng.random((8 * batch, 1), dtype="float32")
    while True:
        for i in range(0, len(x), batch):
            if delay:
                time.sleep(delay)
            yield x[i : i + batch], y[i : i + batch]


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
    """A data-parallel fit with the detector; process ``i`` loads each batch in ``delays[i]`` seconds.

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
    cbs: list = [det]
    if health is not None:
        from tests.helpers.gpu_health import FakeGPUHealth, publisher

        cbs.insert(0, publisher(FakeGPUHealth({str(index): health[index]})))
    hist = m.fit(batches(index, delay, batch), steps_per_epoch=steps, epochs=epochs, callbacks=cbs, verbose=0)
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
