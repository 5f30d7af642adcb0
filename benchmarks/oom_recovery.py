"""Cost of OOM recovery: a run that starts too large and recovers, against the right split set by hand.

Three runs on the same data, same backend, same process:

- ``recovering``: batch N, which does not fit; OOMBatchSizeReducer finds the
  split k (micro-batches of N/k, gradients accumulated, one update per batch).
- ``by_hand``: what a user would set by hand for the same optimisation:
  batch N/k with Keras's own ``gradient_accumulation_steps=k``; no callback.
- ``by_hand_with_reducer``: the same with the reducer attached (it never
  fires): the reducer's cost on a run that fits.

Throughput is samples/second over the epochs after the first (median); the
first epoch's extra time (over a steady epoch) is compilation, plus, for the
recovering run, the failed attempts. Goals: the recovering run within 5% of
``by_hand`` after recovery; its extra first-epoch time no more than the
compilations it needs (one per failed split, reported as
``failed_attempt_seconds``) on top of ``by_hand``'s.

On a GPU the model's hidden activation is (batch, 65536) float32 (256 KiB per
sample, ~3 kept for training): batch 2**19 needs ~400 GiB. ``--quick`` (CPU) uses
a small model whose one layer materialises 1 TiB per sample above a batch limit,
which the CPU allocator refuses (TensorFlow with ``TF_ENABLE_ONEDNN_OPTS=0`` so
the refusal is immediate).

    KERAS_BACKEND=jax python benchmarks/oom_recovery.py --out oom_recovery.json
    python benchmarks/oom_recovery.py --quick --backends tensorflow,jax,torch --out oom_recovery.json

Prints a table and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # TensorFlow's CPU allocator then refuses at once
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="small model with a memory cliff (CPU)")
    p.add_argument("--backends", default=None, help="comma-separated; runs each in a subprocess")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=4)
    return p.parse_args()


def _spawn(args) -> list:
    results = []
    for backend in args.backends.split(","):
        out = f"/tmp/oom_recovery_{backend}_{os.getpid()}.json"
        cmd = [sys.executable, os.path.abspath(__file__), "--out", out, "--epochs", str(args.epochs)]
        for flag, value in (("--batch", args.batch), ("--steps", args.steps)):
            if value:
                cmd += [flag, str(value)]
        if args.quick:
            cmd.append("--quick")
        env = dict(os.environ, KERAS_BACKEND=backend)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                results.extend(json.load(f)["results"])
        else:
            results.append({"backend": backend, "error": (proc.stdout + proc.stderr)[-2000:]})
    return results


def _cliff_layer(limit):
    import keras
    from keras import ops

    backend = keras.backend.backend()

    class MemoryCliff(keras.layers.Layer):
        """Above `limit` samples, materialises 1 TiB per sample: the allocator refuses it."""

        def call(self, x):
            cols = 2**38
            if backend == "tensorflow":
                import tensorflow as tf

                n = tf.shape(x, out_type=tf.int64)[0]
                c = tf.where(n > limit, tf.constant(cols, tf.int64), tf.constant(1, tf.int64))
                big = tf.fill(tf.stack([n, c]), x[0, 0] * 0.0 + 1.0)
                return x + ops.cast(tf.reduce_max(big) - 1.0, x.dtype)
            n = x.shape[0]
            if not isinstance(n, int) or n <= limit:
                return x
            if backend == "jax":
                import jax.numpy as jnp

                return x + 0.0 * jnp.zeros((n, cols), "float32").at[0, 0].set(x[0, 0]).max()
            import torch

            return x + (torch.ones((n, cols), device=x.device).max() - 1.0)

    return MemoryCliff()


def _model(quick, accumulation=None, limit=None):
    import keras

    keras.utils.set_random_seed(0)
    if quick:
        layers = [keras.Input((32,))]
        if limit is not None:
            layers.append(_cliff_layer(limit))
        layers += [
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ]
    else:
        layers = [keras.Input((8,)), keras.layers.Dense(65536, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.SGD(1e-3, momentum=0.9, gradient_accumulation_steps=accumulation), "mse")
    return model


def _data(n, quick):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 32 if quick else 8), dtype="float32")
    return x, (x.sum(1, keepdims=True) * 0.1).astype("float32")


def _timed_fit(model, x, y, batch, epochs, callbacks=()):
    import keras

    class Clock(keras.callbacks.Callback):
        times = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self.t0)

    clock = Clock()
    clock.times = []
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[*callbacks, clock])
    return clock.times


def _summary(name, times, samples):
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {
        "run": name,
        "epoch_seconds": [round(t, 4) for t in times],
        "samples_per_sec": round(samples / steady, 1),
        "first_epoch_extra_seconds": round(times[0] - steady, 4),
    }


def run(args) -> list:
    import keras

    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer

    backend = keras.backend.backend()
    quick = args.quick
    batch = args.batch or (256 if quick else 2**19)
    steps = args.steps or (8 if quick else 4)
    limit = batch // 4 if quick else None  # quick: 4 x (batch / 4) is the split that fits
    x, y = _data(batch * steps, quick)

    reducer = OOMBatchSizeReducer()
    t0 = time.perf_counter()
    rec_times = _timed_fit(_model(quick, limit=limit), x, y, batch, args.epochs, [reducer])
    rec_wall = time.perf_counter() - t0
    k = reducer.micro_batches
    hand_times = _timed_fit(
        _model(quick, accumulation=k if k > 1 else None, limit=limit), x, y, batch // k, args.epochs
    )
    hand_reducer_times = _timed_fit(
        _model(quick, accumulation=k if k > 1 else None, limit=limit),
        x,
        y,
        batch // k,
        args.epochs,
        [OOMBatchSizeReducer()],
    )
    samples = batch * steps
    rec = _summary("recovering", rec_times, samples)
    hand = _summary("by_hand", hand_times, samples)
    hand_r = _summary("by_hand_with_reducer", hand_reducer_times, samples)
    rec.update(
        {
            "split": k,
            "events": [e.line() for e in reducer.events],
            "failed_attempt_seconds": round(reducer.recovery_seconds, 4),
            "wall_seconds": round(rec_wall, 3),
        }
    )
    ratio = rec["samples_per_sec"] / hand["samples_per_sec"]
    extra = rec["first_epoch_extra_seconds"] - hand["first_epoch_extra_seconds"]
    verdict = {
        "throughput_ratio_after_recovery": round(ratio, 4),
        "within_5_percent": ratio >= 0.95,
        "extra_first_epoch_seconds_vs_by_hand": round(extra, 4),
        # Each failed split costs its compilation (failed_attempt_seconds); the working split
        # compiles once, as by_hand's does. More than that is overhead of the recovery itself.
        "recovery_within_compile_cost": extra <= reducer.recovery_seconds + max(hand["first_epoch_extra_seconds"], 0.0),
        "reducer_overhead_when_it_never_fires": round(1 - hand_r["samples_per_sec"] / hand["samples_per_sec"], 4),
    }
    device = "cpu"
    try:
        if backend == "jax":
            import jax

            device = jax.devices()[0].device_kind
        elif backend == "torch":
            import torch

            device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:
        pass
    meta = {
        "backend": backend,
        "device": device,
        "batch": batch,
        "steps_per_epoch": steps,
        "epochs": args.epochs,
        "keras": keras.__version__,
        "quick": quick,
    }
    return [dict(meta, **r) for r in (rec, hand, hand_r)] + [dict(meta, run="verdict", **verdict)]


def _table(results):
    lines = [
        f"{'backend':<11}{'device':<26}{'run':<22}{'split':>6}{'samples/s':>13}{'1st-epoch extra s':>19}{'failed s':>10}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['backend']:<11}ERROR: {r['error'][-300:]}")
        elif r["run"] == "verdict":
            lines.append(
                f"{r['backend']:<11}{r['device'][:25]:<26}verdict: ratio {r['throughput_ratio_after_recovery']:.3f} "
                f"(within 5%: {r['within_5_percent']}), extra 1st epoch {r['extra_first_epoch_seconds_vs_by_hand']:+.3f} s "
                f"(within compile cost: {r['recovery_within_compile_cost']}), reducer idle overhead "
                f"{100 * r['reducer_overhead_when_it_never_fires']:.1f}%"
            )
        else:
            lines.append(
                f"{r['backend']:<11}{r['device'][:25]:<26}{r['run']:<22}{r.get('split', ''):>6}{r['samples_per_sec']:>13.1f}"
                f"{r['first_epoch_extra_seconds']:>19.3f}{r.get('failed_attempt_seconds', ''):>10}"
            )
    return "\n".join(lines)


def main():
    args = _parse()
    results = _spawn(args) if args.backends else run(args)
    print(_table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results}, f, indent=2)


if __name__ == "__main__":
    main()
