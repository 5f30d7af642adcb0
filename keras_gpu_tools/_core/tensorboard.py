"""Writing TensorBoard event files on every Keras backend.

Uses the ``tensorboard`` package's own event writer, which needs no TensorFlow:
the same code path serves the TensorFlow, JAX and torch backends, and it runs no
TensorFlow op on our background threads (``tf.summary`` would). Scalars are
written as ``simple_value`` and text with the text plugin's metadata, both of
which TensorBoard reads natively.

Each callback writes to a run of its own (``log_dir/<run>``, for example
``logs/gpu``), so it shows next to Keras's ``train``/``validation`` runs and never
shares a directory with another writer (TensorBoard follows only the newest
event file of a run while it is being written).

Next to a text meant for people, a callback writes the same facts as JSON
(`EventWriter.json`, a text tag ending in ``/data``), which the training
report reads instead of the prose.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import threading
import time
from typing import Any

from keras_gpu_tools._core import deps, validation


def check_log_dir(log_dir, argument: str = "log_dir") -> str | None:
    """:func:`validation.check_log_dir`, in the (value, name) order of its older callers."""
    return validation.check_log_dir(argument, log_dir)


def to_plain(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses as dicts, tuples as lists, NaN and infinities as None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    return str(value)  # an object JSON has no type for: its text


class EventWriter:
    """A thread-safe writer of scalars and text into one TensorBoard run."""

    def __init__(self, run_dir: str):
        event_file_writer = deps.tensorboard_event_writer()
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        self._writer = event_file_writer.EventFileWriter(run_dir, flush_secs=10)
        self._lock = threading.Lock()
        self._closed = False

    def scalars(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        if not values:
            return
        summary_pb2, event_pb2 = deps.tensorboard_protos()
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
        )
        self._add(event_pb2.Event(wall_time=wall_time or time.time(), step=int(step), summary=summary))

    def text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.plugins.text import summary_v2  # no TensorFlow needed

        _, event_pb2 = deps.tensorboard_protos()
        summary = summary_v2.text_pb(tag, text)
        self._add(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def _add(self, event) -> None:
        with self._lock:
            if not self._closed:
                self._writer.add_event(event)

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._writer.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()

    def json(self, tag: str, value: Any, step: int) -> None:
        """Writes `value` (dicts, lists, dataclasses, numbers, text) as a JSON text summary."""
        self.text(tag, json.dumps(to_plain(value), allow_nan=False), step)
