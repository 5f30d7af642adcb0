"""ProfilerWindow with steps_per_execution=8 against the same fit at 1: the window's figures are per step at both.

What it measures: a model whose FLOPs sit in one layer (`--features` -> Dense(`--heavy`) "heavy"
-> 64 -> a shared Dense(64) twice -> 10, batch `--batch`) trains with a `ProfilerWindow` of
`--steps` steps from step `--start`, once with `steps_per_execution=1` and once with `--spe`,
`--rounds` times each, interleaved, in one epoch. Each fit gives the window's mean step time
(`WindowCapture.mean_step_ms`: its wall time over its steps, the last step's device work included)
and the heavy layer's ms per step in its layer table. Beside them, each round runs the same fit
without the window: `fit_step_ms` is its time per step over the same steps (Keras's batch hooks,
one per call, from the call that runs the window's first step to the end of the one that runs its
last, each reading after the device has run the calls that ended); `profiled_fit_step_ms` is that
clock in the fit with the window, over the window's calls but its first and last (in which the
profiler starts and stops, which the window's own time leaves out). TensorFlow and JAX (Keras's
torch backend runs one step per call).

Output: per setting, the median over its rounds of `mean_step_ms`, `fit_step_ms`,
`profiled_fit_step_ms` and `heavy_ms_per_step`, and every round's figures; `mean_step_ratio`,
`fit_step_ratio` and `heavy_ratio` (at `--spe` over at 1); per setting, `window_over_profiled_fit`
(the window's mean step over the profiled fit's own clock) and, for information, `window_over_fit`
(over the fit's clock without the window: what profiling costs a step). Goals (a full run exits
non-zero when one is missed), each within 10% of 1: `heavy_ratio` (the device's work per step is the
same at both settings) and `window_over_profiled_fit` at each setting (the window's mean step is its
steps' time, per step, not per call). The wall time per step is not the same at both settings (fewer
calls cost the host less per step, and profiling costs a step more or less by setting), so
`mean_step_ratio` is information, beside the fit's own `fit_step_ratio`. Every run checks that each window covered exactly `--steps`
steps and that the layer table has the heavy layer with time; `--smoke` runs tiny sizes on the CPU
and checks only that and that every figure was computed.

    python benchmarks/profiler_window_spe.py --backend jax          # a GPU: 4096 -> 8192, batch 1024
    python benchmarks/profiler_window_spe.py --backend tensorflow --smoke
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import _common

BENCHMARK = "profiler_window_spe"


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--features", type=int, default=4096)
    p.add_argument("--heavy", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--spe", type=int, default=8, help="steps_per_execution compared with 1")
    p.add_argument("--start", type=int, default=16, help="the window's first step (a multiple of --spe)")
    p.add_argument("--steps", type=int, default=32, help="steps in the window (a multiple of --spe)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.smoke:
        args.features, args.heavy, args.batch, args.spe, args.start, args.steps, args.rounds = 32, 256, 16, 4, 4, 12, 1
    return args


def _clocks(keras, per_epoch: int, start: int, steps: int):
    """The fit's own time from the call that runs step ``start`` to the end of the one that runs step ``start + steps - 1``.

    Two callbacks sharing one span, Keras's batch hooks, one per call. Each reading waits for the device on
    the loss of the last call that ended: a scalar, so the clock copies nothing else back.
    """
    span: dict = {}

    def now() -> float:  # after the device has run every call that ended so far
        logs = span.get("logs") or {}
        if "loss" in logs:
            keras.ops.convert_to_numpy(logs["loss"])
        return time.perf_counter()

    class Clock(keras.callbacks.Callback):
        epoch = 0

        def __init__(self, hook: str):
            super().__init__()
            self.hook = hook

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.hook == "begin" and self.epoch * per_epoch + batch == start:
                span["t0"] = now()

        def on_train_batch_end(self, batch, logs=None):
            if self.hook != "end":
                return
            span["logs"] = logs
            if self.epoch * per_epoch + batch == start + steps - 1:
                span["t1"] = now()

    return Clock("end"), Clock("begin"), span


def _per_step(span: dict, steps: int) -> float | None:
    return (span["t1"] - span["t0"]) * 1e3 / steps if "t0" in span and "t1" in span else None


def _fit(args, spe: int, profiled: bool = True) -> dict:
    import keras
    import numpy as np

    from keras_gpu_tools import ProfilerWindow

    keras.utils.set_random_seed(0)
    shared = keras.layers.Dense(64, activation="relu", name="shared")
    inputs = keras.Input((args.features,))
    h = keras.layers.Dense(args.heavy, activation="relu", name="heavy")(inputs)
    h = shared(shared(keras.layers.Dense(64, activation="relu", name="proj")(h)))
    model = keras.Model(inputs, keras.layers.Dense(10, name="head")(h))
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy", steps_per_execution=spe)
    # One epoch holds the window and a call after it: no epoch's end falls between the fit clock's two readings.
    per_epoch = -(-(args.start + args.steps + args.spe) // args.spe) * args.spe
    x = np.random.default_rng(0).random((per_epoch * args.batch, args.features), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, per_epoch * args.batch)
    epochs = 1
    if profiled:  # the window's calls but its first and last, which start and stop the profiler
        ends, begins, span = _clocks(keras, per_epoch, args.start + spe, args.steps - 2 * spe)
    else:
        ends, begins, span = _clocks(keras, per_epoch, args.start, args.steps)
    if not profiled:  # the same steps of the same fit without the window: what the window's figures stand for
        model.fit(x, y, batch_size=args.batch, epochs=epochs, verbose=0, shuffle=False, callbacks=[ends, begins])
        return {"fit_step_ms": _per_step(span, args.steps)}
    with tempfile.TemporaryDirectory(prefix="kgt_spe_") as log_dir:
        cb = ProfilerWindow(log_dir, start_step=args.start, num_steps=args.steps, analyze=False, verbose=0)
        model.fit(x, y, batch_size=args.batch, epochs=epochs, verbose=0, shuffle=False, callbacks=[ends, cb, begins])
        table = cb.layer_table()
    cap = cb.captures[0] if cb.captures else None
    heavy = next((r for r in table.rows if r.path == "heavy"), None) if table is not None else None
    return {
        "start": None if cap is None else cap.start_step,
        "steps": None if cap is None else cap.num_steps,
        "calls": None if cap is None else cap.calls,
        "mean_step_ms": None if cap is None else cap.mean_step_ms,
        "profiled_fit_step_ms": _per_step(span, args.steps - 2 * spe),
        "heavy_ms_per_step": None if heavy is None else heavy.ms_per_step,
        "table_steps": None if table is None else table.num_steps,
        "table_error": "no table" if table is None else table.error,
    }


def measure(args) -> dict:
    rounds: dict[int, list[dict]] = {1: [], args.spe: []}
    for _ in range(args.rounds):
        for spe in rounds:  # interleaved: the machine's drift hits both alike
            rounds[spe].append({**_fit(args, spe, profiled=False), **_fit(args, spe)})
    out: dict = {"rounds": {str(k): v for k, v in rounds.items()}}
    for spe, runs in rounds.items():
        for key in ("mean_step_ms", "fit_step_ms", "profiled_fit_step_ms", "heavy_ms_per_step"):
            values = [r[key] for r in runs if r[key] is not None]
            out[f"{key}_spe{spe}"] = round(statistics.median(values), 3) if values else None
        for ref in ("fit_step_ms", "profiled_fit_step_ms"):
            ratios = [r["mean_step_ms"] / r[ref] for r in runs if r["mean_step_ms"] and r[ref]]
            name = "window_over_fit" if ref == "fit_step_ms" else "window_over_profiled_fit"
            out[f"{name}_spe{spe}"] = round(statistics.median(ratios), 4) if ratios else None
    pairs = (
        ("mean_step_ms", "mean_step_ratio"),
        ("fit_step_ms", "fit_step_ratio"),
        ("heavy_ms_per_step", "heavy_ratio"),
    )
    for key, name in pairs:
        a, b = out[f"{key}_spe1"], out[f"{key}_spe{args.spe}"]
        out[name] = round(b / a, 4) if a and b else None
    return out


def main() -> int:
    args = _parse()
    result = _common.measure_and_save(args, BENCHMARK, measure)
    check = _common.Checks(args)
    for spe, runs in result["rounds"].items():
        for r in runs:
            check(r["steps"] == args.steps and r["table_steps"] == args.steps, f"spe={spe}: {args.steps} steps ({r})")
            check(r["start"] == args.start, f"spe={spe}: the window starts at step {args.start} ({r['start']})")
            check(not r["table_error"] and bool(r["heavy_ms_per_step"]), f"spe={spe}: the heavy layer has time ({r})")
    for name in (
        "mean_step_ratio",
        "fit_step_ratio",
        *(f"window_over_fit_spe{spe}" for spe in result["rounds"]),
    ):
        check.figure(name, result.get(name), 0.0)  # information
    # The goals: per step at both settings. The device's work per step is the same, so the heavy layer's ms
    # per step is too. The wall time per step is not: fewer calls cost the host less per step, and profiling
    # costs a step more or less by setting; so the window's mean step is held to the same fit's own clock.
    goals = {
        "heavy_ratio": result.get("heavy_ratio"),
        **{
            f"window_over_profiled_fit_spe{spe}": result.get(f"window_over_profiled_fit_spe{spe}")
            for spe in result["rounds"]
        },
    }
    for name, ratio in goals.items():
        check.figure(name, ratio, 0.0)
        check.goal(ratio is not None and abs(ratio - 1) <= 0.10, f"{name} within 10% of 1 ({ratio})")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
