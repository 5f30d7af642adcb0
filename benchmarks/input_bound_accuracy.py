"""Accuracy of InputBoundDetector against input pipelines of known delay.

What it measures: how far the detector's `wait_fraction` (the share of the step spent waiting
for input) is from the truth, and whether its verdict ("not", "moderately", "highly input-bound")
is the truth's, for delays that make the true wait fraction 0% to 90%.

How: a model of fixed step time trains on a PyDataset whose `__getitem__` waits a known time per
batch (a sleep, or with `--busy` a busy loop). The truth is measured independently of the
detector: `1 - T0 / T`, with `T` the time per step in the detector's own run and `T0` the time
per step of runs without delay just before and after it, so it holds whether or not the
framework overlaps input and compute. The detector runs with its default settings. Goal: within
5 percentage points, with the right verdict.

Output: a table, one row per target (truth, measured, error in points, both verdicts, ok), and
`summary.ok` of `summary.cases` in the result file. At delays under one step the truth itself
moves by several points between runs (JAX dispatches ahead and hides a small fetch): read the
misses there against that spread.

A full run exits non-zero unless every case is within 5 points with the right verdict, and names
the cases that are not. Every run checks that each case's truth and wait fraction were measured
(finite, within [0, 1]) with a verdict; a smoke run (the 0% and 90% targets, a small model on a
CPU) also that a 90% wait reads at least 0.5 and at least 40 points over the 0% case (the detector
tells them apart), and prints the 5-point goal unenforced. Its distance from the truth is not
checked there: on a loaded 2-core machine a 20-step run read a true 89% wait as 58%.

    python benchmarks/input_bound_accuracy.py --backend jax              # a GPU
    python benchmarks/input_bound_accuracy.py --backend torch --smoke    # CPU check, seconds
"""

from __future__ import annotations

import math
import sys
import time

import _common

BENCHMARK = "input_bound_accuracy"
TARGETS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
SMOKE_TARGETS = (0.0, 0.9)


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 120; --smoke 20)")
    p.add_argument("--repeats", type=int, default=None, help="detector runs per target (default 2; --smoke 1)")
    p.add_argument("--busy", action="store_true", help="busy-loop delays instead of sleeps")
    p.add_argument("--small", action="store_true", help="the CPU-sized model (implied by --smoke)")
    return p.parse_args()


def measure(args) -> list[dict]:
    import keras
    import numpy as np

    from keras_gpu_tools import InputBoundDetector

    backend = keras.backend.backend()
    small = args.small or args.smoke
    steps = args.steps or (20 if args.smoke else 120)
    repeats = args.repeats or (1 if args.smoke else 2)
    # A small input (little to copy per batch) and wide hidden layers: the
    # pipeline's own cost stays small against the injected delay.
    width, depth, batch, inputs = (512, 3, 128, 32) if small else (4096, 4, 1024, 64)

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
            # From the start of step `skip` to the end of the epoch: the device has
            # finished every step by then (JAX dispatches ahead).
            return (self.end - self.times[skip]) / (len(self.times) - skip)

    def timed(delay):
        clock = Clock()
        model.fit(Delayed(delay, steps), epochs=1, verbose=0, callbacks=[clock])
        return clock.per_step()

    timed(0.0)  # compile and warm up
    t0 = min(timed(0.0) for _ in range(2))
    device = (_common.gpu_devices() or ["CPU"])[0]
    results = []
    print(HEADER, flush=True)
    for target in SMOKE_TARGETS if args.smoke else TARGETS:
        delay = target / (1.0 - target) * t0
        truths, measured, details = [], [], []
        for _ in range(repeats):
            # The detector's run is timed by the same clock as the runs without
            # delay that bracket it: truth = 1 - T0 / T.
            tb1 = timed(0.0)
            det = InputBoundDetector(log_dir=None, verbose=0, window=10**9)
            clock = Clock()
            # The clock first: its on_epoch_end must not include the detector's.
            model.fit(Delayed(delay, steps), epochs=1, verbose=0, callbacks=[clock, det])
            tb2 = timed(0.0)
            truths.append(max(0.0, 1.0 - 0.5 * (tb1 + tb2) / clock.per_step()))
            m = det.measurement
            measured.append(m.wait_fraction if m is not None else math.nan)
            details.append(
                {k: getattr(m, k, None) for k in ("fetch", "compute", "other", "step", "wait", "sampled_steps")}
            )
        truth = float(np.median(truths))
        got = float(np.median(measured))
        row = {
            "backend": backend,
            "device": device,
            "target": target,
            "delay_ms": 1e3 * delay,
            "base_step_ms": 1e3 * t0,
            "truth": truth,
            "measured": got,
            "error_pp": 100.0 * (got - truth),
            "truth_verdict": _common.verdict(truth),
            "measured_verdict": _common.verdict(got) if math.isfinite(got) else None,
            "delay_kind": "busy" if args.busy else "sleep",
            "steps": steps,
            "detector": details,
        }
        row["ok"] = abs(row["error_pp"]) <= 5.0 and row["truth_verdict"] == row["measured_verdict"]
        results.append(row)
        print(_row(row), flush=True)
    return results


HEADER = (
    f"{'backend':<11}{'target':>7}{'delay ms':>10}{'step0 ms':>10}{'truth':>8}{'measured':>10}{'err pp':>8}  "
    f"{'truth verdict':<24}{'measured verdict':<24}ok"
)


def _row(r) -> str:
    return (
        f"{r['backend']:<11}{r['target']:>7.2f}{r['delay_ms']:>10.2f}{r['base_step_ms']:>10.2f}{r['truth']:>8.3f}"
        f"{r['measured']:>10.3f}{r['error_pp']:>8.1f}  {r['truth_verdict']:<24}{str(r['measured_verdict']):<24}"
        f"{'yes' if r['ok'] else 'NO'}"
    )


def main() -> int:
    args = _parse()
    backend = _common.setup(args)
    out = _common.out_path(args, BENCHMARK)
    started = time.time()
    results = measure(args)
    errors = [abs(r["error_pp"]) for r in results if math.isfinite(r["error_pp"])]
    summary = {
        "cases": len(results),
        "ok": sum(r["ok"] for r in results),
        "max_abs_error_pp": max(errors) if errors else None,
        "seconds": round(time.time() - started, 1),
    }
    print(f"{summary['ok']}/{summary['cases']} cases within 5 pp with the right verdict; {summary['seconds']} s")
    doc = {**_common.environment(backend), "args": vars(args), "summary": summary}
    _common.save(out, BENCHMARK, backend, {**doc, "results": results})
    print("written to", out)

    check = _common.Checks(args)
    check(len(results) == len(SMOKE_TARGETS if args.smoke else TARGETS), f"every target measured ({len(results)})")
    check(all(0.0 <= r["truth"] <= 1.0 for r in results), "every true wait fraction is within [0, 1]")
    check(all(0.0 <= r["measured"] <= 1.0 for r in results), "every measured wait fraction is within [0, 1]")
    check(all(r["measured_verdict"] for r in results), "every case has a verdict")
    if args.smoke:  # coarse: the smoke run shows the detector measures, not that it meets the goal
        high = results[-1]
        check(high["measured"] >= 0.5, f"a 90% input wait reads >= 0.5 (read {high['measured']:.3f})")
        apart = 100.0 * (high["measured"] - results[0]["measured"])
        check(apart >= 40.0, f"a 90% input wait reads at least 40 points over a 0% one ({apart:.1f})")
    missed = [
        f"{100 * r['target']:.0f}%: {r['error_pp']:+.1f} pp"
        + ("" if r["truth_verdict"] == r["measured_verdict"] else f", '{r['measured_verdict']}'")
        for r in results
        if not r["ok"]
    ]
    check.goal(
        not missed,
        f"every case within 5 points with the right verdict ({summary['ok']}/{summary['cases']}; "
        f"missed: {'; '.join(missed) or 'none'})",
    )
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
