"""Overhead of InputBoundDetector: steps/second with and without it, interleaved.

A model with a short step (about 2 ms on an H100/H200 with the default size)
trains on in-memory arrays. Steady-state steps/second are timed from step 5 to
the end of the epoch (fit()'s set-up is reported apart). Runs with and without the detector (default settings)
alternate, ``--rounds`` times; the overhead is ``1 - median(with / without)``
of the per-round steps/second ratio. Goal: under 2% at the default settings.

    KERAS_BACKEND=jax python benchmarks/input_bound_overhead.py --out overhead.json
    python benchmarks/input_bound_overhead.py --backends tensorflow,jax,torch --quick --out overhead.json

Prints a table and writes JSON to ``--out``. ``--quick`` is the CPU setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _per_backend import run_per_backend


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="small model, few rounds (CPU)")
    p.add_argument("--backends", default=None, help="comma-separated; runs each in a subprocess")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per run")
    p.add_argument("--width", type=int, default=None, help="hidden width (sets the step time)")
    p.add_argument("--sample-every", type=int, default=100, help="the detector's default")
    return p.parse_args()


def _spawn(args) -> list:
    argv = ["--sample-every", str(args.sample_every)]
    for flag, value in (("--rounds", args.rounds), ("--steps", args.steps), ("--width", args.width)):
        if value:
            argv += [flag, str(value)]
    if args.quick:
        argv.append("--quick")
    return run_per_backend(__file__, args.backends, argv)


def run_backend(args) -> list:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    from keras_gpu_tools import backends as backends
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector

    backend = keras.backend.backend()
    quick = args.quick
    rounds = args.rounds or (5 if quick else 24)
    steps = args.steps or (300 if quick else 400)
    width = args.width or (256 if quick else 4096)
    batch, inputs = (64, 128) if quick else (2048, 64)

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((inputs,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
        + [keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(1e-4), "mse")
    rng = np.random.default_rng(0)
    x = rng.random((batch * steps, inputs), dtype="float32")
    y = rng.random((batch * steps, 1), dtype="float32")

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.times.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.end = time.perf_counter()  # after the framework's end-of-epoch sync

    setup = {False: [], True: []}

    def run(detector: bool) -> float:
        # Steady-state steps/second: from the start of step 5 to the end of
        # the epoch. fit()'s own set-up (and the detector's on_train_begin)
        # is reported apart, as set-up time.
        clock = Clock()
        # The clock comes first: its on_epoch_end must not include the detector's.
        cbs = (
            [clock, InputBoundDetector(log_dir=None, verbose=0, sample_every=args.sample_every)]
            if detector
            else [clock]
        )
        t = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=cbs)
        setup[detector].append(clock.times[0] - t)
        return (len(clock.times) - 5) / (clock.end - clock.times[5])

    run(False)
    run(True)  # compile both paths (TensorFlow traces the per-batch step once more)
    ratios, plain, withd = [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        rate = {d: run(d) for d in order}
        plain.append(rate[False])
        withd.append(rate[True])
        ratios.append(rate[True] / rate[False])
    gpus = backends.get(backend).gpu_devices()
    row = {
        "backend": backend,
        "device": gpus[0] if gpus else f"CPU ({os.cpu_count()} cores)",
        "steps_per_run": steps,
        "rounds": rounds,
        "sample_every": args.sample_every,
        "step_ms_without": 1e3 / statistics.median(plain),
        "steps_per_sec_without": statistics.median(plain),
        "steps_per_sec_with": statistics.median(withd),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "ratio_quartiles": statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else None,
        "overhead_percent": 100.0 * (1.0 - statistics.median(ratios)),
        "fit_setup_ms_without": 1e3 * statistics.median(setup[False]),
        "fit_setup_ms_with": 1e3 * statistics.median(setup[True]),
    }
    row["ok"] = row["overhead_percent"] < 2.0
    print(_row(row), flush=True)
    return [row]


HEADER = f"{'backend':<11}{'device':<36}{'step ms':>9}{'steps/s off':>13}{'steps/s on':>12}{'overhead %':>12}{'setup ms off/on':>17}  ok"


def _row(r) -> str:
    if "error" in r:
        return f"{r['backend']:<11} ERROR {r['error'][-300:]}"
    return (
        f"{r['backend']:<11}{r['device'][:35]:<36}{r['step_ms_without']:>9.3f}{r['steps_per_sec_without']:>13.1f}"
        f"{r['steps_per_sec_with']:>12.1f}{r['overhead_percent']:>12.2f}{r['fit_setup_ms_without']:>9.0f}/{r['fit_setup_ms_with']:<7.0f}  {'yes' if r['ok'] else 'NO'}"
    )


def main():
    args = _parse()
    started = time.time()
    if args.backends:
        results = _spawn(args)
        print(HEADER)
        for r in results:
            print(_row(r))
    else:
        print(HEADER, flush=True)
        results = run_backend(args)
    print(f"{time.time() - started:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "input_bound_overhead", "quick": args.quick, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
