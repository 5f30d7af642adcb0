"""Overhead of GPUUtilizationLogger: steps/second with and without it.

Runs are interleaved (off, on, off, on, ...) on one compiled model so drift in
clocks or temperature hits both sides alike; the ratio of medians is reported.

    KERAS_BACKEND=jax python benchmarks/gpu_logger_overhead.py --out result.json
    python benchmarks/gpu_logger_overhead.py --quick            # CPU smoke run
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from keras_gpu_tools import GPUUtilizationLogger  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=1000, help="steps per timed fit")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke run")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.quick:
        a.width, a.depth, a.batch, a.steps, a.repeats = 64, 2, 64, 1500, 5

    rng = np.random.default_rng(0)
    x = rng.normal(size=(a.batch * 8, a.width)).astype("float32")
    y = rng.normal(size=(a.batch * 8, a.width)).astype("float32")
    ds_x = np.concatenate([x] * (a.steps // 8 + 1))[: a.batch * a.steps]
    ds_y = np.concatenate([y] * (a.steps // 8 + 1))[: a.batch * a.steps]
    model = keras.Sequential([keras.Input((a.width,))] + [keras.layers.Dense(a.width) for _ in range(a.depth)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ds_x[: a.batch * 20], ds_y[: a.batch * 20], batch_size=a.batch, verbose=0)  # compile

    times = {"off": [], "on": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(-1, a.repeats):  # r = -1: one untimed warm-up pair
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                cbs = [GPUUtilizationLogger(log_dir=None, interval=a.interval)] if mode == "on" else []
                t0 = time.perf_counter()
                model.fit(ds_x, ds_y, batch_size=a.batch, epochs=1, verbose=0, callbacks=cbs)
                if r >= 0:
                    times[mode].append(time.perf_counter() - t0)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    ratios = [f / n for f, n in zip(times["off"], times["on"])]  # paired, same order
    result = {
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "machine": platform.node(),
        "gpu": _gpu_name(),
        "step_ms_without": 1000 * off / a.steps,
        "step_ms_with": 1000 * on / a.steps,
        "throughput_ratio_with_over_without": off / on,
        "overhead_percent": 100 * (on / off - 1),
        "paired_ratio_min_median_max": [min(ratios), statistics.median(ratios), max(ratios)],
        "config": vars(a),
        "times_s": times,
    }
    print(f"backend={result['backend']} gpu={result['gpu']} step={result['step_ms_without']:.3f} ms "
          f"with/without steps/s = {result['throughput_ratio_with_over_without']:.4f} "
          f"(overhead {result['overhead_percent']:+.2f}%)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


def _gpu_name():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    except Exception:
        return "none"


if __name__ == "__main__":
    main()
