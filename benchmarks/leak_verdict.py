"""MemoryLeakDetector's verdict on real fits: steady leaks of known size, and runs that must stay stable.

What it measures: for each case, a fresh process fits a small dense model for `--epochs` epochs (30)
with `MemoryLeakDetector` and reads its verdict, its host growth rate and the host RSS of every epoch:

- `leak_<r>`: a callback keeps a new tensor of `r` MiB at each epoch's end (`keras.ops.full`, so the
  memory is written and resident), for `r` in `--rates` (0.5, 1, 4, 24);
- `clean`: the same fit, nothing kept;
- `tf_data_cache`: a `tf.data` pipeline with an in-memory `cache()` that fills over the first epochs
  (`steps_per_epoch` covers a quarter of the data), then holds;
- `bounded_cache`: a callback with an LRU cache of 8 arrays of 2 MiB, full after 8 epochs.

Goals: every leak "grows" with its rate within 20%; the other cases "stable". `--smoke` runs
`clean` and `leak_24` for 8 epochs and checks only that the verdicts came back.

Output: per case `category`, `host_mib_per_epoch`, `message`, `rss_mib` (per epoch).

    python benchmarks/leak_verdict.py --backend jax     # a backend per run: about a minute on 2 cores
    python benchmarks/leak_verdict.py --smoke
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import _common

BENCHMARK = "leak_verdict"

# The child: one case's fit in a process of its own (memory a previous case freed would hide a leak).
CHILD = textwrap.dedent(
    """
    import functools, json, sys
    import keras
    import numpy as np
    from keras_gpu_tools import MemoryLeakDetector

    case, epochs = sys.argv[1], int(sys.argv[2])

    class Keep(keras.callbacks.Callback):
        def __init__(self, mib):
            super().__init__()
            self.mib, self.kept = mib, []
        def on_epoch_end(self, epoch, logs=None):
            self.kept.append(keras.ops.full((int(self.mib * 2**20) // 4,), float(epoch + 1), dtype="float32"))

    class Bounded(keras.callbacks.Callback):
        @functools.lru_cache(maxsize=8)
        def table(self, epoch):
            return np.full((2**19,), float(epoch), dtype="float32")  # 2 MiB, written
        def on_epoch_end(self, epoch, logs=None):
            self.table(epoch)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 16)).astype("float32"), rng.normal(size=(256, 1)).astype("float32")
    det = MemoryLeakDetector(log_dir=None, verbose=0)
    callbacks, fit = [det], dict(x=x, y=y, batch_size=32)
    if case.startswith("leak_"):
        callbacks.insert(0, Keep(float(case[5:])))
    elif case == "bounded_cache":
        callbacks.insert(0, Bounded())
    elif case == "tf_data_cache":
        import tensorflow as tf
        big = rng.normal(size=(8192, 16)).astype("float32")  # 0.5 MiB; a quarter read per epoch
        ds = tf.data.Dataset.from_tensor_slices((big, big[:, :1])).map(lambda a, b: (a * 2.0, b)).cache()
        fit = dict(x=ds.repeat().batch(32), steps_per_epoch=8192 // 32 // 4)
    model.fit(epochs=epochs, verbose=0, callbacks=callbacks, **fit)
    v = det.verdict
    print(json.dumps({
        "category": v.category,
        "host_mib_per_epoch": v.host_mib_per_epoch,
        "message": v.message,
        "rss_mib": [round(e["memory/host_rss_mib"], 3) for e in det.epoch_history],
    }))
    """
)


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--rates", default="0.5,1,4,24", help="leaks to run, MiB per epoch")
    p.add_argument("--cases", default="clean,tf_data_cache,bounded_cache", help="the cases that must stay stable")
    args = p.parse_args()
    if args.smoke:
        args.epochs, args.rates, args.cases = 8, "24", "clean"
    return args


def run_case(case: str, epochs: int) -> dict:
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", CHILD, case, str(epochs)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr[-3000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    result = {}
    cases = [c for c in args.cases.split(",") if c] + [f"leak_{r}" for r in args.rates.split(",") if r]
    for case in cases:
        result[case] = run_case(case, args.epochs)
        r = result[case]
        print(f"{case}: {r.get('category')} {r.get('host_mib_per_epoch')} MiB/epoch: {r.get('message')}", flush=True)
    return result


def main() -> int:
    args = _parse()
    result = _common.measure_and_save(args, BENCHMARK, measure)
    check = _common.Checks(args)
    for case, r in result.items():
        check("error" not in r, f"{case}: the fit ran ({r.get('error', 'ok')[-300:]})")
        if "error" in r:
            continue
        check(r.get("category") in ("grows", "stable", "unknown"), f"{case}: a verdict ({r.get('category')})")
        if case.startswith("leak_"):
            rate, got = float(case[5:]), r["host_mib_per_epoch"]
            check.goal(r["category"] == "grows", f"{case}: grows ({r['category']})")
            check.goal(got is not None and abs(got - rate) <= 0.2 * rate, f"{case}: rate within 20% ({got} MiB/epoch)")
        else:
            check.goal(r["category"] == "stable", f"{case}: stable ({r['category']})")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
