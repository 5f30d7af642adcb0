"""OOMBatchSizeReducer in each process of a test job (see ``launch.py``): an out-of-memory error on one process only.

Every step of a job is one program over every process's devices, with
collectives. Which process runs out of memory is decided by `ProcessCliff`: on
the process it names, above `limit` rows of a batch per device, it asks XLA's
CPU allocator for a tensor of 1 TiB per row, which the allocator refuses ("Out
of memory allocating ..."): a real allocator error, on that process alone, as
when one host's GPU has less memory free than the others'.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import keras
import numpy as np

from tests.distributed.scenarios import data_parallel
from tests.helpers.models import SeenCounter  # the reducer tests' sample counter

HUGE_COLS = 2**38  # float32 columns per row: 1 TiB per row


class ProcessCliff(keras.layers.Layer):
    """On process `process`, above `limit` rows per device, materialises a (rows, 2**38) float32 tensor.

    The rows per device: traced for the job's step (the Keras distribution in
    effect) the layer sees the job's whole batch, spread over every device;
    rehearsed on one device (no distribution) it sees that device's rows.
    """

    def __init__(self, limit: int, process: int, inference_only: bool = False, **kw):
        super().__init__(**kw)
        self.limit = limit
        self.process = process
        self.inference_only = inference_only  # evaluation and prediction only: training fits

    def call(self, x, training=False):
        n = x.shape[0]
        if not isinstance(n, int) or jax.process_index() != self.process or (self.inference_only and training):
            return x
        rows = n // jax.device_count() if keras.distribution.distribution() is not None else n
        if rows <= self.limit:
            return x
        with warnings.catch_warnings():  # an index into 2**38 columns asks for int64
            warnings.simplefilter("ignore", UserWarning)
            big = jnp.zeros((n, HUGE_COLS), "float32").at[0, 0].set(jnp.ravel(x)[0].astype("float32"))
        big = jax.lax.optimization_barrier(big)  # a real buffer: on a GPU, XLA would fuse it away
        return x + (0.0 * big.max()).astype(x.dtype)


def model(total: int, limit: int, process: int, seed: int = 1, inference_only: bool = False) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inp = keras.Input((4,))
    h = SeenCounter(total)(inp)
    h = ProcessCliff(limit, process, inference_only)(h)
    h = keras.layers.Dense(8, activation="tanh")(h)
    out = keras.layers.Dense(1)(h)
    m = keras.Model(inp, out)
    m.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse", metrics=["mae"])
    return m


def shard(index: int, n: int):
    """This process's samples, with job-wide ids in column 0."""
    rng = np.random.default_rng(10 + index)
    x = rng.standard_normal((n, 3), dtype="float32")
    y = (x.sum(1, keepdims=True) + 0.1 * rng.standard_normal((n, 1), dtype="float32")).astype("float32")
    ids = (index * n + np.arange(n, dtype="float32"))[:, None]
    return np.concatenate([ids, x], 1), y


def trainable(m) -> list[list[float]]:
    return [np.asarray(v.value, dtype="float64").ravel().tolist() for v in m.trainable_variables]


def one_process_oom(index: int, count: int, out: Path, n: int = 40, batch: int = 16, limit: int = 4) -> dict:
    """Process 0 runs out of memory above `limit` rows per device; process 1 never does."""
    from keras_gpu_tools import OOMBatchSizeReducer

    data_parallel()
    x, y = shard(index, n)
    total = count * n
    m = model(total, limit, process=0)
    reference = model(total, 10**9, process=0)  # same seed: the same initial weights, no cliff
    reducer = OOMBatchSizeReducer(log_dir=str(out / "logs"))
    history = m.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[reducer]).history
    ref_history = reference.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0).history
    return {
        "events": [[e.batch_size, e.failed_split, e.next_split, e.kind] for e in reducer.events],
        "why": [e.why() for e in reducer.events],
        "micro_batches": reducer.micro_batches,
        "agreements": reducer._state.agreements,
        "granule": reducer.controller.granule,
        "seen": np.asarray(m.layers[1].seen.value).tolist(),
        "iterations": int(np.asarray(m.optimizer.iterations.value)),
        "ref_iterations": int(np.asarray(reference.optimizer.iterations.value)),
        "weights": trainable(m),
        "ref_weights": trainable(reference),
        "loss": history["loss"],
        "ref_loss": ref_history["loss"],
        "oom_events": history["oom/events"],
        "run_dir": reducer.run_dir,
    }


def one_process_data_parallel(index: int, count: int, out: Path, n: int = 40, batch: int = 16, limit: int = 2) -> dict:
    """One process over its devices: each device's rows are split; the errors Keras would meet are told first."""
    from keras_gpu_tools import OOMBatchSizeReducer

    data_parallel()
    devices = jax.device_count()
    x, y = shard(index, n)
    m = model(n, limit, process=0)
    reference = model(n, 10**9, process=0)
    reducer = OOMBatchSizeReducer()
    history = m.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[reducer]).history
    ref_history = reference.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0).history
    result = {
        "devices": devices,
        "events": [[e.batch_size, e.failed_split, e.next_split, e.kind] for e in reducer.events],
        "lines": [e.line() for e in reducer.events],
        "micro_batches": reducer.micro_batches,
        "agreements": reducer._state.agreements,
        "seen": np.asarray(m.layers[1].seen.value).tolist(),
        "iterations": int(np.asarray(m.optimizer.iterations.value)),
        "weights": trainable(m),
        "ref_weights": trainable(reference),
        "loss": history["loss"],
        "ref_loss": ref_history["loss"],
    }
    # A last batch that cannot be spread evenly (Keras would fail there, mid-epoch): refused before any step.
    odd = model(n - 1, limit, process=0)
    try:
        odd.fit(x[: n - 1], y[: n - 1], batch_size=batch, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    except ValueError as e:
        result["uneven"] = str(e)
        result["uneven_iterations"] = int(np.asarray(odd.optimizer.iterations.value))
    # Nothing fits: the smallest split is one sample per device.
    never = model(n, 0, process=0)
    try:
        never.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer()])
    except Exception as e:
        result["never"] = str(e)
    return result


def events_of(reducer) -> list:
    return [[e.batch_size, e.failed_split, e.next_split, e.kind, e.phase] for e in reducer.events]


def evaluation_oom(index: int, count: int, out: Path, n: int = 40, batch: int = 16, limit: int = 4) -> dict:
    """Process 0 runs out of memory above `limit` rows per device in evaluation and prediction only."""
    from keras_gpu_tools import OOMBatchSizeReducer

    data_parallel()
    x, y = shard(index, n)
    xv, yv = shard(index + count, 32)  # 32 validation samples per process: 2 batches of 16
    total = count * n
    m = model(total, limit, process=0, inference_only=True)
    reference = model(total, 10**9, process=0)
    reducer = OOMBatchSizeReducer()
    fit_args = dict(batch_size=batch, epochs=2, shuffle=False, verbose=0, validation_data=(xv, yv))
    history = m.fit(x, y, callbacks=[reducer], **fit_args).history
    ref_history = reference.fit(x, y, **fit_args).history
    result = {
        "fit_events": events_of(reducer),
        "fit_why": [e.why() for e in reducer.events],
        "fit_agreements": reducer._state.agreements,
        "val_loss": history["val_loss"],
        "ref_val_loss": ref_history["val_loss"],
        "loss": history["loss"],
        "ref_loss": ref_history["loss"],
        "weights": trainable(m),
        "ref_weights": trainable(reference),
    }
    # evaluate() outside fit, with a reducer of its own: agreed the same way.
    alone = OOMBatchSizeReducer()
    result["evaluate"] = m.evaluate(xv, yv, batch_size=batch, verbose=0, callbacks=[alone])
    result["ref_evaluate"] = reference.evaluate(xv, yv, batch_size=batch, verbose=0)
    result["evaluate_events"] = events_of(alone)
    result["evaluate_agreements"] = alone._state.agreements
    # predict() over the job: agreed the same way; then Keras itself cannot gather its outputs,
    # which span the other process's devices (its own error, on both processes: no hang).
    spread = OOMBatchSizeReducer()
    try:
        m.predict(xv, batch_size=batch, verbose=0, callbacks=[spread])
    except RuntimeError as e:
        result["job_predict_error"] = str(e)[:300]
    result["job_predict_events"] = events_of(spread)
    result["job_predict_agreements"] = spread._state.agreements
    # predict() on process 0 alone, on its own data (no distribution): split there, with nobody to agree with.
    # Not on GPUs: there XLA shares each compilation's autotuning between the job's processes, and
    # Keras's predict step, compiled by process 0 alone, waits for process 1 for ever (seen on H200s).
    if index == 0 and jax.devices()[0].platform == "cpu":
        keras.distribution.set_distribution(None)
        local = OOMBatchSizeReducer()
        predicted = m.predict(xv, batch_size=batch, verbose=0, callbacks=[local])
        result["local_predict"] = np.asarray(predicted).ravel().tolist()
        result["ref_local_predict"] = np.asarray(reference.predict(xv, batch_size=batch, verbose=0)).ravel().tolist()
        result["local_events"] = events_of(local)
        result["local_agreements"] = local._state.agreements
    return result
