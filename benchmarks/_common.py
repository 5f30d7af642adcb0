"""What the benchmark scripts share: the backend choice, the machine's name, the result file,
the environment a figure was measured in, the package's six callbacks, and the checks of a run
(`Checks`: structural checks, always enforced; goals, enforced in full runs only).

Every private name of the package that a benchmark needs is imported here and only here
(see `train_function`, `set_train_function`, `sync`, `gpu_devices`, `is_oom`, `verdict`,
`outside_layers`, `trace_op_ms_per_step`),
so that a change of the package's layout touches one file of `benchmarks/`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

#: The package's six callbacks, by class name, in the order the benchmarks add them.
CALLBACKS = (
    "GPUUtilizationLogger",
    "InputBoundDetector",
    "ProfilerWindow",
    "OOMBatchSizeReducer",
    "LiveView",
    "MixedPrecisionCheck",
)


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark has: --backend, --smoke, --out, --machine."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default=None,
        help="Keras backend (default: $KERAS_BACKEND, else tensorflow)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and few rounds (CPU, well under a minute); checks the output's structure (every figure "
        "computed, finite, in range) and exits non-zero if that fails; prints the goals without enforcing them; "
        "writes to a temporary file unless --out is given",
    )
    p.add_argument(
        "--enforce-goals",
        action="store_true",
        help="with --smoke: exit non-zero when a goal is missed, as a full run does (the smoke sizes are not the "
        "goals' own: this shows the goal checks work, not that the package meets them)",
    )
    p.add_argument("--out", default=None, help="result file (default: benchmarks/results/<benchmark>_<machine>.json)")
    p.add_argument("--machine", default=None, help="machine name in the result file's name (default: guessed)")
    return p


def setup(args: argparse.Namespace) -> str:
    """Sets the Keras backend (before Keras is imported) and quiet logs; returns the backend's name."""
    if "keras" in sys.modules and args.backend and sys.modules["keras"].backend.backend() != args.backend:
        raise SystemExit(f"--backend {args.backend}: Keras was already imported with another backend")
    backend = args.backend or os.environ.get("KERAS_BACKEND") or "tensorflow"
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.smoke:  # one compute thread: tiny steps gain nothing from more, and a shared CPU loses
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    return backend


def gpu_names() -> list[str]:
    """The names of the NVIDIA GPUs this process may use (nvidia-smi; none without it)."""
    if not shutil.which("nvidia-smi") or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return names[: len(visible.split(","))] if visible else names


def machine_name() -> str:
    """`h100`, `h200`, `h200x2`, ... from the GPUs; `cpu<cores>` without one."""
    names = gpu_names()
    if not names:
        return f"cpu{os.cpu_count()}"
    found = re.search(r"\b([A-Z]\d{2,4})\b", names[0])
    card = (found.group(1) if found else re.sub(r"\W+", "", names[0])).lower()
    return card if len(names) == 1 else f"{card}x{len(names)}"


def out_path(args: argparse.Namespace, benchmark: str) -> Path:
    """Where the result goes: --out; a temporary file for --smoke; else results/<benchmark>_<machine>.json."""
    if args.out:
        return Path(args.out)
    if args.smoke:
        return Path(tempfile.mkdtemp(prefix="kgt_bench_")) / f"{benchmark}_smoke.json"
    return RESULTS / f"{benchmark}_{args.machine or machine_name()}.json"


def environment(backend: str) -> dict[str, Any]:
    """Machine, card, versions, date and command: what RESULTS.md states beside each figure."""

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "date": datetime.date.today().isoformat(),
        "command": " ".join([f"KERAS_BACKEND={backend}", "python", *sys.argv]),
        "backend": backend,
        "cards": gpu_names(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {
            n: version(n) for n in ("keras", "tensorflow", "tensorflow-cpu", "jax", "jaxlib", "torch", "numpy")
        },
    }


def save(path: Path, benchmark: str, backend: str, doc: dict) -> None:
    """Puts ``doc`` into the result file at ``path`` as the run of ``backend``.

    One file per benchmark and machine: ``{"benchmark": ..., "runs": {backend: doc, ...}}``;
    the runs of other backends already in the file are kept.
    """
    runs: dict[str, Any] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
            if old.get("benchmark") == benchmark:
                runs = old.get("runs", {})
        except (ValueError, AttributeError):
            pass
    runs[backend] = doc
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": benchmark, "runs": runs}, indent=1, default=str) + "\n")


def measure_and_save(args: argparse.Namespace, benchmark: str, measure: Callable[[argparse.Namespace], dict]) -> dict:
    """Sets the backend up, runs ``measure(args)``, prints each figure and saves the run; returns its result."""
    backend = setup(args)
    out = out_path(args, benchmark)
    result = measure(args)
    for key, value in result.items():
        print(f"{key}: {value}")
    device = (gpu_devices() or ["CPU"])[0]
    doc = {**environment(backend), "device": device, "args": vars(args)}
    save(out, benchmark, backend, {**doc, "result": result})
    print("written to", out)
    return result


class Checks:
    """The checks of a run, printed as they are made; `exit_code` is 1 if one that counts failed.

    - ``check(ok, what)``: structural (the run measured what it says: figures computed, finite,
      in range). Enforced in every run.
    - ``check.figure(what, value, low, high)``: a structural check that ``value`` is a finite
      number within ``[low, high]`` (either bound optional); returns whether it is.
    - ``check.goal(ok, what)``: a figure against its documented goal. Enforced in a full run
      (missed: exit 1, named at the end); a smoke run's tiny sizes on a shared CPU say nothing
      of the goals, so there it is printed, not enforced (``--enforce-goals`` enforces it).
    """

    def __init__(self, args: argparse.Namespace | None = None) -> None:
        self.failed: list[str] = []
        self.missed: list[str] = []
        self.enforce_goals = args is None or not args.smoke or bool(getattr(args, "enforce_goals", False))

    def __call__(self, ok: bool, what: str) -> None:
        print(f"check {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failed.append(what)

    def figure(self, what: str, value: Any, low: float | None = None, high: float | None = None) -> bool:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (low is None or value >= low) and (high is None or value <= high)
        bounds = "" if low is None and high is None else f" within [{_num(low, '-inf')}, {_num(high, 'inf')}]"
        self(ok, f"{what} computed, finite{bounds} ({value})")
        return ok

    def goal(self, ok: bool, what: str) -> None:
        note = "" if self.enforce_goals else " (smoke run: not enforced)"
        print(f"goal {'met' if ok else 'NOT MET'}: {what}{note}", flush=True)
        if not ok:
            self.missed.append(what)

    def exit_code(self) -> int:
        if self.failed:
            print(f"FAILED: {len(self.failed)} check(s): " + "; ".join(self.failed), flush=True)
        if self.missed and self.enforce_goals:
            print(f"GOAL MISSED: {len(self.missed)} goal(s): " + "; ".join(self.missed), flush=True)
        return 1 if self.failed or (self.missed and self.enforce_goals) else 0


def _num(bound: float | None, unbounded: str) -> str:
    return unbounded if bound is None else f"{bound:g}"


def callback_makers(log_dir: str | None) -> dict[str, Callable[[], Any]]:
    """A maker per callback of `CALLBACKS`: as a user adds it, quiet, with no profiler window due."""
    import keras_gpu_tools as kgt

    return {
        "GPUUtilizationLogger": lambda: kgt.GPUUtilizationLogger(log_dir=log_dir),
        "InputBoundDetector": lambda: kgt.InputBoundDetector(log_dir=log_dir, verbose=0),
        "ProfilerWindow": lambda: kgt.ProfilerWindow(log_dir=log_dir, start_step=10**9, verbose=0),
        "OOMBatchSizeReducer": lambda: kgt.OOMBatchSizeReducer(log_dir=log_dir, verbose=0),
        "LiveView": lambda: kgt.LiveView(),
        "MixedPrecisionCheck": lambda: kgt.MixedPrecisionCheck(),
    }


def epoch_clock(times: list[float], stop_after: tuple[int, float] | None = None, warmup: int = 1):
    """A callback that appends each epoch's wall time, in seconds, to ``times``.

    ``stop_after=(epochs, seconds)`` ends the fit once at least ``epochs`` epochs past the first ``warmup`` (the
    first compiles) have run and they took at least ``seconds`` together: a steady figure however long an epoch is.
    """
    import keras

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.t0)
            timed = times[warmup:]
            if stop_after is not None and len(timed) >= stop_after[0] and sum(timed) >= stop_after[1]:
                self.model.stop_training = True

    return Clock()


def same_batch(x, y, steps: int):
    """A ``keras.utils.PyDataset`` of ``steps`` batches, each ``(x, y)``: one batch repeated, no host slicing."""
    import keras

    class SameBatch(keras.utils.PyDataset):
        def __len__(self):
            return steps

        def __getitem__(self, i):
            return x, y

    return SameBatch()


# --- The package's private names (one place) ----------------------------------------------------


def train_function(model) -> Callable:
    """The function fit() calls for a step (the package's step hook where one is in place)."""
    from keras_gpu_tools.runtime import keras_internals

    return keras_internals.get_train_function(model)


def set_train_function(model, fn: Callable) -> None:
    """Puts ``fn`` in as the function fit() calls for a step."""
    from keras_gpu_tools.runtime import keras_internals

    keras_internals.set_train_function(model, fn)


def sync(outputs) -> None:
    """Waits until the device has computed ``outputs``."""
    from keras_gpu_tools import backends

    backends.get().sync(outputs)


def gpu_devices() -> list[str]:
    """The GPUs the Keras backend in use sees, by name."""
    from keras_gpu_tools import backends

    return backends.get().gpu_devices()


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of any backend."""
    from keras_gpu_tools import backends

    return backends.is_oom(exc)


def verdict(wait_fraction: float | None) -> str:
    """InputBoundDetector's verdict for a wait fraction ("not input-bound", ...)."""
    from keras_gpu_tools.input.categories import classify

    return classify(wait_fraction)


def outside_layers() -> str:
    """The layer table's row of the ops in no layer, by path ("(outside layers)")."""
    from keras_gpu_tools.profiling.layers import OUTSIDE

    return OUTSIDE


def trace_op_ms_per_step(files: list[str], steps: int) -> float | None:
    """The profiler's own op time per step in a window's trace files, before any op is put in a layer.

    Read with the package's trace reader (device kernels where the trace has them, else host ops),
    every op summed, over the steps the trace marks (torch: only the ops inside them), else ``steps``.
    Copies between host and device are left out, as the table and xprof's per-op totals leave them.
    None without a trace file.
    """
    from keras_gpu_tools.profiling.layer_trace import torch_ops, xplane_ops

    xplanes = [f for f in files if f.endswith(".xplane.pb")]
    torch_files = [f for f in files if f.endswith(".pt.trace.json")]
    if not xplanes and not torch_files:
        return None
    found = xplane_ops(xplanes) if xplanes else torch_ops(torch_files)
    in_steps = [op for op in found.ops if not op.copy and (not found.steps or op.step is not None)]
    return sum(op.ps for op in in_steps) / max(1, found.steps or steps) / 1e9


def keras_batch_end_on_training_thread() -> None:
    """Runs Keras's batch-end hooks on the training thread instead of its thread pool (a diagnostic).

    With the pool (Keras's default when every callback is ``async_safe``), the hooks of step N
    run on a pool thread while the training thread runs step N+1, and the two share the
    interpreter lock. Without it the package's own cost per step shows alone.
    """
    from keras.src.callbacks import callback_list

    configure = callback_list.CallbackList._configure_async_dispatch

    def synchronous(self, callbacks):
        configure(self, callbacks)
        self._async_train = self._async_test = self._async_predict = False

    callback_list.CallbackList._configure_async_dispatch = synchronous


def fit_callback_list(frame_depth: int = 2):
    """The CallbackList of the fit() that is calling (found on the stack: Keras keeps no reference)."""
    from keras.src.callbacks.callback_list import CallbackList

    frame = sys._getframe(frame_depth)
    while frame is not None:
        found = frame.f_locals.get("callbacks")
        if isinstance(found, CallbackList):
            return found
        frame = frame.f_back
    raise RuntimeError("fit()'s CallbackList not found (Keras internals changed?)")
