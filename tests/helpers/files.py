"""Files that tests make hostile: a FIFO released so that a blocked reader fails instead of hanging."""

import contextlib
import os
import threading


@contextlib.contextmanager
def released_after(fifo, seconds=5.0):
    """Opens `fifo` for writing after `seconds`, so that a reader blocked in open() returns (the test fails, not hangs)."""

    def release():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
