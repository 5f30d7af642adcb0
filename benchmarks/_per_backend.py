"""What the benchmark scripts share: running a script once per Keras backend, each in its own
process; writing their JSON; the package's six callbacks as every overhead benchmark builds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def run_per_backend(script: str, backends: str, argv: list[str]) -> list[dict]:
    """Runs ``script --out <tmp> *argv`` with ``KERAS_BACKEND`` set to each of ``backends`` (comma-separated).

    Returns the concatenated ``results`` of their JSON outputs; a backend whose run
    failed gives ``{"backend": ..., "error": <the end of its stderr>}``.
    """
    results = []
    for backend in backends.split(","):
        out = os.path.join(tempfile.gettempdir(), f"kgt_{os.path.basename(script)}_{backend}_{os.getpid()}.json")
        cmd = [sys.executable, os.path.abspath(script), "--out", out, *argv]
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                results.extend(json.load(f)["results"])
            os.remove(out)
        else:
            results.append({"backend": backend, "error": proc.stderr[-3000:]})
    return results


#: The package's six callbacks, by class name, in the order the overhead benchmarks add them.
CALLBACKS = (
    "GPUUtilizationLogger",
    "InputBoundDetector",
    "ProfilerWindow",
    "OOMBatchSizeReducer",
    "LiveView",
    "MixedPrecisionCheck",
)


def callback_makers(log_dir: str | None) -> dict:
    """A maker per callback of ``CALLBACKS``: as a user adds it, quiet, with no profiler window due."""
    import keras_gpu_tools as kgt

    return {
        "GPUUtilizationLogger": lambda: kgt.GPUUtilizationLogger(log_dir=log_dir),
        "InputBoundDetector": lambda: kgt.InputBoundDetector(log_dir=log_dir, verbose=0),
        "ProfilerWindow": lambda: kgt.ProfilerWindow(log_dir=log_dir, start_step=10**9, verbose=0),
        "OOMBatchSizeReducer": lambda: kgt.OOMBatchSizeReducer(log_dir=log_dir, verbose=0),
        "LiveView": lambda: kgt.LiveView(),
        "MixedPrecisionCheck": lambda: kgt.MixedPrecisionCheck(),
    }


def write_json(path: str | None, doc: dict) -> None:
    """Writes ``doc`` to ``path`` (if given), making its folder."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)


def keras_batch_end_on_training_thread() -> None:
    """Turns off Keras's thread pool for batch-end hooks, in this process (a diagnostic).

    With it (Keras's default for callbacks marked ``async_safe``, as every bare
    fit's are), the hooks of step N run on a pool thread while the training
    thread runs step N+1, and the two share the interpreter lock: more Python on
    the training thread then costs more than its own time on a 2-core machine.
    Without it everything is on the training thread, where the package's own
    cost per step shows alone.
    """
    from keras.src.callbacks import callback_list

    configure = callback_list.CallbackList._configure_async_dispatch

    def synchronous(self, callbacks):
        configure(self, callbacks)
        self._async_train = self._async_test = self._async_predict = False

    callback_list.CallbackList._configure_async_dispatch = synchronous


def keras_batch_end_workers(workers: int) -> None:
    """Keras's thread pool for batch-end hooks with ``workers`` threads, in this process (a diagnostic).

    Keras makes the pool per fit with ``ThreadPoolExecutor()``, whose default is
    ``os.cpu_count() + 4`` threads (6 on 2 cores). A pool thread starts only when
    a hook is submitted and none is idle, so with steps faster than the hooks'
    wait for each step's logs, all of them start, and they share the
    interpreter lock with the training thread.
    """
    import concurrent.futures

    from keras.src.callbacks import callback_list

    on_begin = callback_list.CallbackList._on_begin

    def sized(self):
        fresh = self._executor is None
        on_begin(self)
        if fresh and self._executor is not None:
            self._executor.shutdown()  # it has no thread yet: they start on the first submit
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers)

    callback_list.CallbackList._on_begin = sized
