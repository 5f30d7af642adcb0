"""Trace folders and sessions, window validation, and reading traces back with xprof.

The sessions themselves live with their backend (``backends/<framework>/profiler.py``,
``Backend.profiler()``); each has the same four operations: ``available()``
(and why not), ``start(run_dir, options)``, ``step(step_num)`` (a context manager
that marks one training step for the profiler) and ``stop(outputs)``, plus
``pattern`` (the trace files it writes) and ``owner_thread_only`` (torch: it can
only be stopped from the thread that started it).

Trace layout (what TensorBoard's Profile tab reads):
``<run_dir>/plugins/profile/<timestamp>/<host>.xplane.pb`` for TensorFlow and
JAX. torch writes a Chrome/Perfetto trace, ``<host>.pt.trace.json``, in the
same kind of folder; TensorBoard's profile plugin does not read it (open it at
https://ui.perfetto.dev or chrome://tracing).

In a job of several processes (``keras.distribution.initialize``) every
process traces the same global steps into its own run first (two processes on
one host would both write ``<host>.xplane.pb``), then moves its files into one
session of the job's run, renamed ``<host>_p<i>.*`` (:func:`move_to_job_session`):
``<log_dir>/<run>/job/plugins/profile/<session>/<host>_p<i>.xplane.pb``. The
Profile tab then shows one session with one host per process.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.native_logs import quiet_native_logs
from keras_gpu_tools.runtime.validation import check_pairs

logger = logging.getLogger("keras_gpu_tools")

LARGE_TRACE_BYTES = 1 << 30  # TensorBoard is known to crash loading traces over ~1 GB


class ProfilerBusy(RuntimeError):
    """Another profiler session (not ours) is running."""


@dataclass
class TracerOptions:
    host_tracer_level: int = 2  # 1: user annotations; 2: + high-level runtime; 3: verbose
    python_tracer: bool = False  # Python function calls (costly)
    device_tracer_level: int = 1  # 0 off, 1 on


def session_dirs(run_dir: str) -> set:
    return set(glob.glob(os.path.join(run_dir, "plugins", "profile", "*")))


def staging_dir(run_dir: str) -> str:
    """Where this process's profiler writes a window (``run_dir/plugins/.staging_<host>_pid<pid>``), fresh.

    Never the run's own ``plugins/profile``: another process profiling into the
    same run in the same second would write the same ``<timestamp>/<host>.*``
    there, and each would take the other's session for its own.
    """
    path = os.path.join(run_dir, "plugins", f".staging_{schema.training_run()}")
    shutil.rmtree(path, ignore_errors=True)  # what a window of this process that died left
    return path


def claim_session(run_dir: str, staging: str, pattern: str, label: str) -> list[str]:
    """Moves the session folder(s) the profiler wrote under ``staging`` into the run as ``<name>_<label>``.

    The profilers name sessions by the second, so two windows in one second
    would write into the same folder; a unique name per window prevents that
    and tells the windows apart in TensorBoard's session list. The folder is
    made with an exclusive ``mkdir``: another process claiming the same name
    at the same moment gets ``<name>_<label>_2``. ``staging`` is removed.
    """
    files = []
    profile = os.path.join(run_dir, "plugins", "profile")
    os.makedirs(profile, exist_ok=True)
    try:
        for folder in sorted(session_dirs(staging)):
            base = os.path.join(profile, f"{os.path.basename(folder)}_{label}")
            target, n = base, 1
            while True:
                try:
                    os.mkdir(target)
                    break
                except FileExistsError:
                    n += 1
                    target = f"{base}_{n}"
            for name in sorted(os.listdir(folder)):
                os.replace(os.path.join(folder, name), os.path.join(target, name))
            files.extend(sorted(glob.glob(os.path.join(target, pattern))))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return files


def session_stamp() -> str:
    """A session folder's name as the profilers write it (``2026_11_26_09_05_02``)."""
    return time.strftime("%Y_%m_%d_%H_%M_%S")


def move_to_job_session(run_dir: str, before: set, pattern: str, session_dir: str, process_index: int) -> list[str]:
    """Moves what a capture just wrote under ``run_dir`` into the job's ``session_dir``.

    Each file ``<host>.<kind>`` becomes ``<host>_p<i>.<kind>``: xprof takes the
    name before the kind for the host, so every process is a host of its own
    even where several share a machine. The emptied folders are removed (an
    empty ``plugins/profile`` would show as a run without sessions). Returns
    the moved files that match ``pattern``, sorted.
    """
    suffix = pattern.lstrip("*")
    os.makedirs(session_dir, exist_ok=True)
    moved = []
    for folder in sorted(session_dirs(run_dir) - before):
        names = os.listdir(folder)
        hosts = {n[: -len(suffix)] for n in names if n.endswith(suffix)}
        for name in names:
            host = next((h for h in hosts if name.startswith(h + ".")), None)
            new = f"{host}_p{process_index}{name[len(host) :]}" if host is not None else f"p{process_index}_{name}"
            target = os.path.join(session_dir, new)
            shutil.move(os.path.join(folder, name), target)
            if new.endswith(suffix):
                moved.append(target)
        _remove_empty(folder, stop=run_dir)
    return sorted(moved)


def _remove_empty(folder: str, stop: str) -> None:
    """Removes ``folder`` and its empty parents up to (not including) ``stop``."""
    stop = os.path.abspath(stop)
    folder = os.path.abspath(folder)
    while folder != stop and folder.startswith(stop):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


# ---------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    start: int  # first global step (0-based) captured
    steps: int

    @property
    def end(self) -> int:  # exclusive
        return self.start + self.steps


def validate_windows(windows: Sequence[tuple[int, int]], argument: str = "windows") -> list[Window]:
    windows = check_pairs(argument, windows, fields=("start_step", "num_steps"), lows=(0, 1))
    out = [Window(start, steps) for start, steps in windows]
    out.sort(key=lambda w: w.start)
    for a, b in zip(out, out[1:]):
        if b.start < a.end:
            raise ValueError(
                f"Invalid value for argument `{argument}`. Received: {argument}={list(windows)!r}; "
                f"windows {(a.start, a.steps)} and {(b.start, b.steps)} overlap. Expected windows that do not overlap."
            )
    return out


# ---------------------------------------------------------------------------
# Reading a captured trace back with xprof
# ---------------------------------------------------------------------------
@dataclass
class TraceAnalysis:
    conclusion: str = ""
    step_rows: list[dict] = field(default_factory=list)  # step name, step ms, input ms
    step_time_ms: float | None = None
    input_percent: float | None = None
    hardware: str = ""
    error: str = ""


def xprof_available() -> bool:
    try:
        from xprof.convert import raw_to_tool_data  # noqa: F401

        return True
    except Exception:
        return False


def tool_data(paths: Iterable[str], tool: str, quiet: bool = True):
    """Runs one of xprof's converters on ``.xplane.pb`` files; returns parsed JSON.

    The converter's native log lines (``I0000 ... xplane_to_op_stats.cc``, written by C++ to
    descriptor 2) go to the ``keras_gpu_tools`` logger unless ``quiet`` is False.
    """
    from xprof.convert import raw_to_tool_data

    with quiet_native_logs(quiet):
        data, _ = raw_to_tool_data.xspace_to_tool_data(list(paths), tool, {})
    if data is None:
        raise RuntimeError(f"xprof could not convert the trace with {tool!r}")
    if isinstance(data, bytes):
        data = data.decode()
    return json.loads(data)


def _linked(paths: Sequence[str], folder: str) -> list[str]:
    """``paths`` reachable from ``folder`` (a hard link, else a symbolic one, else a copy)."""
    out = []
    for path in paths:
        target = os.path.join(folder, os.path.basename(path))
        for make in (os.link, os.symlink, shutil.copyfile):
            try:
                make(os.path.abspath(path), target)
                break
            except OSError:
                continue
        out.append(target)
    return out


def analyze_input_pipeline(paths: Sequence[str], isolated: bool = False, quiet: bool = True) -> TraceAnalysis:
    """xprof's input-pipeline analysis of a trace: per-step rows and its verdict.

    xprof caches its result in the trace's folder as ``ALL_HOSTS.op_stats_v2.pb``
    whatever the files it was given, and serves that cache for the whole
    session later (TensorBoard too). ``isolated`` analyzes links to the files
    in a temporary folder instead: one process's trace of a job session must
    not leave its own figures as the session's.
    """
    out = TraceAnalysis()
    try:
        if isolated:
            with tempfile.TemporaryDirectory(prefix="keras_gpu_tools_xprof_") as tmp:
                tables = tool_data(_linked(paths, tmp), "input_pipeline_analyzer", quiet)
        else:
            tables = tool_data(paths, "input_pipeline_analyzer", quiet)
    except Exception as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    for table in tables:
        props: Any = table.get("p", {}) if isinstance(table, dict) else {}  # xprof's JSON
        if "input_conclusion" not in props:
            continue
        out.conclusion = props.get("input_conclusion", "")
        out.hardware = props.get("hardware_type", "")
        cols = [c.get("id") for c in table.get("cols", [])]
        for row in table.get("rows", []):
            values = [c.get("v") if isinstance(c, dict) else None for c in row.get("c", [])]
            rec = dict(zip(cols, values))
            out.step_rows.append(
                {"step": rec.get("stepnum"), "step_ms": rec.get("stepTimeMs"), "input_ms": rec.get("infeedTimeMs")}
            )
        try:
            out.step_time_ms = float(props.get("steptime_ms_average"))
        except (TypeError, ValueError):
            pass
        total = sum(r["step_ms"] or 0 for r in out.step_rows)
        if total > 0:
            out.input_percent = 100.0 * sum(r["input_ms"] or 0 for r in out.step_rows) / total
        break
    return out
