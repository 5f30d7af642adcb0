"""Accuracy of InputBoundDetector against pipelines of known input delay.

For each backend, a model of fixed step time is trained on a PyDataset whose
``__getitem__`` waits a known time per batch (a sleep, or with ``--busy`` a
deterministic busy loop). The delay is chosen so the true wait fraction covers
0% to 90%. The truth is measured independently of the detector:
``1 - T0 / T``, where ``T0`` is the time per step without delay and ``T`` the
time per step with it (``T`` timed in the detector's own run, ``T0`` in runs
without delay just before and after it), so it holds whether or not the
framework overlaps input and compute. The detector runs on the same
pipeline with its default settings. Goal: within 5 percentage points, and the
same verdict category.

    KERAS_BACKEND=jax python benchmarks/input_bound_accuracy.py --out acc.json
    python benchmarks/input_bound_accuracy.py --backends tensorflow,jax,torch --quick --out acc.json

Prints a table and writes JSON to ``--out``. ``--quick`` is the CPU setting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from _per_backend import run_per_backend

TARGETS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--quick", action="store_true", help="small model and few steps (CPU)")
    p.add_argument("--backends", default=None, help="comma-separated; runs each in a subprocess")
    p.add_argument("--steps", type=int, default=None, help="steps per run")
    p.add_argument("--busy", action="store_true", help="busy-loop delays instead of sleeps")
    p.add_argument("--repeats", type=int, default=None, help="truth runs per case")
    return p.parse_args()


def _spawn(args) -> list:
    argv = ["--quick"] if args.quick else []
    argv += ["--busy"] if args.busy else []
    argv += ["--steps", str(args.steps)] if args.steps else []
    argv += ["--repeats", str(args.repeats)] if args.repeats else []
    return run_per_backend(__file__, args.backends, argv)


def run_backend(args) -> list:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.input import categories

    backend = keras.backend.backend()
    quick = args.quick
    steps = args.steps or (60 if quick else 120)
    repeats = args.repeats or (1 if quick else 2)
    # A small input (little to copy per batch) and wide hidden layers: the
    # pipeline's own cost stays small against the injected delay.
    width, depth, batch, inputs = (512, 3, 128, 32) if quick else (4096, 4, 1024, 64)

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((inputs,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        + [keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    rng = np.random.default_rng(0)
    xs = rng.random((batch, inputs), dtype="float32")
    ys = rng.random((batch, 1), dtype="float32")

    def wait(seconds):
        if seconds <= 0:
            return
        if args.busy:
            t = time.perf_counter()
            while time.perf_counter() - t < seconds:
                pass
        else:
            time.sleep(seconds)

    class Delayed(keras.utils.PyDataset):
        def __init__(self, delay, n):
            super().__init__(workers=1, use_multiprocessing=False)
            self.delay, self.n = delay, n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            wait(self.delay)
            return xs, ys

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.times.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.end = time.perf_counter()  # after the framework's end-of-epoch sync

        def per_step(self, skip=3):
            # From the start of step `skip` to the end of the epoch: the
            # device has finished every step by then (JAX dispatches ahead).
            return (self.end - self.times[skip]) / (len(self.times) - skip)

    def timed(delay):
        clock = Clock()
        model.fit(Delayed(delay, steps), epochs=1, verbose=0, callbacks=[clock])
        return clock.per_step()

    timed(0.0)  # compile and warm up
    base = [timed(0.0) for _ in range(2)]
    t0 = min(base)
    results = []
    for target in TARGETS:
        delay = target / (1.0 - target) * t0 if target < 1 else 0.0
        truths, measured, details = [], [], []
        for _ in range(repeats):
            # The detector's run is timed by the same clock as the runs
            # without delay that bracket it: truth = 1 - T0 / T.
            tb1 = timed(0.0)
            det = InputBoundDetector(log_dir=None, verbose=0, window=10**9)
            clock = Clock()
            # The clock first: its on_epoch_end must not include the detector's
            # (which computes the FLOPs once per fit on JAX).
            model.fit(Delayed(delay, steps), epochs=1, verbose=0, callbacks=[clock, det])
            tb2 = timed(0.0)
            truths.append(max(0.0, 1.0 - 0.5 * (tb1 + tb2) / clock.per_step()))
            measured.append(det.measurement.wait_fraction)
            details.append(
                {
                    k: getattr(det.measurement, k)
                    for k in ("fetch", "compute", "other", "step", "wait", "sampled_steps", "overlapped")
                }
            )
        truth = float(np.median(truths))
        got = float(np.median(measured))
        row = {
            "backend": backend,
            "device": _device(backend),
            "target": target,
            "delay_ms": 1e3 * delay,
            "base_step_ms": 1e3 * t0,
            "truth": truth,
            "measured": got,
            "error_pp": 100.0 * (got - truth),
            "truth_category": categories.classify(truth),
            "measured_category": categories.classify(got),
            "delay_kind": "busy" if args.busy else "sleep",
            "steps": steps,
            "detector": details,
        }
        row["ok"] = abs(row["error_pp"]) <= 5.0 and row["truth_category"] == row["measured_category"]
        results.append(row)
        print(_row(row), flush=True)
    return results


def _device(backend) -> str:
    try:
        from keras_gpu_tools import backends as backends

        gpus = backends.get(backend).gpu_devices()
        return gpus[0] if gpus else f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    except Exception:
        return "unknown"


HEADER = f"{'backend':<11}{'target':>7}{'delay ms':>10}{'step0 ms':>10}{'truth':>8}{'measured':>10}{'err pp':>8}  {'truth verdict':<24}{'measured verdict':<24}ok   fetch/compute/step ms"


def _row(r) -> str:
    if "error" in r:
        return f"{r['backend']:<11} ERROR {r['error'][-200:]}"
    return (
        f"{r['backend']:<11}{r['target']:>7.2f}{r['delay_ms']:>10.2f}{r['base_step_ms']:>10.2f}{r['truth']:>8.3f}"
        f"{r['measured']:>10.3f}{r['error_pp']:>8.1f}  {r['truth_category']:<24}{r['measured_category']:<24}{'yes' if r['ok'] else 'NO ':<5}"
        + "/".join(
            "n/a" if d.get(k) is None else f"{1e3 * d[k]:.2f}"
            for d in r.get("detector", [])[:1]
            for k in ("fetch", "compute", "step")
        )
    )


def main():
    args = _parse()
    started = time.time()
    if args.backends:
        results = _spawn(args)
    else:
        print(HEADER, flush=True)
        results = run_backend(args)
    if args.backends:
        print(HEADER)
        for r in results:
            print(_row(r))
    ok = [r.get("ok", False) for r in results]
    errs = [abs(r["error_pp"]) for r in results if "error_pp" in r]
    summary = {
        "cases": len(results),
        "ok": sum(ok),
        "max_abs_error_pp": max(errs) if errs else None,
        "seconds": time.time() - started,
    }
    print(
        f"{summary['ok']}/{summary['cases']} cases within 5 pp with the right verdict; max |error| {summary['max_abs_error_pp']:.1f} pp; {summary['seconds']:.0f} s"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"benchmark": "input_bound_accuracy", "quick": args.quick, "summary": summary, "results": results},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
