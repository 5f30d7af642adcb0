"""All callbacks together against a bare fit() on a GPU, with an A/A run beside the A/B.

Why this method can resolve 1% where end-to-end pairs of fits could not (their
paired ratios spread by +-30% on the lent machines):

- The model is GPU-bound and fed little data: a small input (64 features)
  through wide Dense layers, so the device, not Keras's per-step host work
  (about 0.15 ms), sets the pace, and the host-to-device copy of a batch is a
  few hundred KB. Host noise then mostly hides behind the asynchronous
  device queue instead of showing in the step time.
- One model trains under every condition: ``bare_a``, ``bare_b`` (the A/A)
  and ``all`` (every callback of the package) differ only in the callbacks.
  Separate models would each be compiled, and on JAX each compilation
  autotunes its GEMMs on its own: two identical bare models can get different
  kernels and differ by a few percent for good (an A/A of 1.029 was seen that
  way). One model runs the same compiled step in every condition. It is
  compiled and warmed up first; then ``--rounds`` rounds run one short fit per
  condition, in a random order each round, so a slow phase of the machine hits
  every condition alike and no condition always follows the same one.
- Steady state only: each fit has two epochs of ``--steps`` steps and only
  the second is timed (compilation, the first epoch's warm-up and fit()'s
  set-up are out).
- Statistics that resist outliers: the per-condition median and the fastest
  round, and the median of the per-round ratios against ``bare_a`` (paired:
  both fits of a ratio ran within the same round, seconds apart). The A/A
  ratio ``bare_b / bare_a`` says how far two identical conditions differ with
  this procedure; a callback effect is real only where it is larger.

    KERAS_BACKEND=jax python benchmarks/gpu_overhead_aa.py --width 4096 --out results/gpu_overhead_aa_jax.json
    KERAS_BACKEND=torch python benchmarks/gpu_overhead_aa.py --width 6144 --out results/gpu_overhead_aa_torch.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import warnings

from _per_backend import CALLBACKS, callback_makers, write_json


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=200, help="steps per epoch (the second epoch is timed)")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument(
        "--conditions",
        default="bare_a,bare_b,all",
        help="comma-separated, from bare_a, bare_b, all and the single callbacks "
        "logger, detector, profiler, reducer (bare_a is the reference)",
    )
    return p.parse_args()


def main():
    args = _parse()
    warnings.simplefilter("ignore")
    import keras
    import numpy as np

    import keras_gpu_tools as kgt
    from keras_gpu_tools import backends

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self._t)  # logs were read: the device is done

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, 64)).astype("float32")
    y = rng.integers(0, 10, size=(args.batch * args.steps,)).astype("int32")
    tmp = tempfile.mkdtemp(prefix="kgt_gpu_aa_")

    def make(seed):
        keras.utils.set_random_seed(seed)
        layers = [keras.Input((64,))] + [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        model = keras.Sequential(layers + [keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    makers = callback_makers(tmp)
    short = ("logger", "detector", "profiler", "reducer", "live", "check")  # the CLI's names, in CALLBACKS' order
    singles = {name: makers[full] for name, full in zip(short, CALLBACKS)}

    def callbacks(name):
        if name in ("bare_a", "bare_b"):
            return []
        if name == "all":
            return [make_one() for make_one in singles.values()]
        if name.startswith("detector") and name[8:].isdigit():  # detector<N>: sample_every=N
            return [kgt.InputBoundDetector(log_dir=tmp, verbose=0, sample_every=int(name[8:]))]
        return [singles[name]()]

    model = make(0)
    setups = {n: callbacks(n) for n in args.conditions.split(",")}
    for cbs in setups.values():
        model.fit(x[: 20 * args.batch], y[: 20 * args.batch], batch_size=args.batch, verbose=0, callbacks=cbs)
    names = list(setups)
    times = {n: [] for n in names}
    order_rng = random.Random(0)
    for _ in range(args.rounds):
        order = order_rng.sample(names, len(names))
        for n in order:
            cbs = setups[n]
            clock = EpochClock()
            model.fit(x, y, batch_size=args.batch, epochs=2, verbose=0, shuffle=False, callbacks=[*cbs, clock])
            times[n].append(1e3 * clock.seconds[1] / args.steps)

    def ratios(n):
        return [b / a for a, b in zip(times["bare_a"], times[n])]

    gpus = backends.get().gpu_devices()
    result = {
        "backend": keras.backend.backend(),
        "device": gpus[0] if gpus else "CPU",
        "keras": keras.__version__,
        "width": args.width,
        "layers": args.layers,
        "batch": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "step_ms": {n: times[n] for n in names},
        "median_step_ms": {n: statistics.median(times[n]) for n in names},
        "fastest_step_ms": {n: min(times[n]) for n in names},
        "ratio_median": {n: statistics.median(ratios(n)) for n in names},
        "ratio_fastest": {n: min(times[n]) / min(times["bare_a"]) for n in names},
    }
    for key in ("median_step_ms", "fastest_step_ms", "ratio_median", "ratio_fastest"):
        print(key, {k: round(v, 4) for k, v in result[key].items()})
    write_json(args.out, result)


if __name__ == "__main__":
    main()
