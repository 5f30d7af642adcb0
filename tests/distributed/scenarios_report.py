"""report() of a job of several JAX processes (see ``launch.py``); each returns a JSON-ready dict.

The fits are those of ``scenarios_detector`` and ``scenarios_profiler`` themselves:
``keras.Model.fit`` is wrapped only to keep the callbacks it was given, for ``report(callbacks)``.
"""

from __future__ import annotations

from pathlib import Path

import keras

from tests.distributed import scenarios_detector, scenarios_profiler


def _reported(fit_job, index: int, count: int, out: Path, **args) -> dict:
    """``fit_job(index, count, out, **args)``, then the report of the callbacks it fitted with (text and HTML)."""
    from keras_gpu_tools import report

    given = []
    fit = keras.Model.fit

    def keeping_callbacks(self, *a, **k):
        given.extend(k.get("callbacks") or [])
        return fit(self, *a, **k)

    keras.Model.fit = keeping_callbacks
    try:
        result = fit_job(index, count, out, **args)
    finally:
        keras.Model.fit = fit
    rep = report(given)
    result.update(
        report_text=rep.text(),
        report_html=rep.html(),
        report_job_verdict=rep.data.job_verdict,
        report_job_profiles=rep.data.job_profiles,
        report_process_count=rep.data.process_count,
    )
    return result


def detector_report(index: int, count: int, out: Path, **args) -> dict:
    """``scenarios_detector.fit_job(**args)`` and its report."""
    return _reported(scenarios_detector.fit_job, index, count, out, **args)


def profile_report(index: int, count: int, out: Path, **args) -> dict:
    """``scenarios_profiler.profile_window(**args)`` and its report (the job's profiler windows)."""
    return _reported(scenarios_profiler.profile_window, index, count, out, **args)


def late_once(index: int, count: int, out: Path, timeout: float = 1.0, late: float = 2.5, epochs: int = 3) -> dict:
    """A logger whose job channel times out once: process 1 reaches its first epoch end ``late`` s after process 0.

    Returns the seconds the logger's ``on_epoch_end`` took at each epoch end (its exchange), and its warnings.
    """
    import os
    import time

    from keras_gpu_tools import GPUUtilizationLogger
    from tests.distributed.scenarios import data_parallel, shard
    from tests.distributed.scenarios_logger import machine_nvml
    from tests.helpers.models import tiny_dense_model

    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    logger = GPUUtilizationLogger(log_dir=str(out / "logs"), interval=0.02, nvml=machine_nvml(count))
    logger.job_timeout_s = timeout
    marks: list[tuple[str, float]] = []

    class Mark(keras.callbacks.Callback):
        def __init__(self, name, sleep=0.0):
            super().__init__()
            self.name, self.sleep = name, sleep

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and self.sleep:
                time.sleep(self.sleep)  # a slow checkpoint of this process, say
            marks.append((self.name, time.monotonic()))

    callbacks = [Mark("late", late if index == 1 else 0.0), Mark("before"), logger, Mark("after")]
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=callbacks)
    before = [t for name, t in marks if name == "before"]
    after = [t for name, t in marks if name == "after"]
    return {
        "exchange_seconds": [b - a for a, b in zip(before, after)],
        "job_keys": [sorted(k for k in values if k.startswith("job/")) for values in logger.epoch_history],
        "loss": [float(v) for v in history.history["loss"]],
        "warnings": list(logger.warnings.messages),
    }
