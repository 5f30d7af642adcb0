"""Issue 11's proof on a machine of several GPUs (or, with --cpu, the same code on CPU devices).

1. MFU over 1, 2 (and 4) GPUs, one JAX process over all of them with DataParallel and the same
   work per device: MFU must not grow with the device count (2-GPU within 5% of 1-GPU).
2. A job of one process per GPU (tests/distributed/launch.py): every process's detector names the
   process whose input was slowed on purpose; job keys identical on every process.
3. The two-process example with every callback: one writer per run, a profiler session of one
   trace per process.
4. A real OOM under DataParallel, one process over 2 (and 4) GPUs: the issue's Dense(64 -> 65536)
   at 262144 samples per device (64 GiB per activation), recovered by OOMBatchSizeReducer; every sample trained once
   (counted by a layer), one update per batch, the seconds to the first good step.

    python benchmarks/distributed_proof.py --out results/distributed.json          # GPUs
    python benchmarks/distributed_proof.py --cpu --out /tmp/distributed.json       # smoke test on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MFU_CHILD = r"""
import json, os, sys
import jax, keras, numpy as np
from keras_gpu_tools import InputBoundDetector
n, width, per_device, steps, peak = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
devices = jax.devices()[:n]
if n > 1:
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
keras.utils.set_random_seed(0)
# Narrow inputs and outputs around wide layers: the step is GPU-bound, not bound by copying the batch
# from the host (a global batch of width-wide rows grows the copy with the device count).
io = 256
model = keras.Sequential([keras.Input((io,))] + [keras.layers.Dense(width) for _ in range(4)] + [keras.layers.Dense(io)])
model.compile(keras.optimizers.SGD(1e-4), "mse")
batch = per_device * n
x = np.random.default_rng(0).random((batch * 8, io), dtype="float32")
det = InputBoundDetector(log_dir=None, verbose=0, window=steps, sample_every=10,
                         peak_flops=float(peak) if peak != "table" else None)
h = model.fit(x, x, batch_size=batch, epochs=3, steps_per_epoch=steps, callbacks=[det], verbose=0)
print("RESULT", json.dumps({
    "devices": n, "platform": devices[0].platform, "device_kind": devices[0].device_kind,
    "global_batch": batch, "devices_in_step": det.topology.devices_in_step,
    "mfu": h.history.get("throughput/mfu", [None])[-1],
    "flops_per_sec": h.history.get("throughput/flops_per_sec", [None])[-1],
    "flops_per_sec_per_device": h.history.get("throughput/flops_per_sec_per_device", [None])[-1],
    "step_ms": h.history.get("input/step_ms", [None])[-1],
}))
"""


OOM_CHILD = r"""
import json, sys, time
import jax, keras, numpy as np
from keras import ops
from keras_gpu_tools import OOMBatchSizeReducer
n, per_device, width, batches = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


class SeenCounter(keras.layers.Layer):
    # counts the training passes over each sample (its id in column 0); passes the other columns on

    def __init__(self, total):
        super().__init__()
        self.total = total

    def build(self, shape):
        self.seen = self.add_weight(shape=(self.total,), initializer="zeros", trainable=False)

    def call(self, x, training=False):
        if training:
            ids = ops.cast(x[:, 0], "int32")
            self.seen.assign(self.seen + ops.segment_sum(ops.ones_like(x[:, 0]), ids, num_segments=self.total))
        return x[:, 1:]


devices = jax.devices()[:n]
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
batch = per_device * n
total = batch * batches
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((65,)), SeenCounter(total), keras.layers.Dense(width, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(1e-3, momentum=0.9), "mse")
rng = np.random.default_rng(0)
x = np.concatenate([np.arange(total, dtype="float32")[:, None], rng.standard_normal((total, 64), dtype="float32")], 1)
y = (x[:, 1:].sum(1, keepdims=True) * 0.01).astype("float32")
reducer = OOMBatchSizeReducer()
t0 = time.perf_counter()
h = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
seen = np.asarray(model.layers[0].seen.value)
print("RESULT", json.dumps({
    "devices": n, "device_kind": devices[0].device_kind, "batch": batch, "batches": batches,
    "fit_seconds": time.perf_counter() - t0,
    "events": [[e.batch_size, e.failed_split, e.next_split, e.kind] for e in reducer.events],
    "lines": [e.line() for e in reducer.events],
    "micro_batches": reducer.micro_batches,
    "every_sample_once": bool((seen == 1).all()), "seen_min": float(seen.min()), "seen_max": float(seen.max()),
    "iterations": int(np.asarray(model.optimizer.iterations.value)),
    "loss": h.history["loss"],
}))
"""


def run_child(code: str, args: list[str], env: dict, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def base_env(cpu: bool, devices: int) -> dict:
    env = dict(
        os.environ, KERAS_BACKEND="jax", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    if cpu:
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(devices))
    return env


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except Exception:
        return 0


def mfu_scaling(cpu: bool, counts: list[int], width: int, per_device: int, steps: int) -> list[dict]:
    peak = "1e11" if cpu else "table"  # a CPU has no table peak: a nominal one exercises the arithmetic
    out = []
    for n in counts:
        try:
            r = run_child(MFU_CHILD, [str(n), str(width), str(per_device), str(steps), peak], base_env(cpu, n), 300)
        except Exception as e:  # one failed count must not hide the others' figures
            print(f"  {n} device(s): FAILED {str(e)[-2000:]}", flush=True)
            out.append({"devices": n, "error": str(e)[-3000:]})
            continue
        print(f"  {n} device(s): MFU {r['mfu']}, step {r['step_ms']} ms, global batch {r['global_batch']}", flush=True)
        out.append(r)
    return out


def straggler_job(cpu: bool) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests" / "distributed"))
    from launch import run_job

    with tempfile.TemporaryDirectory() as tmp:
        results = run_job(
            "scenarios_detector.fit_job",
            Path(tmp),
            processes=2,
            gpus=not cpu,
            args={"delays": [0.0, 0.03], "epochs": 2, "steps": 30},
        )
    for i, r in enumerate(results):
        print(f"  process {i}: stragglers {r['job_stragglers']}; {r['job_message']}", flush=True)
    return [{k: r[k] for k in ("job_stragglers", "job_message", "history")} for r in results]


def example(cpu: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(ROOT / "examples" / "two_processes.py"), "--log-dir", tmp, "--epochs", "2"]
        if not cpu:
            cmd.append("--gpus")
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=base_env(cpu, 1))
        runs = sorted(str(p.relative_to(tmp).parent) for p in Path(tmp).rglob("events.out.tfevents.*"))
        traces = sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*.xplane.pb"))
    print(f"  example: exit {proc.returncode} in {time.time() - t0:.1f} s; runs {runs}; traces {traces}", flush=True)
    return {"returncode": proc.returncode, "runs": runs, "traces": traces, "stdout": proc.stdout[-2000:]}


def oom_recovery(counts: list[int], per_device: int, width: int) -> list[dict]:
    out = []
    for n in counts:
        args = [str(n), str(per_device), str(width), "2"]
        try:
            r = run_child(OOM_CHILD, args, base_env(False, n), 300)
        except Exception as e:  # one failed part must not hide the others' figures
            r = {"devices": n, "error": str(e)[-3000:]}
        print(f"  {n} GPUs: {json.dumps(r)[:1500]}", flush=True)
        out.append(r)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU devices instead of GPUs (smoke test)")
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--per-device-batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--parts", default="mfu,stragglers,example,oom")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    n = 4 if a.cpu else gpu_count()
    counts = [c for c in (1, 2, 4) if c <= n]
    result: dict = {"cpu": a.cpu, "devices": n}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = {
        "mfu": (
            "MFU over 1, 2, 4 devices (same work per device):",
            1,
            lambda: mfu_scaling(a.cpu, counts, a.width, a.per_device_batch, a.steps),
        ),
        "stragglers": ("A job of 2 processes, process 1's input slowed:", 2, lambda: straggler_job(a.cpu)),
        "example": ("examples/two_processes.py:", 2, lambda: example(a.cpu)),
        "oom": (
            "A real OOM under DataParallel, recovered:",
            2,
            lambda: oom_recovery([c for c in counts if c > 1], 262144, 65536),
        ),
    }
    for name in a.parts.split(","):
        title, needs, run = parts[name]
        if n < needs or (name == "oom" and a.cpu):  # the OOM part needs a GPU's memory
            continue
        print(title, flush=True)
        try:
            result[name] = run()
        except Exception as e:  # one failed part must not hide the others' figures
            result[name] = {"error": str(e)[-4000:]}
            print(f"  FAILED: {str(e)[-2000:]}", flush=True)
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
