"""InputBoundDetector under a retrace storm: is the compile time it reports the time the fit spent compiling?

What it measures: a small MLP (`--features` -> Dense(`--width`) -> 1) trains on a generator whose
batches take `--shapes` different sizes (2, 3, ..., each once a pass) for two epochs of one pass
each, with an `InputBoundDetector`. On JAX every new batch shape traces and compiles the step again
(TensorFlow relaxes the batch dimension and torch runs eager, so there the storm compiles nothing:
the run says so and checks only that the detector counts no retraces). Epoch 1 replays epoch 0's
batches with every shape compiled: the reference compile time is epoch 0's wall time less epoch
1's (the same batches and steps, less the compiles). Against it: the detector's compile time of
epoch 0 (`step/compile_seconds` in History) and its retraces.

Output: the epochs' wall times, the reference, the detector's compile and retraces, its largest
part, its advice, and `compile_ratio` (the detector's over the reference). Goals (a full run exits
non-zero when one is missed): `compile_ratio` within 10% of 1; the retraces one fewer than the
shapes; the largest part "retraces"; the advice names the shapes' remedy (`drop_remainder`, padding
or buckets) and never `steps_per_execution`. `--smoke` runs 12 shapes on the CPU and checks only
that every figure was computed.

    python benchmarks/retrace_storm.py --backend jax                 # a GPU: 300 shapes
    python benchmarks/retrace_storm.py --backend jax --smoke
"""

from __future__ import annotations

import sys

import _common

BENCHMARK = "retrace_storm"
TOLERANCE = 0.10  # the detector's compile within 10% of the reference


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=int, default=300, help="distinct batch sizes, 2 upwards, each once a pass")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    args = p.parse_args()
    if args.smoke:
        args.shapes, args.width = 12, 32
    return args


def measure(args) -> dict:
    import keras
    import numpy as np

    from keras_gpu_tools import InputBoundDetector

    compiles = keras.backend.backend() == "jax"  # a jitted step compiles once per batch shape
    sizes = list(range(2, 2 + args.shapes))
    rng = np.random.default_rng(0)
    batches = [(rng.random((n, args.features), dtype="float32"), rng.random((n, 1), dtype="float32")) for n in sizes]

    def storm():
        while True:
            yield from batches

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((args.features,)), keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile("sgd", "mse")
    detector = InputBoundDetector(log_dir=None, verbose=0)
    times: list[float] = []  # each epoch's wall time, printed as it ends (a long storm shows its progress)
    shown = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: print(f"epoch {e}: {times[-1]:.2f} s", flush=True)
    )
    history = model.fit(
        storm(),
        steps_per_epoch=len(sizes),
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[detector, _common.epoch_clock(times), shown],
    )
    logged = history.history["step/compile_seconds"]  # the History keys users read
    retraces = history.history["step/retraces"]
    fb = detector.breakdown
    reference = times[0] - times[1]
    return {
        "compiles": compiles,
        "shapes": len(sizes),
        "epoch_seconds": [round(t, 3) for t in times],
        "reference_compile_seconds": round(reference, 3),
        "detector_compile_seconds": [round(float(v), 3) for v in logged],
        "retraces": [int(v) for v in retraces],
        "compile_ratio": round(float(logged[0]) / reference, 4) if reference > 0 else None,
        "largest": None if fb is None else fb.largest,
        "advice": [] if fb is None else list(fb.advice),
    }


def main() -> int:
    args = _parse()
    result = _common.measure_and_save(args, BENCHMARK, measure)
    check = _common.Checks(args)
    check(len(result["epoch_seconds"]) == 2, f"two epochs timed ({result['epoch_seconds']})")
    if not result["compiles"]:
        check(result["retraces"] == [0, 0], f"no retraces where the step does not compile per shape ({result})")
        print("this backend compiles nothing per batch shape: no compile time to check")
        return check.exit_code()
    check.figure("reference_compile_seconds", result["reference_compile_seconds"], 0.0)
    check.figure("compile_ratio", result["compile_ratio"], 0.0)
    ratio, advice = result["compile_ratio"], " ".join(result["advice"])
    check.goal(ratio is not None and abs(ratio - 1) <= TOLERANCE, f"compile_ratio within 10% of 1 ({ratio})")
    want = [result["shapes"] - 1, 0]
    check.goal(result["retraces"] == want, f"retraces {want} ({result['retraces']})")
    check.goal(result["largest"] == "retraces", f"the largest part is 'retraces' ({result['largest']})")
    remedy = any(w in advice for w in ("drop_remainder", "pad", "bucket"))
    check.goal(remedy, "the advice names a remedy for the shapes (drop_remainder, padding or buckets)")
    check.goal("steps_per_execution" not in advice, "no steps_per_execution advice")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
