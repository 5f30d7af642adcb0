"""GPU proof of the OOM work: a real OOM explained, JAX recovery time before and after, the planned batch.

    KERAS_BACKEND=jax python benchmarks/oom_gpu_proof.py --out benchmarks/results/oom_gpu_proof_jax.json
    KERAS_BACKEND=torch python benchmarks/oom_gpu_proof.py --out benchmarks/results/oom_gpu_proof_torch.json

One GPU, about 3 minutes per backend. The model is the issue's case: Dense(64 -> 65536, relu) ->
Dense(1), whose hidden activation is 256 KiB per sample in float32 (and training keeps about three
of them), so batch 262144 needs far more than an H100 (80 GB) or H200 (141 GB) holds. Each part
runs in a process of its own (a fresh allocator, no compilation cache):

- ``explain``: one training step at that batch with ``OOMBatchSizeReducer``; the explanation of
  the first (real) out-of-memory error, with the figures of the error's message next to the
  allocator's own (``memory_stats``), and the size of the activation that could not be allocated
  (262144 x 65536 float32 = 64 GiB) for comparison.
- ``recovery``: seconds until the first good step, for ``before`` (each failing split compiled,
  with autotuning, and run to the error: the behaviour before this change, kept behind
  ``Recovery.predict_after_oom = False``), ``after`` (the default: after the first real OOM, the
  next splits are chosen from XLA's memory analysis, compiled without autotuning and never run),
  ``probe`` (JAX, ``probe=True``: even the first attempt is predicted) and ``reference``: a fresh
  model trained directly at the split found, with Keras's own ``gradient_accumulation_steps``
  (one compilation, no OOM). ``recovery_seconds`` is the reducer's time in failed or predicted
  attempts; ``extra_seconds`` is the first step's time beyond the reference's. Goals: JAX at most
  5 s (it was 24.7 s on an H200), torch under 1 s.
- ``plan``: ``plan_batch_size`` against the device's capacity (JAX: its allocator limit,
  ``bytes_limit``; torch: ``mem_get_info``'s total), then 3 steps at the planned batch with no
  reducer (must not run out of memory), then one step at 1.5 times the planned batch (must run out
  of memory; on JAX its predicted peak is recorded first).

Prints each part and writes all of them as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PARTS = ("explain", "recovery", "plan")
VARIANTS = ("before", "after", "probe", "reference")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON file for the results")
    p.add_argument("--batch", type=int, default=2**18, help="the batch that does not fit")
    p.add_argument("--width", type=int, default=65536)
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--part", choices=PARTS, default=None, help="run one part in this process")
    p.add_argument("--variant", choices=VARIANTS, default=None, help="recovery: one variant in this process")
    p.add_argument("--timeout", type=int, default=240, help="seconds per part's process")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        help="recovery: add the N functions with the most cumulative and own time in the fit (cProfile)",
    )
    p.add_argument("--memory-limit-mib", type=float, default=None, help="plan for this much (a CPU smoke run)")
    p.add_argument(
        "--cliff",
        type=int,
        default=None,
        help="smoke run on a CPU: a layer that asks 1 TiB per sample above this many samples (a real CPU OOM)",
    )
    return p.parse_args()


def _model(args, accumulation=None):
    import keras

    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.inputs,))]
    if args.cliff is not None:
        layers.append(_cliff(args.cliff))
    layers += [keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.SGD(1e-3, momentum=0.9, gradient_accumulation_steps=accumulation), "mse")
    return model


def _cliff(limit):
    """Above ``limit`` samples asks the allocator for 1 TiB per sample (a CPU smoke run's real OOM)."""
    import keras

    backend = keras.backend.backend()

    class MemoryCliff(keras.layers.Layer):
        def call(self, x):
            n = x.shape[0]
            if not isinstance(n, int) or n <= limit:
                return x
            if backend == "jax":
                import jax.numpy as jnp

                return x + 0.0 * jnp.zeros((n, 2**38), "float32").at[0, 0].set(x[0, 0]).max()
            import torch

            return x + (torch.ones((n, 2**38), device=x.device).max() - 1.0)

    return MemoryCliff()


def _data(n, args):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, args.inputs), dtype="float32")
    return x, (x.sum(1, keepdims=True) * 0.01).astype("float32")


def _device() -> str:
    from keras_gpu_tools import backends

    return str(backends.get().device_memory().get("device") or "unknown")


class _StepClock:
    """Wall time of each training step (its batch-end), synced: the first one includes every compilation."""

    def __init__(self):
        import keras

        clock = self

        class Callback(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                clock.t0 = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                from keras_gpu_tools import backends

                backends.get().sync(logs)
                clock.steps.append(time.perf_counter() - clock.t0)

        self.steps: list[float] = []
        self.callback = Callback()


def part_explain(args) -> dict:
    from keras_gpu_tools import OOMBatchSizeReducer
    from keras_gpu_tools.memory.explain import OOMExplanation, parse_message

    model = _model(args)
    x, y = _data(args.batch, args)
    log_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"oom_gpu_proof_{os.getpid()}")
    reducer = OOMBatchSizeReducer(log_dir=log_dir)
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, callbacks=[reducer])
    first = next(e for e in reducer.events if e.kind != "predicted")
    explanation = OOMExplanation.from_dict(first.explanation or {})
    message = parse_message(explanation.message or "")
    activation = args.batch * args.width * 4
    out = {
        "event": first.line(),
        "why": first.why(),
        "message_figures": {k: v for k, v in message.items() if k not in ("sources", "largest", "program")},
        "allocator_figures": explanation.allocator,
        "largest": explanation.largest,
        "program": explanation.program,
        "activation_bytes": activation,
        "requested_over_activation": (
            round(explanation.requested_bytes / activation, 4) if explanation.requested_bytes else None
        ),
        "files": explanation.files,
        "message_start": (explanation.message or "")[:600],
        "split_found": reducer.micro_batches,
    }
    free, cap = message.get("free_bytes"), message.get("capacity_bytes")
    in_use = explanation.allocator.get("in_use_bytes")
    if cap and explanation.allocator.get("capacity_bytes"):
        out["capacity_message_vs_allocator"] = [cap, explanation.allocator["capacity_bytes"]]
    if free is not None and in_use is not None:
        out["free_message_vs_capacity_minus_in_use"] = [
            free,
            (explanation.allocator.get("capacity_bytes") or 0) - in_use,
        ]
    return out


def part_recovery(args, variant: str) -> dict:
    from keras_gpu_tools import OOMBatchSizeReducer

    x, y = _data(args.batch * 2, args)
    clock = _StepClock()
    if variant == "reference":
        k = int(os.environ.get("OOM_PROOF_SPLIT", "0") or 0)
        if not k:
            return {"skipped": "no split known (run the 'after' variant first)"}
        model = _model(args, accumulation=k)
        model.fit(x, y, batch_size=args.batch // k, epochs=1, shuffle=False, verbose=0, callbacks=[clock.callback])
        return {
            "split": k,
            "first_step_seconds": round(clock.steps[0], 3),
            "steady_step_seconds": round(clock.steps[-1], 4),
        }
    reducer = OOMBatchSizeReducer(probe=variant == "probe")
    if variant == "before":
        reducer._state.recovery.predict_after_oom = False  # each failing split compiled and run, as before
    model = _model(args)
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[reducer, clock.callback])
    fit_seconds = time.perf_counter() - t0
    if profile is not None:
        profile.disable()
    return {
        "split": reducer.micro_batches,
        "events": [e.line() for e in reducer.events],
        "why": [e.why() for e in reducer.events],
        "event_seconds": [round(e.seconds, 3) for e in reducer.events],
        "recovery_seconds": round(reducer.recovery_seconds, 3),
        "first_step_seconds": round(clock.steps[0], 3),
        "steady_step_seconds": round(clock.steps[-1], 4),
        "fit_seconds": round(fit_seconds, 3),
        **(
            {"profile_cumulative": _top(profile, args.profile, 3), "profile_own": _top(profile, args.profile, 2)}
            if profile is not None
            else {}
        ),
    }


def _top(profile, n: int, column: int) -> list[str]:
    """The ``n`` functions with the most time by ``column`` (3: cumulative, 2: own), one line each:
    cumulative s, own s, calls, where."""
    import pstats

    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][column])[:n]
    return [
        f"{cum:8.3f} {own:8.3f} {calls:6d}  {os.path.basename(file)}:{line}({name})"
        for (file, line, name), (_, calls, own, cum, _) in rows
    ]


def part_plan(args) -> dict:
    from keras_gpu_tools import backends, plan_batch_size

    backend = backends.get()
    model = _model(args)
    x, y = _data(4096, args)  # only the shapes of a sample matter; trial batches repeat these
    t0 = time.perf_counter()
    plan = plan_batch_size(model, x, y, memory_limit_mib=args.memory_limit_mib)
    out = {
        "plan": str(plan),
        "batch_size": plan.batch_size,
        "peak_mib": plan.peak_mib,
        "capacity_mib": plan.capacity_mib,
        "method": plan.method,
        "trials": len(plan.trials),
        "plan_seconds": round(time.perf_counter() - t0, 2),
    }
    b = plan.batch_size
    xb, yb = _data(b, args)
    try:
        for _ in range(3):
            model.train_on_batch(xb, yb)
        backend.sync(model.trainable_variables[0].value)
        out["planned_batch_trains"] = True
    except Exception as e:
        out["planned_batch_trains"] = False
        out["planned_batch_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    larger = int(1.5 * b)
    xl, yl = _data(larger, args)
    try:
        peaks, _ = backend.step_memory(model, (xl, yl), plan.devices) if backend.predicts_memory else (None, "")
        if peaks:
            out["larger_predicted_peak_mib"] = [p / 2**20 for p in peaks]
            out["larger_predicted_to_fit"] = all(p / 2**20 <= c for p, c in zip(peaks, plan.capacity_mib))
    except Exception as e:
        out["larger_prediction_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    try:
        model.train_on_batch(xl, yl)
        backend.sync(model.trainable_variables[0].value)
        out["larger_batch_ran_out_of_memory"] = False
    except Exception as e:
        out["larger_batch_ran_out_of_memory"] = bool(backends.is_oom(e))
        out["larger_batch_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["larger_batch"] = larger
    return out


def _child(args) -> None:
    import keras

    result = {"backend": keras.backend.backend(), "keras": keras.__version__, "device": _device()}
    if args.part == "explain":
        result["explain"] = part_explain(args)
    elif args.part == "recovery":
        result["recovery"] = {args.variant: part_recovery(args, args.variant)}
    else:
        result["plan"] = part_plan(args)
    print("RESULT " + json.dumps(result, default=str))


def _spawn(args, part: str, variant: str | None = None, env: dict | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--batch", str(args.batch)]
    cmd += ["--width", str(args.width), "--inputs", str(args.inputs)]
    if args.memory_limit_mib is not None:
        cmd += ["--memory-limit-mib", str(args.memory_limit_mib)]
    if args.cliff is not None:
        cmd += ["--cliff", str(args.cliff)]
    if variant:
        cmd += ["--variant", variant]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT ") :])
            out["process_seconds"] = round(time.perf_counter() - t0, 1)
            return out
    return {"error": (proc.stdout + proc.stderr)[-3000:], "returncode": proc.returncode}


def main() -> None:
    args = _parse()
    if args.part:
        _child(args)
        return
    import keras

    backend = keras.backend.backend()
    results: dict = {"backend": backend, "batch": args.batch, "width": args.width, "inputs": args.inputs}
    results["explain"] = _spawn(args, "explain")
    print(json.dumps(results["explain"], indent=1, default=str))
    recovery = {}
    variants = ["after", "before", "reference"] + (["probe"] if backend == "jax" else [])
    split = None
    for variant in variants:
        env = {"OOM_PROOF_SPLIT": str(split)} if split else None
        recovery[variant] = _spawn(args, "recovery", variant, env)
        found = recovery[variant].get("recovery", {}).get(variant, {})
        split = split or found.get("split")
        print(variant, json.dumps(found, default=str))
    results["recovery"] = recovery
    results["plan"] = _spawn(args, "plan")
    print(json.dumps(results["plan"], indent=1, default=str))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
