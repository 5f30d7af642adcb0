"""plan_batch_size(objective="throughput") in each process of a test job (see ``launch.py``).

Every process plans the same model under `keras.distribution.DataParallel`
over the job's devices: the candidates' fits are collective steps, so the
processes must measure the same candidates with the same number of steps, and
pick the same batch from the same (merged) figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import keras
import numpy as np

from tests.distributed.scenarios import data_parallel, shard
from tests.helpers.models import tiny_dense_model


def throughput_plan(index: int, count: int, out: Path, max_batch_size: int = 8) -> dict:
    """Plans by throughput; returns the plan, this process's own rows, and whether the model is as before."""
    from keras_gpu_tools import plan_batch_size
    from keras_gpu_tools.memory import throughput_run

    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index, n=32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # a trained state: the plan must put it back
    before = [np.asarray(v.value).tolist() for v in model.variables + model.optimizer.variables]
    own: list = []
    merge = throughput_run.slowest

    def recorded(per_process):  # every process's rows, as gathered, before they are merged
        own.extend(per_process)
        return merge(per_process)

    throughput_run.slowest = recorded
    try:
        plan = plan_batch_size(
            model,
            x,
            y,
            objective="throughput",
            max_seconds=math.inf,
            max_batch_size=max_batch_size,
            log_dir=str(out / "logs"),
        )
    finally:
        throughput_run.slowest = merge
    after = [np.asarray(v.value).tolist() for v in model.variables + model.optimizer.variables]
    history = model.fit(x, y, batch_size=plan.batch_size // count, epochs=1, verbose=0).history
    return {
        "batch_size": plan.batch_size,
        "per_device": plan.per_device_batch_size,
        "devices": plan.devices,
        "why": plan.why,
        "candidates": [c.as_dict() for c in plan.candidates],
        "gathered": own,
        "unchanged": after == before,
        "weights": after,
        "trained": bool(np.isfinite(history["loss"][-1])),
        "text": str(plan),
        "keras": keras.__version__,
    }
