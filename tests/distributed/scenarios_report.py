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


def late_once(index: int, count: int, out: Path, timeout: float = 3.0, late: float = 9.0, epochs: int = 3) -> dict:
    """A logger whose job channel times out once: process 1 reaches its first epoch end ``late`` s after process 0.

    Returns, for each epoch end, what the logger's gather did on the job's store (counted, not timed):
    "answered" (it waited and every process answered), "timed out" (it waited ``timeout`` s in vain) or
    "skipped" (no wait: the channel was given up, here or by another process); and its warnings.
    """
    import os
    import time

    from keras_gpu_tools import GPUUtilizationLogger
    from keras_gpu_tools.runtime import kv_exchange, topology
    from tests.distributed.scenarios import data_parallel, shard
    from tests.distributed.scenarios_logger import machine_nvml
    from tests.helpers.models import tiny_dense_model

    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    store: list[str] = []  # each wait on the job's store, by its outcome
    channel: list[str] = []  # what the logger's epoch end did on the store
    store_gather = kv_exchange.KVExchange.gather

    def counted_store(self, key, *a, **k):
        try:
            got = store_gather(self, key, *a, **k)
        except topology.ExchangeError:
            store.append("timed out")
            raise
        store.append("answered")
        return got

    kv_exchange.KVExchange.gather = counted_store
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    logger = GPUUtilizationLogger(log_dir=str(out / "logs"), interval=0.02, nvml=machine_nvml(count))
    logger.job_timeout_s = timeout

    class Late(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and index == 1:
                time.sleep(late)  # a slow checkpoint of this process, say

    class Before(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.waits = len(store)

    class After(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            waits = store[before.waits :]  # the logger's, between the two
            channel.append(waits[-1] if waits else "skipped")

    before = Before()
    try:
        history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[Late(), before, logger, After()])
    finally:
        kv_exchange.KVExchange.gather = store_gather
    return {
        "channel": channel,
        "job_keys": [sorted(k for k in values if k.startswith("job/")) for values in logger.epoch_history],
        "loss": [float(v) for v in history.history["loss"]],
        "warnings": list(logger.warnings.messages),
    }
