"""Speed of float32, mixed_float16 and mixed_bfloat16 training with model.fit.

One model per policy (an MLP whose sizes are multiples of 64, ending in
MixedPrecisionOutput("softmax")), each compiled and warmed up first; then timed
fit() calls of the same number of steps, interleaved (the order rotates every
repeat) so drift in clocks or temperature hits every policy alike. Reported per
policy: the median step time, steps/s, the speedup over float32 (ratio of
medians), achieved TFLOP/s, and whether every loss was finite.

    KERAS_BACKEND=jax python benchmarks/mixed_precision_speedup.py --out result.json
    KERAS_BACKEND=torch python benchmarks/mixed_precision_speedup.py --out result.json
    python benchmarks/mixed_precision_speedup.py --quick          # CPU smoke run

On a GPU the default sizes take about a minute per backend. float32 is the
framework's default float32: JAX lets XLA use TF32 tensor cores for float32
matrix products on Ampere and later (`JAX_DEFAULT_MATMUL_PRECISION=highest`
turns that off), torch does not unless `torch.backends.cuda.matmul.allow_tf32`
or `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1` is set; the JSON records which.

Measured 2026-11-26 on one NVIDIA H200 (driver 580.159.04), keras 3.15.1,
default sizes (MLP 128 -> 4 x 4096 -> 1024, batch 4096), median step ms:

| backend                      | float32 | mixed_float16  | mixed_bfloat16 |
|------------------------------|---------|----------------|----------------|
| jax 0.11.2 (float32 via TF32)|  5.45   | 3.03 (1.80x)   | 2.89 (1.89x)   |
| jax, JAX_DEFAULT_MATMUL_PRECISION=highest | 27.27 | 3.00 (9.10x) | 2.93 (9.32x) |
| torch 2.11.0 (TF32 off)      | 36.14   | 12.59 (2.87x)  | 10.54 (3.43x)  |
| torch, TF32 override on      | 12.17   | 11.40 (1.07x)  | 10.75 (1.13x)  |

Every loss was finite. On torch the 16-bit steps (about 10 ms for 1.37 TFLOP)
are bound by something other than the matrix products (Keras's eager torch
path), so its speedup over TF32 is small.
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
from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput  # noqa: E402

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def build(policy, a):
    old = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        layers = [keras.Input((a.features,))]
        layers += [keras.layers.Dense(a.width, activation="relu") for _ in range(a.depth)]
        layers += [keras.layers.Dense(a.classes), MixedPrecisionOutput("softmax")]
        model = keras.Sequential(layers, name=policy)
        model.compile(keras.optimizers.Adam(1e-4), "sparse_categorical_crossentropy")
    finally:
        keras.config.set_dtype_policy(old)
    return model


def sync(model):
    # Reading a weight waits for every queued update (JAX dispatches asynchronously).
    keras.ops.convert_to_numpy(model.trainable_weights[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--classes", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=30, help="steps per timed fit")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke run")
    p.add_argument("--out", default=None, help="path of the JSON result")
    a = p.parse_args()
    if a.quick:
        a.width, a.depth, a.features, a.classes, a.batch, a.steps, a.repeats = 64, 2, 32, 16, 64, 10, 2
    policies = [s.strip() for s in a.policies.split(",") if s.strip()]

    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(a.features, a.classes)).astype("float32")
    x = rng.normal(size=(a.batch * a.steps, a.features)).astype("float32")
    y = np.argmax(x @ teacher, axis=1).astype("int32")

    t_start = time.perf_counter()
    models = {}
    for policy in policies:
        t0 = time.perf_counter()
        models[policy] = build(policy, a)
        models[policy].fit(x[: a.batch * 3], y[: a.batch * 3], batch_size=a.batch, epochs=1, verbose=0)
        sync(models[policy])
        print(f"{policy}: built and warmed up in {time.perf_counter() - t0:.1f} s", flush=True)

    times = {policy: [] for policy in policies}
    losses = {policy: [] for policy in policies}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(a.repeats):
            order = policies[r % len(policies) :] + policies[: r % len(policies)]
            for policy in order:
                model = models[policy]
                t0 = time.perf_counter()
                history = model.fit(x, y, batch_size=a.batch, epochs=1, verbose=0, shuffle=False)
                sync(model)
                times[policy].append(time.perf_counter() - t0)
                losses[policy].append(float(history.history["loss"][-1]))

    flops_per_step = 6 * a.batch * (a.features * a.width + (a.depth - 1) * a.width**2 + a.width * a.classes)
    base = statistics.median(times["float32"]) if "float32" in times else None
    rows = {}
    for policy in policies:
        med = statistics.median(times[policy])
        rows[policy] = {
            "step_ms_median": 1000 * med / a.steps,
            "steps_per_s": a.steps / med,
            "speedup_over_float32": (base / med) if base else None,
            "tflops": flops_per_step * a.steps / med / 1e12,
            "losses_finite": bool(np.isfinite(losses[policy]).all()),
            "last_loss": losses[policy][-1],
            "optimizer": type(models[policy].optimizer).__name__,
            "fit_times_s": times[policy],
        }
    result = {
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "framework": _framework_version(),
        "device": _device_name(),
        "float32_matmul": _float32_matmul_mode(),
        "machine": platform.node(),
        "config": vars(a),
        "flops_per_step": flops_per_step,
        "policies": rows,
        "total_s": time.perf_counter() - t_start,
    }
    print(
        f"\nbackend={result['backend']} ({result['framework']}) device={result['device']} "
        f"float32 matmul: {result['float32_matmul']}"
    )
    print(
        f"MLP {a.features}->{a.depth}x{a.width}->{a.classes}, batch {a.batch}, {a.steps} steps x {a.repeats} "
        "interleaved repeats, medians"
    )
    print(f"{'policy':<16}{'step ms':>10}{'steps/s':>10}{'speedup':>9}{'TFLOP/s':>9}  finite  last loss")
    for policy, row in rows.items():
        speed = f"{row['speedup_over_float32']:.2f}x" if row["speedup_over_float32"] else "-"
        print(
            f"{policy:<16}{row['step_ms_median']:>10.2f}{row['steps_per_s']:>10.1f}{speed:>9}"
            f"{row['tflops']:>9.1f}  {str(row['losses_finite']):<6}  {row['last_loss']:.4f}"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r["losses_finite"] for r in rows.values()) else 1


def _framework_version():
    backend = keras.backend.backend()
    try:
        module = __import__({"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[backend])
        return f"{backend} {module.__version__}"
    except Exception:
        return backend


def _device_name():
    backend = keras.backend.backend()
    try:
        if backend == "torch":
            import torch

            return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        if backend == "jax":
            import jax

            d = jax.devices()[0]
            return getattr(d, "device_kind", d.platform)
        if backend == "tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "cpu"
    except Exception as e:
        return f"unknown ({e})"
    return "unknown"


def _float32_matmul_mode():
    backend = keras.backend.backend()
    try:
        if backend == "torch":
            import torch

            tf32 = torch.backends.cuda.matmul.allow_tf32 or os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1"
            return "TF32 allowed" if tf32 else "full float32 (TF32 off)"
        if backend == "jax":
            import jax

            return f"jax_default_matmul_precision={jax.config.jax_default_matmul_precision!r} (None: XLA may use TF32)"
    except Exception as e:
        return f"unknown ({e})"
    return "framework default"


if __name__ == "__main__":
    sys.exit(main())
