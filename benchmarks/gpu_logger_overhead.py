"""Overhead of GPUUtilizationLogger: steps/second with and without it.

Runs are interleaved (off, on, off, on, ...) on one compiled model so drift in
clocks or temperature hits both sides alike; the ratio of medians is reported.

    KERAS_BACKEND=jax python benchmarks/gpu_logger_overhead.py --out result.json
    python benchmarks/gpu_logger_overhead.py --quick            # CPU smoke run
    python benchmarks/gpu_logger_overhead.py --micro            # cost per step and per sample

`--micro` measures the two things the logger can cost training, directly: the
time of its per-step hook (`on_train_batch_end`, run by the training thread),
and the CPU time its sampling thread spends per sample (Python work that
holds the GIL; the NVML calls themselves release it). With the real NVML where
there is one, else a fake NVML whose calls block like the real ones.
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
    p.add_argument("--micro", action="store_true", help="per-step and per-sample costs instead of fits")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.micro:
        return micro(a)
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
    print(
        f"backend={result['backend']} gpu={result['gpu']} step={result['step_ms_without']:.3f} ms "
        f"with/without steps/s = {result['throughput_ratio_with_over_without']:.4f} "
        f"(overhead {result['overhead_percent']:+.2f}%)"
    )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


def micro(a):
    import threading

    from keras_gpu_tools.telemetry.nvml import NVML

    cb = GPUUtilizationLogger(log_dir=None, interval=a.interval)
    n = 1_000_000
    t0 = time.perf_counter()
    for i in range(n):
        cb.on_train_batch_end(i)
    hook_ns = (time.perf_counter() - t0) / n * 1e9

    nvml = NVML()
    source = "real NVML"
    if not nvml.available():
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tests.helpers.fake_nvml import FakeGPU, FakeNVML

        nvml = NVML(FakeNVML([FakeGPU(delay=0.004)]))  # utilization blocks 4 ms, as measured on an H200
        source = "fake NVML (blocking 4 ms per utilization query)"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    cb = GPUUtilizationLogger(log_dir=None, interval=a.interval, nvml=nvml)
    cb.set_model(model)
    cpu = []
    wall = []
    real_tick = cb._tick

    def timed_tick():
        c, w = time.thread_time(), time.perf_counter()
        real_tick()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)

    cb._tick = timed_tick
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cb.on_train_begin()
        time.sleep(max(3.0, 20 * a.interval))
        cb.on_train_end()
    cpu_ms = 1000 * statistics.median(cpu[1:])
    result = {
        "backend": keras.backend.backend(),
        "machine": platform.node(),
        "nvml": source,
        "gpu": _gpu_name(),
        "per_step_hook_ns": hook_ns,
        "samples": len(cpu),
        "sample_cpu_ms_median": cpu_ms,
        "sample_wall_ms_median": 1000 * statistics.median(wall[1:]),
        "sampling_thread_cpu_share_at_interval": cpu_ms / (1000 * a.interval),
        "interval_s": a.interval,
        "threads_left": [t.name for t in threading.enumerate() if t.name.startswith("keras_gpu_tools")],
    }
    print(
        f"per-step hook: {hook_ns:.0f} ns; per sample ({source}): {cpu_ms:.3f} ms CPU, "
        f"{result['sample_wall_ms_median']:.1f} ms wall; sampling thread holds "
        f"{100 * result['sampling_thread_cpu_share_at_interval']:.2f}% of one core at interval {a.interval} s"
    )
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
