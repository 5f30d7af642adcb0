"""Which runs of a log directory are this process's, when several trainings write it at the same time.

A training alone in a log directory writes its runs as named (``input``,
``profile``, ...). A second process that trains into the same directory while
the first still does (no ``keras.distribution``, no launcher that numbers
them) writes its own runs one level down, ``<run>/<host>_pid<pid>``
(:func:`schema.training_run`), so no run has two writers and the report keeps
the two trainings apart (``report(log_dir, layout="<host>_pid<pid>")``).

Who is first is decided by an advisory lock (``fcntl.flock``) on
``log_dir/.keras_gpu_tools.lock``, held while any fit() of the process writes
there: the kernel releases it when the process dies, so a crashed training
never keeps the names. Where no such lock can be taken (another OS, a remote
or read-only directory) every process writes the runs as named, as before.
"""

from __future__ import annotations

import logging
import os
import threading

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.validation import REMOTE_PREFIXES

logger = logging.getLogger("keras_gpu_tools")

LOCK_NAME = ".keras_gpu_tools.lock"

_lock = threading.Lock()
_held: dict[str, tuple[int | None, int, str]] = {}  # real path -> (locked fd or None, fits holding it, suffix)


def claim(log_dir: str) -> str:
    """Takes this process's claim on ``log_dir`` for one fit(): "" (its runs as named) or its runs' suffix.

    Every :func:`claim` is matched by one :func:`release` of the same directory.
    """
    if log_dir.startswith(REMOTE_PREFIXES):
        return ""
    key = os.path.realpath(log_dir)
    with _lock:
        held = _held.get(key)
        if held is not None:
            fd, count, suffix = held
            _held[key] = (fd, count + 1, suffix)
            return suffix
        fd, suffix = _take(key)
        _held[key] = (fd, 1, suffix)
    if suffix:
        logger.warning(
            "keras_gpu_tools: another training writes the log directory %s at the same time; this one's runs "
            "are <run>/%s (report them with report(log_dir, layout=%r)).",
            log_dir,
            suffix,
            suffix,
        )
    return suffix


def release(log_dir: str) -> None:
    """Gives back one fit()'s claim on ``log_dir``; the lock goes with the last."""
    if log_dir.startswith(REMOTE_PREFIXES):
        return
    key = os.path.realpath(log_dir)
    with _lock:
        held = _held.get(key)
        if held is None:
            return
        fd, count, suffix = held
        if count > 1:
            _held[key] = (fd, count - 1, suffix)
            return
        del _held[key]
    if fd is not None:
        os.close(fd)  # (closing the descriptor releases its lock)


def _take(path: str) -> tuple[int | None, str]:
    """The locked descriptor and "" where this process is first (or cannot tell); else None and its suffix."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: every process writes the runs as named
        return None, ""
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None, ""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, ""
    except BlockingIOError:  # a live process holds it: another training writes here now
        os.close(fd)
        return None, schema.training_run()
    except OSError:  # a file system without locks
        os.close(fd)
        return None, ""
