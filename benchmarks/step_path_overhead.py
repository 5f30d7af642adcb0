"""Host time the package's step path adds per training step, measured inside one fit().

`host_overhead.py` compares whole fits, so it also counts what a callback does
per epoch or per fit and what Keras does for every callback in its list. This
script isolates the step path: the step hook's wrapper around Keras's train
function, the OOM reducer's idle step, and the detector's sampled and
fetch-timed steps. The callbacks under test stay in the fit; a harness callback
swaps ``model.train_function`` between the package's wrapper and Keras's own
function every ``--block`` steps, and times each block (wall and training-thread
CPU). The figure is the median over adjacent block pairs of (wrapper - Keras's
own) per step: each pair is a few milliseconds apart, so the machine's slow
phases hit both halves. The harness's own batch hook runs in both halves.

    python benchmarks/step_path_overhead.py --backends tensorflow,jax,torch --out results/step_path_cpu.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _per_backend import run_per_backend, write_json

CONDITIONS = ("InputBoundDetector", "OOMBatchSizeReducer", "all")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--backends", default=None, help="comma-separated; each runs in a subprocess")
    p.add_argument("--steps", type=int, default=3000, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--block", type=int, default=50, help="steps per block")
    return p.parse_args()


def _callbacks(name: str, log_dir: str) -> list:
    import keras_gpu_tools as kgt

    if name == "InputBoundDetector":
        return [kgt.InputBoundDetector(log_dir=None, verbose=0)]
    if name == "OOMBatchSizeReducer":
        return [kgt.OOMBatchSizeReducer(log_dir=None, verbose=0)]
    return [
        kgt.GPUUtilizationLogger(log_dir=log_dir),
        kgt.ProfilerWindow(log_dir=log_dir, start_step=10**9, verbose=0),
        kgt.InputBoundDetector(log_dir=log_dir, verbose=0),
        kgt.OOMBatchSizeReducer(log_dir=log_dir, verbose=0),
        kgt.LiveView(),
        kgt.MixedPrecisionCheck(),
    ]


def run_backend(args) -> dict:
    import warnings

    import keras
    import numpy as np

    from keras_gpu_tools.runtime import keras_internals as ki

    warnings.simplefilter("ignore")
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(1)

    class Swap(keras.callbacks.Callback):
        """Every `block` steps: close the block's timing, then swap the train function."""

        def on_train_begin(self, logs=None):
            # The model itself: on JAX each read of `Callback.model` writes the state back
            # into the variables (docs/keras-internals.md), which a block boundary must not do.
            self.m = self.model
            self.wrapped = ki.get_train_function(self.m)
            self.keras_own = getattr(self.wrapped, "__wrapped__", None)
            if self.keras_own is None:
                raise RuntimeError("no step hook installed: nothing to measure")
            self.on, self.count, self.t = False, 0, None
            self.blocks = {True: [], False: []}  # on -> [(wall us, cpu us) per step]

        def on_epoch_begin(self, epoch, logs=None):
            self.t = None  # a block never spans an epoch end

        def on_train_batch_begin(self, batch, logs=None):
            self.count += 1
            if self.count % args.block:
                return
            t, c = time.perf_counter(), time.thread_time()
            if self.t is not None:
                self.blocks[self.on].append((1e6 * (t - self.t) / args.block, 1e6 * (c - self.c) / args.block))
            self.on = not self.on
            ki.set_train_function(self.m, self.wrapped if self.on else self.keras_own)
            self.t, self.c = time.perf_counter(), time.thread_time()

        def on_train_end(self, logs=None):
            ki.set_train_function(self.m, self.wrapped)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * 32, 16)).astype("float32")
    y = rng.integers(0, 3, size=(args.steps * 32,)).astype("int32")
    tmp = tempfile.mkdtemp(prefix="kgt_step_path_")
    rows = []
    for name in CONDITIONS:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        cbs = _callbacks(name, os.path.join(tmp, name))
        model.fit(x[:640], y[:640], batch_size=32, epochs=1, verbose=0, callbacks=cbs)  # compile, warm up
        swap = Swap()
        model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=0, shuffle=False, callbacks=[*cbs, swap])
        off, on = swap.blocks[False], swap.blocks[True]
        n = min(len(off), len(on))
        rows.append(
            {
                "condition": name,
                "block_pairs": n,
                "keras_own_step_us": round(statistics.median(w for w, _ in off), 1),
                "added_wall_us_per_step": round(statistics.median(b[0] - a[0] for a, b in zip(off, on)), 2),
                "added_thread_cpu_us_per_step": round(statistics.median(b[1] - a[1] for a, b in zip(off, on)), 2),
            }
        )
    return {"backend": keras.backend.backend(), "block": args.block, "rows": rows}


def main():
    args = _parse()
    if args.backends:
        argv = ["--steps", str(args.steps), "--epochs", str(args.epochs), "--block", str(args.block)]
        results = run_per_backend(__file__, args.backends, argv)
    else:
        results = [run_backend(args)]
    doc = {
        "what": "host us per step the step path adds, hook on minus off in adjacent blocks of one fit",
        "results": results,
    }
    for r in results:
        if "error" in r:
            print(f"{r['backend']}: failed\n{r['error']}")
            continue
        print(f"\n{r['backend']}  (us per step, median over block pairs: wall | training-thread CPU)")
        for row in r["rows"]:
            print(
                f"  {row['condition']:22s} Keras's own step {row['keras_own_step_us']:7.1f}"
                f"   added {row['added_wall_us_per_step']:+6.1f} | {row['added_thread_cpu_us_per_step']:+6.1f}"
                f"   ({row['block_pairs']} pairs)"
            )
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
