"""CPU use over an interval: the machine's, and this process's with its worker processes."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

RESCAN_S = 1.0  # the worker processes are looked for at most this often
STAT_PATH = "/proc/stat"  # the machine's CPU times (Linux)


class CpuMeter:
    """CPU use between two calls: the whole machine's, and this process's (its workers included).

    The process's share tells whether input and compute saturate the host
    themselves; the machine's alone cannot (other processes count there too).
    Reads psutil's counters directly, never its shared per-call state. The
    workers are looked for at most every ``RESCAN_S`` (a look reads a file per
    thread of the process): with epochs of milliseconds an epoch end costs the
    workers' counters alone, and a worker started in between counts from the
    next look on.

    Args:
        every: ``every(interval, fn, on_error)`` of a thread that runs periodic jobs
            (`FitSession.every`): the looks then run there, off the caller's thread,
            but for the first reading's. None looks on the caller's thread. Defaults to `None`.
    """

    def __init__(self, every: Callable[..., Any] | None = None):
        self._workers: list | None = None
        self._looked = float("-inf")
        self._first = True  # until the first reading: it looks itself (workers start with the first batches)
        self._watched = False
        try:
            import psutil

            self.psutil = psutil
            self.proc = psutil.Process()
            self.cores = float(psutil.cpu_count() or 0)
            self._stat = SystemTimes(psutil)
            self.start = self._stat()
            self.own_start = self._own()
            self.wall = time.monotonic()
            if every is not None:
                every(RESCAN_S, self.look, lambda e: None)  # (a failed look keeps the workers found before)
                self._watched = True
        except Exception:
            self.psutil = None

    def restart(self) -> CpuMeter:
        """Measures from now on (the workers found so far kept: no new look unless one is due)."""
        if self.psutil is not None:
            try:
                self.start, self.own_start, self.wall = self._stat(), self._own(), time.monotonic()
            except Exception:
                pass
        return self

    def _own(self) -> float:
        """CPU seconds of this process, its reaped children and its live ones (DataLoader, PyDataset workers)."""
        t = os.times()  # the kernel's figures of /proc/<pid>/stat, without reading and parsing the file
        total = t.user + t.system + t.children_user + t.children_system
        if self._workers is None or self._first or (not self._watched and time.monotonic() - self._looked >= RESCAN_S):
            self.look()
        for child in self._workers or ():
            try:  # a worker may end at any moment
                c = (self.psutil.Process(child) if isinstance(child, int) else child).cpu_times()
                total += c.user + c.system
            except self.psutil.Error:
                pass
        return total

    def look(self) -> None:
        """Looks for the worker processes now (on whichever thread calls it)."""
        pids = descendants(self.proc.pid)
        self._workers, self._looked = (self.proc.children(recursive=True) if pids is None else pids), time.monotonic()

    def read(self) -> dict[str, float]:
        if self.psutil is None:
            return {}
        try:
            now, own, wall = self._stat(), self._own(), time.monotonic()
            total = sum(now) - sum(self.start)
            idle = (now.idle + getattr(now, "iowait", 0.0)) - (self.start.idle + getattr(self.start, "iowait", 0.0))
            cores = self.cores
            out: dict[str, float] = {"cpu_count": cores}
            if total > 0:
                out["system_cpu_percent"] = 100.0 * (1.0 - idle / total)
            if wall > self.wall and cores:
                out["process_cpu_percent"] = min(100.0, 100.0 * (own - self.own_start) / ((wall - self.wall) * cores))
            self.start, self.own_start, self.wall, self._first = now, own, wall, False
            return out
        except Exception:
            return {}


class SystemTimes:
    """``psutil.cpu_times()``, the same figures: on Linux from ``/proc/stat`` kept open (read twice an epoch).

    psutil opens the file at each call; this reads it from its start again
    through one descriptor, parses its first line as psutil does (each field
    in clock ticks over ``SC_CLK_TCK``) and returns psutil's named tuple.
    Elsewhere, or where the file cannot be read, psutil's call.
    """

    def __init__(self, psutil):
        self._psutil = psutil
        self._fd: int | None = None
        try:
            self._ticks = float(os.sysconf("SC_CLK_TCK"))
            self._fields = psutil.cpu_times()._fields
            self._type = type(psutil.cpu_times())
            self._fd = os.open(STAT_PATH, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)  # kept alive by weakref until it runs
            self()  # a file psutil reads alike: otherwise psutil's call from now on
        except Exception:
            self._fd = None

    def __call__(self):
        if self._fd is None:
            return self._psutil.cpu_times()
        try:
            line = os.pread(self._fd, 512, 0).split(b"\n", 1)[0].split()
            if line[0] != b"cpu":
                raise ValueError("/proc/stat: no cpu line first")
            values = [float(x) / self._ticks for x in line[1 : len(self._fields) + 1]]
            return self._type(*values)
        except Exception:
            self._fd = None
            return self._psutil.cpu_times()


def descendants(pid: int) -> list[int] | None:
    """The live descendants of process ``pid``, from Linux's ``/proc/<pid>/task/<tid>/children``.

    psutil finds children by reading the parent of every process on the
    machine (all of ``/proc``), milliseconds a call where many processes run,
    and the detector reads them twice an epoch. These files list each thread's own
    children, so the cost follows this process's threads instead. None where
    the kernel has no such files (psutil's way then).
    """
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):  # a thread that ended meanwhile
                continue
            out += kids
            todo += kids
    return out
