"""Native log lines kept out of the user's terminal while the package makes a native call that writes them.

TensorFlow's and XLA's C++ code logs through absl straight to file
descriptor 2 (``I0000 00:00:1732790000.123456   4242 profiler_session.cc:104]
Profiler session initializing.``): starting and stopping a profiler session
writes dozens of such lines into the progress bar. Python's ``sys.stderr``
cannot catch them, so :func:`quiet_native_logs` points descriptor 2 at a
temporary file for the duration of the call and puts it back in a
``finally``, also when the call raises. What was written meanwhile is then
sorted: native log lines go to the ``keras_gpu_tools`` logger (DEBUG), every
other line (a warning Python printed from another thread) to the terminal,
as it would have.

The conversion of a trace by xprof, on a background thread, is such a call
too: its converter logs a line per plane and op (``I0000 ...
xplane_to_op_stats.cc:...``), dozens per window.

Blocks may nest and overlap across threads: the first one in redirects, the
last one out restores. Keep the blocks short: for their duration every
thread's writes to descriptor 2 are held back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

logger = logging.getLogger("keras_gpu_tools")

# absl's and glog's prefix (severity, MMDD, time, thread, file:line], torch's in brackets), the older
# TensorFlow one (date, time: severity), the lines of torch's profiler (kineto), and absl's first warning.
NATIVE_LINE = re.compile(
    rb"^\[?[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+\] "
    rb"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] [^ \]]+\] "
    rb"|^(?:STAGE|USDT):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [^ \]]+\] "
    rb"|^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR\s*$"
)
_FD = 2

_lock = threading.Lock()
_depth = 0
_saved: int | None = None  # descriptor 2 as it was
_file: IO[bytes] | None = None  # where descriptor 2 points meanwhile


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()  # what Python buffered belongs before (or inside) the block
    except Exception:
        pass


def _enter() -> bool:
    global _depth, _saved, _file
    with _lock:
        if _depth == 0:
            file = saved = None
            try:
                _flush_stderr()
                file = tempfile.TemporaryFile(prefix="keras_gpu_tools-native-")
                saved = os.dup(_FD)
                os.dup2(file.fileno(), _FD)
            except Exception:  # no descriptor 2 (a GUI without a console): nothing to keep out
                if saved is not None:
                    os.close(saved)
                if file is not None:
                    file.close()
                return False
            _saved, _file = saved, file
        _depth += 1
        return True


def _leave() -> None:
    global _depth, _saved, _file
    with _lock:
        _depth -= 1
        if _depth:
            return
        saved, file, _saved, _file = _saved, _file, None, None
        _flush_stderr()
        assert saved is not None and file is not None  # set by the first _enter()
        try:
            os.dup2(saved, _FD)
        finally:
            os.close(saved)
    try:
        file.seek(0)
        written = file.read()
    finally:
        file.close()
    _sort(written)


def _sort(written: bytes) -> None:
    """Native log lines to the logger, everything else back to descriptor 2."""
    rest = []
    for line in written.splitlines(keepends=True):
        if NATIVE_LINE.match(line):
            logger.debug("native log: %s", line.decode("utf-8", "replace").rstrip())
        else:
            rest.append(line)
    data = b"".join(rest)
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(_FD, data) :]


@contextlib.contextmanager
def quiet_native_logs(enabled: bool = True) -> Iterator[None]:
    """While the block runs, native log lines written to descriptor 2 go to the logger (see the module docstring).

    ``enabled=False`` leaves descriptor 2 alone: the lines reach the terminal (a callback's ``verbose=2``).
    """
    entered = _enter() if enabled else False
    try:
        yield
    finally:
        if entered:
            _leave()
