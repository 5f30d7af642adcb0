"""Starts a real job of several JAX processes on this machine and collects what each returned.

Each process runs ``worker.py``: it joins the job with
``keras.distribution.initialize`` (on the CPU over gloo, so CI can run it; on
GPUs with one GPU per process), runs one scenario of ``scenarios.py`` and
writes the scenario's JSON result. A process that hangs is killed at the
timeout, and the test fails with every process's output.

``KGT_JOB_GPUS=1`` runs every job of the suite on GPUs (``devices_per_process``
GPUs per process, NCCL between them): the same tests on a machine of 2 or 4
GPUs (``bash benchmarks/gpu_suite.sh distributed``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB_GPUS = os.environ.get("KGT_JOB_GPUS") == "1"  # the suite's jobs run on GPUs (see above)
ROOT = HERE.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def visible_gpus() -> int:
    """The machine's GPUs, as ``nvidia-smi -L`` lists them (0 without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def run_job(
    scenario: str,
    tmp_path: Path,
    processes: int = 2,
    devices_per_process: int = 1,
    gpus: bool | None = None,
    timeout: float = 240.0,
    args: dict | None = None,
    killed: tuple[int, ...] = (),
) -> list[dict | None]:
    """Runs ``scenario`` ("module.function" of this folder) in ``processes`` processes; their results by index.

    ``killed``: the processes the scenario kills, or JAX may abort, on purpose (their
    exit status is not checked; their result is None where they wrote none).
    """
    if gpus is None:
        gpus = JOB_GPUS
    if gpus and visible_gpus() < processes * devices_per_process:
        import pytest

        pytest.skip(f"a job of {processes} x {devices_per_process} GPUs; this machine has {visible_gpus()}")
    port = free_port()
    out = tmp_path / "job"
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(args or {}))
    procs = []
    for i in range(processes):
        env = dict(os.environ)
        env.update(
            KERAS_BACKEND="jax",
            PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
            TF_CPP_MIN_LOG_LEVEL="3",
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
        )
        if gpus:
            # Full float32 matmuls: the tests compare split and unsplit runs to 1e-5, and TF32 rounds at 1e-3.
            env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i * devices_per_process + k) for k in range(devices_per_process))
        else:
            env["JAX_PLATFORMS"] = "cpu"
        cmd = [sys.executable, str(HERE / "worker.py"), scenario, str(i), str(processes), str(port), str(out)]
        log = open(out / f"log_{i}.txt", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for i, (p, log) in enumerate(procs):
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q, _ in procs:  # every process's stacks into its log first: where the job hung
                if q.poll() is None:
                    q.send_signal(signal.SIGUSR1)
            time.sleep(2)
            for q, _ in procs:
                q.kill()
            failed.append(f"process {i} did not finish within {timeout:g} s (a hang)")
        log.close()
        if p.returncode and i not in killed:
            failed.append(f"process {i} exited with {p.returncode}")
    if failed:
        logs = "\n".join(f"--- process {i} ---\n{(out / f'log_{i}.txt').read_text()[-4000:]}" for i in range(processes))
        raise AssertionError("; ".join(failed) + "\n" + logs)
    return [
        json.loads(path.read_text()) if (path := out / f"result_{i}.json").exists() or i not in killed else None
        for i in range(processes)
    ]
