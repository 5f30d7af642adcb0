"""One model trained by two processes on one machine, with every callback of keras_gpu_tools.

Needs: keras_gpu_tools (the quick start's `pip install -e ".[tensorflow-cpu]"` or
`pip install keras-gpu-tools`) and JAX, which the quick start does not install:
`pip install "jax[cpu]"` for the CPU processes (its jaxlib brings gloo), a CUDA build
of JAX for `--gpus` (https://docs.jax.dev/en/latest/installation.html).

Multi-host training with Keras 3 runs on the JAX backend: every process calls
``keras.distribution.initialize()`` (which starts ``jax.distributed``), then
``keras.distribution.DataParallel`` runs one program over the devices of all
processes. This script plays both roles on one machine: started plainly, it
starts the processes (itself again, with ``--process-id``) and waits for them.

    python examples/two_processes.py                 # 2 processes on the CPU (collectives over gloo)
    python examples/two_processes.py --gpus          # one GPU per process (NCCL)
    tensorboard --logdir logs/two_processes          # then: one run per process and callback

On several hosts, start one process per host (or per GPU) yourself, with the
same ``--port``, ``--processes`` and the first host's address in ``--address``.

What to look for in ``--log-dir``:

- every callback writes one run per process, ``<run>/process_<i>``: no
  TensorBoard run has two writers, and GPUs are named job-wide;
- ``profile/job/plugins/profile/<session>/`` holds one trace per process
  (``<host>_p<i>.xplane.pb``): TensorBoard's Profile tab shows them as the
  hosts of one session (JAX profiling needs Python 3.12 or newer);
- ``profile/job`` also has process 0's line and xprof's conclusion for the job.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import threading


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=2, help="processes to start (default: 2)")
    p.add_argument("--gpus", action="store_true", help="one GPU per process instead of the CPU")
    p.add_argument("--devices-per-process", type=int, default=1, help="CPU devices per process without --gpus")
    p.add_argument("--log-dir", default=os.path.join("logs", "two_processes"), help="the job's shared log_dir")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="training steps per epoch")
    p.add_argument("--batch-size", type=int, default=64, help="each process's batch (the job's is N times it)")
    p.add_argument("--address", default="localhost", help="host of process 0 (the job's coordinator)")
    p.add_argument("--port", type=int, default=0, help="the coordinator's port (0: a free one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a hung job is stopped")
    p.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)  # set for the started ones
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the started processes get again
    for name in ("processes", "devices_per_process", "epochs", "steps", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    return args


# -- the launcher ------------------------------------------------------------------------------
def launch(args: argparse.Namespace) -> int:
    """Starts the processes of the job, prefixes their output, returns 0 when every one succeeded."""
    port = args.port or _free_port()
    procs = []
    for i in range(args.processes):
        env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
        if args.gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(i)
        else:
            env["JAX_PLATFORMS"] = "cpu"
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices_per_process}"
        cmd = [sys.executable, os.path.abspath(__file__), *args.argv, "--process-id", str(i), "--port", str(port)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    printers = [threading.Thread(target=_prefix, args=(i, p.stdout), daemon=True) for i, p in enumerate(procs)]
    for t in printers:
        t.start()
    failed = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            p.wait()
        if p.returncode:
            failed.append(i)
    for t in printers:
        t.join(5)
    if failed:
        print(f"process(es) {failed} failed", file=sys.stderr)
        return 1
    print(f"done: tensorboard --logdir {args.log_dir}")
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _prefix(index: int, stream) -> None:
    for line in stream:
        print(f"[process {index}] {line}", end="", flush=True)


# -- one process of the job --------------------------------------------------------------------
def train(args: argparse.Namespace) -> None:
    import jax

    # Collectives between CPU processes need gloo; on GPUs JAX uses NCCL whatever this says.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras
    import numpy as np

    keras.distribution.initialize(
        job_addresses=f"{args.address}:{args.port}", num_processes=args.processes, process_id=args.process_id
    )
    dist = keras.distribution.DataParallel(devices=jax.devices())  # every device of every process
    dist.auto_shard_dataset = False  # NumPy inputs: each process feeds its own shard
    keras.distribution.set_distribution(dist)

    from keras_gpu_tools import (
        GPUUtilizationLogger,
        InputBoundDetector,
        LiveView,
        MixedPrecisionCheck,
        OOMBatchSizeReducer,
        ProfilerWindow,
    )

    keras.utils.set_random_seed(0)  # the same initial weights everywhere
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(64), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    rng = np.random.default_rng(args.process_id)  # this process's shard: different samples on each
    n = args.steps * args.batch_size
    x = rng.normal(size=(n, 32)).astype("float32")
    y = x[:, :1] * 2.0 + rng.normal(scale=0.1, size=(n, 1)).astype("float32")

    log_dir = args.log_dir
    callbacks = [
        GPUUtilizationLogger(log_dir=log_dir),
        InputBoundDetector(log_dir=log_dir, window=min(20, args.steps), sample_every=max(2, args.steps // 4)),
        ProfilerWindow(log_dir=log_dir, start_step=min(5, args.steps - 1), num_steps=min(3, args.steps)),
        OOMBatchSizeReducer(log_dir=log_dir),
        MixedPrecisionCheck(),
        LiveView(),  # draws in a notebook; does nothing here
    ]
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0, callbacks=callbacks)
    callbacks[2].wait_for_analysis()
    total = sum(float(np.asarray(v.value, dtype="float64").sum()) for v in model.trainable_variables)
    print(f"final loss {history.history['loss'][-1]:.4f}; weights sum {total:.6f}")


def missing() -> str | None:
    """What this script needs and the environment lacks, with the command that installs it; None if nothing."""
    if importlib.util.find_spec("jax") is None:
        return (
            'this example runs on the JAX backend, and JAX is not installed: pip install "jax[cpu]" '
            "(or a CUDA build of JAX for --gpus: https://docs.jax.dev/en/latest/installation.html)"
        )
    if importlib.util.find_spec("keras_gpu_tools") is None:
        return 'keras_gpu_tools is not installed: pip install -e ".[tensorflow-cpu]" from the checkout'
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    problem = missing()
    if problem is not None:
        print(f"{os.path.basename(__file__)}: {problem}", file=sys.stderr)
        return 2
    if args.process_id is None:
        return launch(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
