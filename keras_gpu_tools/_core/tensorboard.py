"""Writing TensorBoard event files on every Keras backend.

Uses the ``tensorboard`` package's record format and protos, never TensorFlow:
the same code path serves the TensorFlow, JAX and torch backends, imports no
TensorFlow into a JAX or torch process (``tensorboard``'s own ``EventFileWriter``
does, when TensorFlow is installed), and runs no TensorFlow op on our background
threads (``tf.summary`` would). Scalars are
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
import itertools
import json
import logging
import math
import numbers
import os
import socket
import threading
import time
from typing import Any

from keras_gpu_tools._core import deps, validation

logger = logging.getLogger("keras_gpu_tools")
_file_ids = itertools.count()  # the last part of an event file's name: unique within the process


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
    """A thread-safe writer of scalars and text into one TensorBoard run, with no thread of its own.

    ``tensorboard``'s ``EventFileWriter`` keeps a thread per file to write a
    queue in the background. Our events are few (a point every sampling
    interval at most, the rest once an epoch) and our log directories are
    local, so each event is written and flushed by its caller: no thread per
    run is kept alive through the fit (threads that never run still cost the
    training thread on JAX, ``docs/architecture.md``), TensorBoard sees each
    event at once, and nothing waits in a queue if the process dies. The
    format is TensorBoard's own (its ``RecordWriter``), read back by its reader.

    A failed write (a full disk) warns once and ends the writer's writes: the
    logs stop, training goes on.
    """

    def __init__(self, run_dir: str):
        record_writer = deps.tensorboard_record_writer()
        _, event_pb2 = deps.tensorboard_protos()
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        # TensorBoard's own file name, which its reader orders runs' files by.
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_ids)}"
        self.path = os.path.join(run_dir, name)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._records = record_writer.RecordWriter(self._file)
        self._lock = threading.Lock()
        self._closed = False
        self._add(
            event_pb2.Event(
                wall_time=time.time(),
                file_version="brain.Event:2",
                source_metadata=event_pb2.SourceMetadata(writer="keras_gpu_tools"),
            )
        )

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
        data = event.SerializeToString()
        with self._lock:
            if self._closed:
                return
            try:
                self._records.write(data)
                self._file.flush()
            except OSError as e:
                self._fail(e)

    def flush(self) -> None:
        """Kept for callers: every event is flushed as it is written."""
        with self._lock:
            if not self._closed:
                try:
                    self._file.flush()
                except OSError as e:
                    self._fail(e)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._file.close()
            except OSError as e:
                logger.warning("keras_gpu_tools: closing the TensorBoard event file %s failed (%s)", self.path, e)

    def _fail(self, error: OSError) -> None:  # under the lock
        self._closed = True
        logger.warning(
            "keras_gpu_tools: writing the TensorBoard event file %s failed (%s); this run's logs stop here, "
            "training goes on.",
            self.path,
            error,
        )
        try:
            self._file.close()
        except OSError:
            pass

    def json(self, tag: str, value: Any, step: int) -> None:
        """Writes `value` (dicts, lists, dataclasses, numbers, text) as a JSON text summary."""
        self.text(tag, json.dumps(to_plain(value), allow_nan=False), step)
