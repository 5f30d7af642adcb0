"""Reading TensorBoard event files: the runs of a log directory and the values of each run.

The reader of what `keras_gpu_tools.logdir.writer` (and Keras's TensorBoard callback) writes.
It reads the TFRecord framing itself, so that a file which cannot be read is named rather than
skipped; TensorBoard's protos are imported when a file is first read, never TensorFlow.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import stat
import struct
from typing import Any

from keras_gpu_tools.logdir import schema

_RECORD_HEADER = struct.Struct("<QI")  # payload length, masked CRC32C of the length
_RECORD_FOOTER = 4  # the masked CRC32C of the payload
_DT_STRING = 7  # the tensor dtype of text summaries
# The JSON the callbacks write nests a few levels; a deeper text is refused before `json.loads`,
# whose recursion would otherwise end in a RecursionError.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")
_FILE_TYPES = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def printable(name: str) -> str:
    """A file name as text that can be printed and written: bytes that are not UTF-8 as escapes (``\\xff``).

    `os` decodes such bytes to lone surrogates (PEP 383), which no UTF-8 text can hold.
    """
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def written_order(name: str) -> list:
    """A sort key that puts event files in the order they were written.

    Their names end in numbers (``events.out.tfevents.<time>.<host>.<pid>.<counter>``): compared as
    numbers, not text, so that a process's tenth file in one second comes after its ninth.
    """
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def find_runs(log_dir: str) -> list[tuple[str, str, list[str]]]:
    """(run name, directory, event files) of every folder under `log_dir` holding event files.

    The run name is the folder relative to `log_dir` with ``/`` separators (``"."`` for `log_dir`
    itself), `printable`; the directory is the path to open. TensorBoard's ``plugins`` folders are
    skipped.
    """
    runs = []
    for root, dirs, files in os.walk(log_dir):
        dirs[:] = sorted(d for d in dirs if d != "plugins")
        events = sorted((f for f in files if ".tfevents." in f), key=written_order)
        if events:
            rel = os.path.relpath(root, log_dir)
            runs.append(("." if rel == "." else printable(rel.replace(os.sep, "/")), root, events))
    return sorted(runs)


def read_event_file(path: str) -> tuple[list[Any], str | None]:
    """The events of one TensorBoard event file, and why reading stopped early (None: it did not).

    Only a regular file is read: it is opened without blocking (a FIFO would block `open()`) and
    refused unless `fstat` says it is one. Each record's length must pass its checksum and fit in
    what is left of the file (a crafted length never becomes an allocation), and its payload must
    parse as an `Event`. The payload checksum is not verified (TensorBoard's pure-Python CRC32C
    reads about 2 MB/s); the length checksum and the parse catch a file that is not an event file,
    garbage, and a file cut short. A file of 0 bytes (a writer stopped before its first flush) is
    named as empty.
    """
    from google.protobuf.message import DecodeError
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from keras_gpu_tools.runtime import deps

    _, event_pb2 = deps.tensorboard_protos()
    events: list[Any] = []

    def stopped(what: str) -> str:
        return f"{what} ({len(events)} event(s) read before it)" if events else what

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        return events, f"could not be opened ({type(e).__name__}: {e.strerror or e})"
    try:
        with open(fd, "rb", closefd=True) as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = next((what for test, what in _FILE_TYPES if test(info.st_mode)), "a special file")
                return events, f"is not a regular file ({kind}); it is not opened for reading"
            size = info.st_size
            if size == 0:
                return events, "is empty (0 bytes: its writer stopped before writing anything)"
            offset = 0
            while True:
                header = f.read(_RECORD_HEADER.size)
                if not header:
                    return events, None
                if len(header) < _RECORD_HEADER.size:
                    return events, stopped(f"is truncated: the record at byte {offset} is cut short")
                length, crc = _RECORD_HEADER.unpack(header)
                if masked_crc32c(header[:8]) != crc:
                    what = "is corrupt" if events else "is not a TensorBoard event file"
                    return events, stopped(f"{what}: bad record header at byte {offset}")
                left = size - offset - _RECORD_HEADER.size
                if length + _RECORD_FOOTER > left:
                    what = "is truncated or corrupt" if events else "is not a TensorBoard event file"
                    return events, stopped(
                        f"{what}: the record at byte {offset} announces {length} bytes, "
                        f"but only {max(left, 0)} bytes follow its header"
                    )
                payload = f.read(length + _RECORD_FOOTER)  # the payload and its checksum
                if len(payload) < length + _RECORD_FOOTER:  # the file shrank while read
                    return events, stopped(f"is truncated: the record at byte {offset} is cut short")
                event = event_pb2.Event()
                try:
                    event.ParseFromString(payload[:length])
                except DecodeError:
                    return events, stopped(f"is corrupt: the record at byte {offset} is not an event")
                events.append(event)
                offset += _RECORD_HEADER.size + length + _RECORD_FOOTER
    except OSError as e:
        return events, stopped(f"could not be read ({type(e).__name__}: {e.strerror or e})")


def json_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not counted).

    Linear and iterative: a text of any depth is measured without recursion.
    """
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # cannot nest deeper: skip the scan
        return min(text.count("[") + text.count("{"), MAX_JSON_DEPTH)
    brackets = _JSON_BRACKET.findall(_JSON_STRING.sub("", text))
    return max(itertools.accumulate(1 if b in "[{" else -1 for b in brackets), default=0)


@dataclasses.dataclass
class Point:
    """One summary value of an event file: a number or a text."""

    wall_time: float
    step: int
    value: float = math.nan
    text: str = ""


@dataclasses.dataclass
class RunValues:
    """The values of one run by tag: its scalars, its texts, and how many events were read."""

    scalars: dict[str, list[Point]] = dataclasses.field(default_factory=dict)
    texts: dict[str, list[Point]] = dataclasses.field(default_factory=dict)
    events: int = 0


def read_run(run: str, directory: str, files: list[str], unreadable: list[tuple[str, str]]) -> RunValues:
    """The scalars and the texts of one run by tag, and how many events were read.

    Scalars are both `simple_value`s (this package's writer) and one-number
    tensors (Keras's TensorBoard callback). Each file that could not be read,
    whole or in part, is added to `unreadable` as (path relative to the log
    directory, `printable`, what went wrong); so is a file whose JSON text (a
    tag ending in ``/data``) nests deeper than `MAX_JSON_DEPTH`, that text
    left out.
    """
    out = RunValues()
    for name in files:
        shown = printable(name) if run == "." else f"{run}/{printable(name)}"
        events, problem = read_event_file(os.path.join(directory, name))
        if problem is not None:
            unreadable.append((shown, problem))
        out.events += len(events)
        for e in events:
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    if math.isfinite(v.simple_value):
                        out.scalars.setdefault(v.tag, []).append(Point(e.wall_time, e.step, value=v.simple_value))
                elif v.HasField("tensor") and v.tensor.dtype == _DT_STRING:
                    text = _text_of(v.tensor)
                    if v.tag.endswith(schema.DATA_SUFFIX) and json_depth(text) > MAX_JSON_DEPTH:
                        unreadable.append(
                            (
                                shown,
                                f"holds a JSON text (tag {v.tag!r}, step {e.step}) nested deeper than "
                                f"{MAX_JSON_DEPTH} levels; that text is left out",
                            )
                        )
                        continue
                    out.texts.setdefault(v.tag, []).append(Point(e.wall_time, e.step, text=text))
                elif v.HasField("tensor"):
                    value = _scalar_of(v.tensor)
                    if value is not None:
                        out.scalars.setdefault(v.tag, []).append(Point(e.wall_time, e.step, value=value))
    return out


def _text_of(proto) -> str:
    return proto.string_val[0].decode("utf-8", "replace") if proto.string_val else ""


def _scalar_of(proto) -> float | None:
    from tensorboard.util import tensor_util

    try:
        value = float(tensor_util.make_ndarray(proto).item())
    except Exception:  # not a single number: a histogram, an image, ...
        return None
    return value if math.isfinite(value) else None
