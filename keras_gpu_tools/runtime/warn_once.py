"""A warning issued once per distinct cause, for the whole of a callback's life.

Monitoring that cannot do something (an NVML field a GPU does not report, a
profiler that will not start) warns the user once and then stays quiet: each
callback holds one :class:`WarnOnce` in its own warning category.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable

from keras_gpu_tools.errors import GPUMonitoringWarning


class WarnOnce:
    """Issues each distinct warning once per instance, in one category.

    Args:
        category: the warning class every message is issued as. Defaults to
            `GPUMonitoringWarning`.
    """

    def __init__(self, category: type[Warning] = GPUMonitoringWarning):
        self.category = category
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()
        self.messages: list[str] = []

    def __call__(self, key: Hashable, message: str) -> None:
        """Warns ``message`` unless a warning of the same ``key`` was issued already."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            self.messages.append(message)
        warnings.warn(message, self.category, stacklevel=2)
