"""What each process of a test job does (see ``launch.py``); each returns a JSON-ready dict."""

from __future__ import annotations

from pathlib import Path

import jax
import keras
import numpy as np

from tests.helpers.data import uniform_regression_data
from tests.helpers.models import tiny_dense_model


def data_parallel() -> keras.distribution.DataParallel:
    """Data parallelism over every device of the job; each process feeds its own shard."""
    dist = keras.distribution.DataParallel(devices=jax.devices())
    dist.auto_shard_dataset = False
    keras.distribution.set_distribution(dist)
    return dist


def shard(index: int, n: int = 128, seed: int = 1):
    """This process's samples: different on every process, as under a real sharded input."""
    return uniform_regression_data(n, seed=seed + index)


def weights_sum(model) -> float:
    return float(sum(np.asarray(v.value, dtype="float64").sum() for v in model.trainable_variables))


def topology(index: int, count: int, out: Path) -> dict:
    """Who each process is, and one value gathered over the job's channel."""
    from keras_gpu_tools import backends

    data_parallel()
    model = tiny_dense_model()
    topo = backends.get().topology(model)
    gathered = topo.exchange.gather("test/hello", {"index": index}, timeout_s=30)
    # Epoch after epoch: each gather removes this process's value of the one before.
    from keras_gpu_tools.runtime.topology import JobGather

    job = JobGather(topo, "test/epochs", print, timeout_s=30)
    epochs = [job.gather(f"epoch{e}", e * 10 + index) for e in range(3)]
    job.gather("barrier", 0)  # every process has finished the epochs' gathers (and deletes)
    left = sorted(k for k, _ in topo.exchange.client.key_value_dir_get("keras_gpu_tools/test/epochs/"))
    return {
        "process_index": topo.process_index,
        "process_count": topo.process_count,
        "devices_in_step": topo.devices_in_step,
        "device_ids": list(topo.device_ids or ()),
        "labels": [topo.device_label(i) for i in range(len(topo.device_ids or ()))],
        "source": topo.source,
        "engine": topo.engine,
        "gathered": gathered,
        "epochs": epochs,
        "left": left,
        "run_dir": topo.run_dir("logs", "gpu"),
    }


def independent(index: int, count: int, out: Path) -> dict:
    """Processes of one jax.distributed job, no distribution set: each trains its own model."""
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector

    model = tiny_dense_model()
    x, y = shard(index)
    cbs = [InputBoundDetector(log_dir=str(out / "logs"), verbose=0), GPUUtilizationLogger(log_dir=str(out / "logs"))]
    hist = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=cbs)
    topo = cbs[0].topology
    return {
        "process_index": topo.process_index,
        "process_count": topo.process_count,
        "exchange": topo.exchange is not None,
        "engine": topo.engine,
        "run_dir": cbs[0].run_dir,
        "job_keys": sorted(k for k in hist.history if k.startswith("job/")),
    }
