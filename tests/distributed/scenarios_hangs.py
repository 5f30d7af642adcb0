"""Jobs in which a process dies or runs other callbacks (see ``launch.py``); each returns a JSON-ready dict.

Each compares what the user sees with what Keras alone gives: a peer's death
makes the survivor's fit() raise within seconds (the next collective fails), and
a configuration that would leave processes waiting is refused at fit start.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path

import keras

from tests.distributed.scenarios import data_parallel, shard
from tests.distributed.scenarios_logger import machine_nvml
from tests.helpers.models import tiny_dense_model


class DieAtEpochEnd(keras.callbacks.Callback):
    """Kills its process at the end of epoch ``epoch``, before the callbacks after it (ours) run."""

    def __init__(self, out: Path, epoch: int = 0):
        super().__init__()
        self.out, self.epoch = out, epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            (self.out / "died_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


def _outcome(fit) -> dict:
    """Runs ``fit()``; what it raised (if anything), and that the user's ``finally`` ran."""
    out: dict = {"raised": None, "message": "", "finally_ran": False}
    try:
        fit()
    except Exception as e:
        out["raised"], out["message"] = type(e).__name__, f"{e}\n{traceback.format_exc()[-1500:]}"
    finally:
        out["finally_ran"] = True  # where the user writes an emergency checkpoint
    out["ended_at"] = time.time()
    return out


def peer_dies(index: int, count: int, out: Path, callbacks: tuple[str, ...] = ("detector", "logger")) -> dict:
    """Process 1 is killed at the end of epoch 0, before our callbacks exchange; process 0 goes on."""
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, OOMBatchSizeReducer

    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    logs = str(out / "logs")
    ours: list = []
    for name in callbacks:
        if name == "detector":
            ours.append(InputBoundDetector(window=2, sample_every=2, log_dir=logs, verbose=0, gpu_logger=None))
        elif name == "logger":
            ours.append(GPUUtilizationLogger(log_dir=logs, interval=0.05, nvml=machine_nvml(count)))
        elif name == "reducer":
            ours.append(OOMBatchSizeReducer(log_dir=logs))
    for cb in ours:
        cb.job_timeout_s = 600.0  # only a dead process can end the wait before the test's own timeout
    mine = [DieAtEpochEnd(out)] if index == 1 else []
    result = _outcome(lambda: model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=mine + ours))
    result["warnings"] = [w for cb in ours for w in cb.warnings.messages]
    result["died_at"] = float((out / "died_at").read_text())
    result["exit_at_once"] = True  # JAX's shutdown at exit would wait for the dead process
    return result


def reducer_on_one_process(index: int, count: int, out: Path, other: str | None = "detector") -> dict:
    """An OOMBatchSizeReducer on process 0 alone; process 1 runs ``other`` (one of ours) or none of ours."""
    from keras_gpu_tools import InputBoundDetector, OOMBatchSizeReducer
    from keras_gpu_tools.runtime import job_channel

    if other is None:  # what process 0 waits for a process that runs none of ours (short: the test waits it out)
        job_channel.ROSTER_TIMEOUT_S = 5.0
    # Else the default 30 s: process 1 posts its callbacks however late a loaded machine starts its fit.
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    logs = str(out / "logs")
    callbacks: list = [InputBoundDetector(window=2, sample_every=2, log_dir=logs, verbose=0, gpu_logger=None)]
    if index == 0:
        callbacks.append(OOMBatchSizeReducer(log_dir=logs))
    elif other is None:
        callbacks = []
    result = _outcome(lambda: model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=callbacks))
    result["steps_trained"] = int(model.optimizer.iterations.numpy())
    result["exit_at_once"] = True  # a process left in a collective would hold JAX's shutdown
    if other is not None:  # both refused: they leave together, process 0 (the store's host) last
        from jax._src import distributed

        distributed.global_state.client.wait_at_barrier("scenario_done", 60_000)
        if index == 0:
            time.sleep(2.0)  # JAX aborts a process whose coordination service went away
    return result


def one_wait_per_epoch_end(index: int, count: int, out: Path) -> dict:
    """Process 1 dawdles 12 s at epoch 0's end before our callbacks; process 0 waits 4 s once, not once per callback.

    (The margins are wide so that a loaded machine's skew between the processes cannot decide the outcome.)
    """
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector

    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index)
    logs = str(out / "logs")
    ours = [
        InputBoundDetector(window=2, sample_every=2, log_dir=logs, verbose=0, gpu_logger=None),
        GPUUtilizationLogger(log_dir=logs, interval=0.05, nvml=machine_nvml(count)),
    ]
    for cb in ours:
        cb.job_timeout_s = 4.0

    class Dawdle(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if index == 1 and epoch == 0:
                time.sleep(12.0)

    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[Dawdle(), *ours])
    return {
        "epochs": len(history.history["loss"]),
        "job_keys": sorted(k for k in history.history if k.startswith("job/")),
        "warnings": {type(cb).__name__: list(cb.warnings.messages) for cb in ours},
    }
