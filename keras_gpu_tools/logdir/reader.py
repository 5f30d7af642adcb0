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
from collections.abc import Callable, Collection, Iterator
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.crc32c import MASK_DELTA, checksum, masked_crc32c
from keras_gpu_tools.logdir.series import Series

_RECORD_HEADER = struct.Struct("<QI")  # payload length, masked CRC32C of the length
_RECORD_FOOTER = 4  # the masked CRC32C of the payload
_RECORD_CRC = struct.Struct("<I")
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
_MAX_EVENT_BYTES = 2**31  # protobuf refuses messages of 2 GiB or more


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
    """The events of one TensorBoard event file, and what was said of it (None: nothing, every record read).

    All of them in a list: for a small file (the report streams them, see `EventFile`).
    """
    stream = EventFile(path)
    events = list(stream)
    return events, stream.said()


MAX_OFFSETS_NAMED = 5  # the bad records of a file named by their offset; the rest counted


class EventFile:
    """The events of one TensorBoard event file, one at a time, and what went wrong reading it.

    Only a regular file is read: it is opened without blocking (a FIFO would block `open()`) and
    refused unless `fstat` says it is one. Each record's length must pass its checksum and fit in
    what is left of the file (a crafted length never becomes an allocation); a length that fails
    its checksum ends the reading (where the next record starts is then unknown: `problem`). Each
    payload must pass its checksum too (masked CRC-32C, as TensorBoard's reader checks it) and
    parse as an `Event`: a record that does not is skipped and its offset kept (`bad_records`),
    the records after it still read. A last record cut short is what a writer stopped while
    writing leaves: not an error, said in `cut_short`. A file of 0 bytes (a writer stopped before
    its first flush) is named as empty. The file is read in chunks of `CHUNK_BYTES`: memory holds
    one chunk (or one record, when larger) and the event being read, whatever the file's size.
    """

    CHUNK_BYTES = 1 << 22

    def __init__(self, path: str):
        self.path = path
        self.problem: str | None = None  # set once iterated: why reading stopped early (None: it did not)
        self.cut_short: str | None = None  # the last record, cut short by a stopped writer
        self.bad_records: list[int] = []  # the offsets of the records skipped (bad checksum, not an event)
        self.count = 0  # events read

    def _stopped(self, what: str) -> None:
        self.problem = f"{what} ({self.count} event(s) read before it)" if self.count else what

    def _cut(self, offset: int, what: str) -> None:
        self.cut_short = (
            f"ends in a record cut short at byte {offset} ({what}), as a writer stopped while writing "
            f"leaves it; the {self.count} event(s) before it are read"
        )

    def skipped(self) -> str | None:
        """The records skipped, in words: their offsets (the first `MAX_OFFSETS_NAMED`) and how many."""
        n = len(self.bad_records)
        if not n:
            return None
        named = ", ".join(str(o) for o in self.bad_records[:MAX_OFFSETS_NAMED])
        more = f" and {n - MAX_OFFSETS_NAMED} more" if n > MAX_OFFSETS_NAMED else ""
        return (
            f"has {n} record(s) that fail their checksum or are not events, at byte(s) {named}{more}: they are left out"
        )

    def said(self) -> str | None:
        """Everything said of the file (its problems, then a last record cut short), or None."""
        parts = [p for p in (self.skipped(), self.problem, self.cut_short) if p]
        return "; ".join(parts) if parts else None

    def __iter__(self) -> Iterator[Any]:
        from google.protobuf.message import DecodeError

        from keras_gpu_tools.runtime import deps

        parse = deps.tensorboard_protos()[1].Event.FromString
        crc32c, delta = checksum(), MASK_DELTA
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        except OSError as e:
            self.problem = f"could not be opened ({type(e).__name__}: {e.strerror or e})"
            return
        try:
            with open(fd, "rb", closefd=True) as f:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    kind = next((what for test, what in _FILE_TYPES if test(info.st_mode)), "a special file")
                    self.problem = f"is not a regular file ({kind}); it is not opened for reading"
                    return
                size = info.st_size
                if size == 0:
                    self.problem = "is empty (0 bytes: its writer stopped before writing anything)"
                    return
                buf, pos, offset = b"", 0, 0  # the chunk, where in it the next record starts, and in the file
                header_size, unpack = _RECORD_HEADER.size, _RECORD_HEADER.unpack_from
                unpack_crc = _RECORD_CRC.unpack_from
                crcs: dict[int, int] = {}  # a few thousand lengths at most: their sum is at most the file's size
                while True:
                    if len(buf) - pos < header_size:
                        buf, pos = buf[pos:] + f.read(self.CHUNK_BYTES), 0
                        if len(buf) == 0:
                            return
                        if len(buf) < header_size:
                            self._cut(offset, f"{len(buf)} of its header's {header_size} bytes were written")
                            return
                    length, crc = unpack(buf, pos)
                    expected = crcs.get(length)  # the checksum of the length alone: one per length seen
                    if expected is None:
                        expected = crcs[length] = masked_crc32c(buf[pos : pos + 8])
                    if expected != crc:
                        what = "is corrupt" if self.count or self.bad_records else "is not a TensorBoard event file"
                        self._stopped(
                            f"{what}: the record header at byte {offset} fails its checksum; "
                            f"the {size - offset} bytes from it are not read"
                        )
                        return
                    left = size - offset - header_size
                    if length >= _MAX_EVENT_BYTES:  # no writer's record: a protobuf message stays under 2 GiB
                        what = "is corrupt" if self.count or self.bad_records else "is not a TensorBoard event file"
                        self._stopped(
                            f"{what}: the record at byte {offset} announces {length} bytes, more than an event "
                            f"can hold, and only {max(left, 0)} bytes follow its header; they are not read"
                        )
                        return
                    if length + _RECORD_FOOTER > left:
                        self._cut(
                            offset, f"it announces {length} bytes, but only {max(left, 0)} bytes follow its header"
                        )
                        return
                    need = header_size + length + _RECORD_FOOTER  # the header, the payload and its checksum
                    if pos + need > len(buf):
                        rest = buf[pos:]
                        buf, pos = rest + f.read(max(self.CHUNK_BYTES, need - len(rest))), 0
                        if need > len(buf):  # the file shrank while read
                            self._cut(offset, f"the file shrank to {offset + len(buf)} bytes while read")
                            return
                    end = pos + need
                    payload = buf[pos + header_size : end - _RECORD_FOOTER]
                    c = crc32c(payload)
                    if (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF != unpack_crc(buf, end - _RECORD_FOOTER)[0]:
                        event = None  # a flipped bit: its values are never shown
                    else:
                        try:
                            event = parse(payload)
                        except DecodeError:
                            event = None
                    if event is None:
                        self.bad_records.append(offset)
                    else:
                        self.count += 1
                        yield event
                    offset += end - pos
                    pos = end
        except OSError as e:
            self._stopped(f"could not be read ({type(e).__name__}: {e.strerror or e})")


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
    """One text of an event file."""

    wall_time: float
    step: int
    text: str = ""


@dataclasses.dataclass
class RunValues:
    """The values of one run by tag: its scalars, its texts, and how many events were read.

    A scalar tag is a bounded `Series` (exact figures, a sample of its points); a text tag keeps
    its last text (by wall time, then step), except the tags of `read_run`'s ``all_texts``.
    """

    scalars: dict[str, Series] = dataclasses.field(default_factory=dict)
    texts: dict[str, list[Point]] = dataclasses.field(default_factory=dict)
    events: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)  # not errors: a last record cut short


_PENDING = 1 << 18  # scalar points held before they go into their series


def read_run(
    run: str,
    directory: str,
    files: list[str],
    unreadable: list[tuple[str, str]],
    wanted: Callable[[str], bool] | None = None,
    all_texts: Collection[str] = (schema.OOM_EVENTS_DATA,),
) -> RunValues:
    """The scalars and the texts of one run by tag, and how many events were read.

    Scalars are both `simple_value`s (this package's writer) and one-number
    tensors (Keras's TensorBoard callback). Only the tags for which
    `wanted(tag)` is true are kept (all by default). Events are read one at a
    time (see `EventFile`) and only what the report draws is kept: a
    bounded `Series` per scalar tag, the last text of each text tag (every
    text of the tags in `all_texts`). Each file that could not be read,
    whole or in part, is added to `unreadable` once, as (path relative to the
    log directory, `printable`, what went wrong): records that fail their
    checksum (skipped, by offset), a text that is not UTF-8 or a JSON text (a
    tag ending in ``/data``) nested deeper than `MAX_JSON_DEPTH` (left out).
    A last record cut short (a writer stopped while writing) is no error: it
    is said once in the run's `notes`.
    """
    out = RunValues()
    pending: dict[str, list] = {}  # scalar tag -> its (wall, step, value) not yet in its series
    held = 0

    skipped: list = []  # the points of the tags not wanted: dropped at each flush

    def flush() -> None:
        skipped.clear()
        for tag, points in pending.items():
            if points:
                series = out.scalars.get(tag)
                if series is None:
                    series = out.scalars[tag] = Series(tag)
                series.extend_points(points)  # exact figures, a bounded sample of the points
                points.clear()

    def points_of(tag: str) -> list:
        points = pending[tag] = [] if wanted is None or wanted(tag) else skipped
        return points

    for name in files:
        shown = printable(name) if run == "." else f"{run}/{printable(name)}"
        stream = EventFile(os.path.join(directory, name))
        said: list[str] = []  # what is wrong with this file's texts
        for e in stream:
            wall, step, values = e.wall_time, e.step, e.summary.value
            held += len(values)
            for v in values:
                # The hot path: a GPU's figure (a simple value), written many times a second. A simple
                # value of 0 and every other kind of value take the slow path, which asks the kind.
                value = v.simple_value
                if value or v.WhichOneof("value") == "simple_value":
                    tag = v.tag
                    points = pending.get(tag)
                    if points is None:
                        points = points_of(tag)
                    points.append((wall, step, value))
                elif v.WhichOneof("value") == "tensor" and (wanted is None or wanted(v.tag)):
                    _read_tensor(out, e, v, all_texts, said)
            if held >= _PENDING:
                flush()
                held = 0
        out.events += stream.count
        wrong = [w for w in (stream.skipped(), stream.problem) if w] + said
        if wrong:
            unreadable.append((shown, "; ".join(wrong)))
        if stream.cut_short is not None:
            out.notes.append(f"{shown} {stream.cut_short}.")
    flush()
    return out


def _read_tensor(out: RunValues, e: Any, v: Any, all_texts: Collection[str], said: list[str]) -> None:
    """A tensor value: a text (the last of its tag kept), or a one-number scalar (Keras's).

    A text that is not UTF-8, or JSON nested too deep, is left out and said in `said`.
    """
    if v.tensor.dtype == _DT_STRING:
        try:
            text = v.tensor.string_val[0].decode("utf-8") if v.tensor.string_val else ""
        except UnicodeDecodeError:  # shown as unreadable, never as mangled words
            said.append(f"holds a text that is not UTF-8 (tag {v.tag!r}, step {e.step}); it is left out as unreadable")
            return
        if v.tag.endswith(schema.DATA_SUFFIX) and json_depth(text) > MAX_JSON_DEPTH:
            said.append(
                f"holds a JSON text (tag {v.tag!r}, step {e.step}) nested deeper than "
                f"{MAX_JSON_DEPTH} levels; that text is left out"
            )
            return
        point = Point(e.wall_time, e.step, text=text)
        kept = out.texts.setdefault(v.tag, [])
        if v.tag in all_texts or not kept:
            kept.append(point)
        elif (point.wall_time, point.step) >= (kept[-1].wall_time, kept[-1].step):  # a later one
            kept[-1] = point
        return
    value = _scalar_of(v.tensor)
    if value is not None:
        out.scalars.setdefault(v.tag, Series(v.tag)).add(e.wall_time, e.step, value)


def _scalar_of(proto) -> float | None:
    from tensorboard.util import tensor_util

    try:
        value = float(tensor_util.make_ndarray(proto).item())
    except Exception:  # not a single number: a histogram, an image, ...
        return None
    return value if math.isfinite(value) else None
