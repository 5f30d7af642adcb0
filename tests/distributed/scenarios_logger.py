"""GPUUtilizationLogger in a job of several processes (see ``launch.py``); each returns a JSON-ready dict.

The machine has no GPU: every process gets the same fake NVML of ``count *
devices_per_process`` GPUs, each with its own utilization, SM activity and
memory, and sees only its own through ``CUDA_VISIBLE_DEVICES`` (process ``p``
sees GPUs ``p * K`` to ``p * K + K - 1``), as a launcher sets it on a machine
with one GPU (or ``K``) per process.
"""

from __future__ import annotations

import os
from pathlib import Path

import keras

from tests.distributed.scenarios import data_parallel, shard
from tests.helpers.models import tiny_dense_model

GIB = 1024**3


def fake_gpu_figures(g: int) -> dict[str, float]:
    """What fake GPU ``g`` of the machine reports, in the logger's units."""
    return {
        "utilization_percent": 10.0 + 20.0 * g,
        "sm_activity_percent": 5.0 + 10.0 * g,
        "memory_used_mib": 1024.0 * (g + 1),
    }


def machine_nvml(gpus: int):
    from keras_gpu_tools.telemetry.nvml import NVML
    from tests.helpers.fake_nvml import FakeGPU, FakeNVML

    fakes = []
    for g in range(gpus):
        f = fake_gpu_figures(g)
        fakes.append(
            FakeGPU(
                uuid=f"GPU-{g:08d}-0000-0000-0000-000000000000",
                utilization=int(f["utilization_percent"]),
                memory_used=int(f["memory_used_mib"]) * 2**20,
                gpm_values={2: f["sm_activity_percent"], 3: 40.0, 5: 50.0, 10: 30.0, 60: 512.0, 61: 512.0},
            )
        )
    return NVML(FakeNVML(fakes))


def logger_fit(
    index: int, count: int, out: Path, devices_per_process: int = 1, epochs: int = 2, others: bool = False
) -> dict:
    """One fit with a GPUUtilizationLogger on a shared log_dir: what the process logged and who it is.

    With ``others``, an InputBoundDetector and an OOMBatchSizeReducer write their runs to the log_dir too.
    """
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, OOMBatchSizeReducer, report

    k = devices_per_process
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(index * k + i) for i in range(k))
    nvml = machine_nvml(count * k)
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    cb = GPUUtilizationLogger(log_dir=str(out / "logs"), interval=0.02, nvml=nvml)
    callbacks = [cb]
    if others:
        logs = str(out / "logs")
        callbacks += [
            InputBoundDetector(window=2, sample_every=2, log_dir=logs, verbose=0, gpu_logger=None),
            OOMBatchSizeReducer(log_dir=logs),
        ]
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=callbacks)
    return {
        "pid": os.getpid(),
        "history": {key: [float(v) for v in values] for key, values in history.history.items()},
        "records": cb.device_records(),
        "labels": [cb.topology.device_label(i) for i in range(k)],
        "global_step": cb.global_step,
        "run_dir": cb.run_dir,
        "job_run_dir": cb.job_run_dir,
        "warnings": list(cb.warnings.messages),
        "report": report(cb).text(),  # from the callback's own records
    }


def logger_unanswered(index: int, count: int, out: Path, epochs: int = 3) -> dict:
    """Process 1's logger has another run name, so process 0's never hears from it (and the reverse)."""
    import time

    from keras_gpu_tools import GPUUtilizationLogger

    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    cb = GPUUtilizationLogger(
        log_dir=str(out / "logs"), interval=0.02, nvml=machine_nvml(count), run_name="gpu" if index == 0 else "gpu_b"
    )
    cb.job_timeout_s = 30.0  # what an epoch end would wait, were the processes not compared at fit start
    ends = []

    class EpochEnds(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            ends.append(time.monotonic())

    t0 = time.monotonic()
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[cb, EpochEnds()])
    return {
        "history": {key: [float(v) for v in values] for key, values in history.history.items()},
        "warnings": list(cb.warnings.messages),
        "epoch_seconds": [b - a for a, b in zip([t0] + ends, ends)],
    }
