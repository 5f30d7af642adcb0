"""Why memory ran out: the figures of one out-of-memory error, read from its message and the allocator.

Framework-free. The backends (``keras_gpu_tools/backends/<framework>``) fill an
:class:`OOMExplanation` from what their framework can tell at the moment of
the error (allocator statistics, live buffers, the failing program's memory
analysis, a memory snapshot); :func:`parse_message` reads what the error's own
message says, for every backend's wording:

- TensorFlow: ``OOM when allocating tensor with shape[262144,65536] and type
  float on /job:localhost/.../device:GPU:0 by allocator GPU_0_bfc`` and the
  node, ``[[{{node dense/MatMul}}]]``;
- XLA (JAX, and TensorFlow with ``jit_compile``): ``RESOURCE_EXHAUSTED: Out of
  memory while trying to allocate 68719476736 bytes.``, with the buffer
  assignment's ``Peak buffers`` (size, operator, shape) where XLA adds them;
  XLA's CPU runtime: ``Out of memory allocating 17592186044416 bytes``;
- torch: ``CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total
  capacity of 139.81 GiB of which 12.10 GiB is free. ... Of the allocated
  memory 120.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved by
  PyTorch but unallocated.``; its CPU allocator: ``you tried to allocate N
  bytes``.

:meth:`OOMExplanation.lines` says it in a few readable lines:
``asked 32.0 GiB for dense/MatMul (262144 x 65536 float32); 12.1 GiB free of
139.8 GiB; the largest temporaries: ...``. :class:`Explainer` is what the
reducer calls with each error (through the backend's ``explain_oom``), and
:func:`headroom_lines` says the peak per device against its capacity.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime.units import format_bytes

_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 2**10, "mb": 2**20, "gb": 2**30}
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "double": 8,
    "float64": 8,
    "f64": 8,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "int32": 4,
    "s32": 4,
    "int64": 8,
    "s64": 8,
    "int8": 1,
    "s8": 1,
    "uint8": 1,
    "u8": 1,
    "bool": 1,
    "pred": 1,
}


def _size(number: str, unit: str) -> int:
    return int(round(float(number) * _UNITS.get(unit.lower(), 1)))


@dataclasses.dataclass
class OOMExplanation:
    """The figures of one out-of-memory error; None where unknown.

    ``largest``: ``(description, bytes)`` of the largest buffers or
    allocations (live arrays, peak buffers, snapshot blocks), largest first.
    ``program``: the failing compiled program's memory analysis (``arguments``,
    ``outputs``, ``temporaries``, ``aliased``: bytes). ``sources``: where the
    figures came from. ``files``: what was written for this event.
    """

    requested_bytes: int | None = None
    allocation: str | None = None  # the op or buffer that asked
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    free_bytes: int | None = None
    capacity_bytes: int | None = None  # the device's total, or the allocator's limit
    in_use_bytes: int | None = None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None  # held by the allocator's cache, not allocated (torch)
    largest: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    program: dict[str, int] = dataclasses.field(default_factory=dict)
    sources: list[str] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    message: str | None = None  # the error's own text (its start), for the record
    allocator: dict[str, Any] = dataclasses.field(default_factory=dict)  # the allocator's figures, as read

    def merge(self, figures: dict[str, Any]) -> None:
        """Fills the figures not known yet from ``figures`` (what the message said first)."""
        for f in dataclasses.fields(self):
            value = figures.get(f.name)
            if value is None:
                continue
            current = getattr(self, f.name)
            if isinstance(current, list):
                current.extend(v for v in value if v not in current)
            elif isinstance(current, dict):
                for k, v in value.items():
                    current.setdefault(k, v)
            elif current is None:
                setattr(self, f.name, value)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["largest"] = [[name, size] for name, size in self.largest]
        d["lines"] = self.lines()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OOMExplanation:
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        if kw.get("largest"):
            kw["largest"] = [(str(a), int(b)) for a, b in kw["largest"]]
        if kw.get("shape") is not None:
            kw["shape"] = tuple(kw["shape"])
        return cls(**kw)

    def lines(self) -> list[str]:
        """A few readable lines: what was asked for, what was free, the largest buffers, the program."""
        out = []
        first = []
        if self.requested_bytes is not None or self.allocation:
            asked = f"asked {format_bytes(self.requested_bytes)}" if self.requested_bytes is not None else "asked"
            what = self.allocation or ""
            if self.shape:
                dims = " x ".join(str(d) for d in self.shape)
                what = f"{what} ({dims} {self.dtype})" if what else f"a {dims} {self.dtype} tensor"
            first.append(f"{asked} for {what}" if what else asked)
        if self.free_bytes is not None and self.capacity_bytes is not None:
            first.append(f"{format_bytes(self.free_bytes)} free of {format_bytes(self.capacity_bytes)}")
        elif self.capacity_bytes is not None:
            first.append(f"limit {format_bytes(self.capacity_bytes)}")
        elif self.free_bytes is not None:
            first.append(f"{format_bytes(self.free_bytes)} free")
        if self.device:
            first.append(f"on {self.device}")
        if first:
            out.append("; ".join(first))
        alloc = []
        if self.in_use_bytes is not None:
            alloc.append(f"in use {format_bytes(self.in_use_bytes)}")
        if self.peak_bytes is not None:
            alloc.append(f"peak {format_bytes(self.peak_bytes)}")
        if self.reserved_bytes is not None:
            alloc.append(f"reserved but unallocated {format_bytes(self.reserved_bytes)}")
        if alloc:
            out.append("allocator: " + ", ".join(alloc))
        if self.program:
            names = ("arguments", "outputs", "temporaries", "aliased")
            parts = [f"{k} {format_bytes(self.program[k])}" for k in names if self.program.get(k) is not None]
            if parts:
                out.append("the failing program needs " + ", ".join(parts))
        if self.largest:
            shown = ", ".join(f"{name} {format_bytes(size)}" for name, size in self.largest[:5])
            out.append(f"the largest buffers: {shown}")
        out.extend(self.notes)
        if self.files:
            out.append("written: " + ", ".join(self.files))
        return out


def tensor_bytes(shape: tuple[int, ...], dtype: str | None) -> int | None:
    size = _DTYPE_BYTES.get((dtype or "").lower())
    if size is None:
        return None
    return int(math.prod(shape)) * size


_TF_TENSOR = re.compile(r"OOM when allocating tensor with shape\s*\[([\d,\s]*)\]\s*and type (\w+)(?: on ([^\s]+))?")
_TF_NODE = re.compile(r"\[\[\{\{node ([^}]+)\}\}\]\]")
_XLA_GPU = re.compile(r"Out of memory while trying to allocate (\d+) bytes")
_XLA_CPU = re.compile(r"Out of memory allocating (\d+) bytes")
_XLA_SIZE = re.compile(r"trying to allocate ([\d.]+)\s*([KMGT]i?B|B)\b")
_TORCH_TRIED = re.compile(r"Tried to allocate ([\d.]+) ([KMGT]i?B|B)")
_TORCH_CAPACITY = re.compile(r"total capacity of ([\d.]+) ([KMGT]i?B|B) of which ([\d.]+) ([KMGT]i?B|B) is free")
_TORCH_GPU = re.compile(r"\b(GPU \d+) has a total capacity")
_TORCH_ALLOCATED = re.compile(r"([\d.]+) ([KMGT]i?B|B) is allocated by PyTorch")
_TORCH_RESERVED = re.compile(r"([\d.]+) ([KMGT]i?B|B) is reserved by PyTorch but unallocated")
_TORCH_CPU = re.compile(r"you tried to allocate (\d+) bytes")
_PEAK_BUFFER = re.compile(
    r"Buffer \d+:\s*Size:\s*([\d.]+)\s*([KMGT]i?B|B)(?:.*?Operator:\s*op_name=\"([^\"]+)\")?(?:.*?Shape:\s*(\w+)\[([\d,]*)\])?",
    re.S,
)
_XLA_STATS = re.compile(
    r"(parameter|maybe_live_out|preallocated temp|total) allocation:\s*([\d.]+)\s*([KMGT]i?B|B)", re.I
)


def parse_message(text: str) -> dict[str, Any]:
    """The figures an out-of-memory error's message gives, as :class:`OOMExplanation` field values."""
    out: dict[str, Any] = {}
    m = _TF_TENSOR.search(text)
    if m:
        shape = tuple(int(d) for d in m.group(1).replace(" ", "").split(",") if d)
        out["shape"], out["dtype"] = shape, m.group(2)
        out["requested_bytes"] = tensor_bytes(shape, m.group(2))
        if m.group(3):
            out["device"] = m.group(3).rsplit("device:", 1)[-1]
        node = _TF_NODE.search(text)
        if node:
            out["allocation"] = node.group(1)
        out["sources"] = ["the error message (TensorFlow)"]
        return out
    m = _TORCH_TRIED.search(text)
    if m:
        out["requested_bytes"] = _size(m.group(1), m.group(2))
        cap = _TORCH_CAPACITY.search(text)
        if cap:
            out["capacity_bytes"] = _size(cap.group(1), cap.group(2))
            out["free_bytes"] = _size(cap.group(3), cap.group(4))
        gpu = _TORCH_GPU.search(text)
        if gpu:
            out["device"] = gpu.group(1)
        alloc = _TORCH_ALLOCATED.search(text)
        if alloc:
            out["in_use_bytes"] = _size(alloc.group(1), alloc.group(2))
        reserved = _TORCH_RESERVED.search(text)
        if reserved:
            out["reserved_bytes"] = _size(reserved.group(1), reserved.group(2))
        out["sources"] = ["the error message (torch CUDA allocator)"]
        return out
    m = _TORCH_CPU.search(text)
    if m:
        out["requested_bytes"] = int(m.group(1))
        out["device"] = "CPU"
        out["sources"] = ["the error message (torch CPU allocator)"]
        return out
    m = _XLA_GPU.search(text) or _XLA_CPU.search(text)
    if m:
        out["requested_bytes"] = int(m.group(1))
    else:
        m = _XLA_SIZE.search(text)
        if m:
            out["requested_bytes"] = _size(m.group(1), m.group(2))
    if m:
        out["sources"] = ["the error message (XLA)"]
        largest = []
        for b in _PEAK_BUFFER.finditer(text):
            size = _size(b.group(1), b.group(2))
            name = b.group(3) or "buffer"
            if b.group(4) is not None:
                name += f" {b.group(4)}[{b.group(5)}]"
            largest.append((name, size))
        if largest:
            out["largest"] = sorted(largest, key=lambda x: -x[1])
            first = largest[0][0].split(" ")[0]
            out.setdefault("allocation", first)
        stats = {k.lower(): _size(v, u) for k, v, u in _XLA_STATS.findall(text)}
        program = {}
        if "parameter" in stats:
            program["arguments"] = stats["parameter"]
        if "maybe_live_out" in stats:
            program["outputs"] = stats["maybe_live_out"]
        if "preallocated temp" in stats:
            program["temporaries"] = stats["preallocated temp"]
        if program:
            out["program"] = program
    return out


def explanation_of(error: BaseException | None, **figures: Any) -> OOMExplanation:
    """An explanation from the error's message (of the error and what it was raised from), then ``figures``."""
    e = OOMExplanation()
    seen = set()
    cur = error
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        e.merge(parse_message(str(cur)))
        if e.message is None:
            e.message = str(cur)[:4000]
        cur = getattr(cur, "oom_original", None) or cur.__cause__
    e.merge(figures)
    e.allocator = {k: v for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return e


def fragmentation_note(requested: int | None, free: int | None, reserved: int | None, expandable: bool) -> str | None:
    """What to do when torch's caching allocator held enough memory for the request, but not in one piece.

    Reserved but unallocated memory that is fragmented makes a split that fits
    run out of memory (so the batch runs as more micro-batches than it needs);
    ``expandable_segments:True`` lets the allocator grow a segment instead.
    """
    if expandable or requested is None or free is None or not reserved or free >= requested:
        return None
    if free + reserved < requested:
        return None
    return (
        f"fragmented: {format_bytes(reserved)} reserved but unallocated and {format_bytes(free)} free, together more "
        f"than the {format_bytes(requested)} asked, but not in one piece; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch starts CUDA"
    )


class Explainer:
    """Explains each out-of-memory error (or predicted failure) while its memory is still held.

    ``explain_oom(error, context)`` is the backend's (``Backend.explain_oom``):
    it returns the figures of an :class:`OOMExplanation` and the files it made
    (name suffix -> bytes), which are kept until the event is recorded
    (:meth:`take_artifacts`). ``files``: whether the run writes files (it has a
    log dir), so that the backend makes them.
    """

    def __init__(
        self,
        explain_oom: Callable[[BaseException | None, dict[str, Any]], tuple[dict[str, Any], dict[str, bytes]]],
    ):
        self.explain_oom = explain_oom
        self.files = False
        self.artifacts: dict[str, bytes] = {}

    def __call__(self, error: BaseException | None, context: dict[str, Any]) -> dict[str, Any]:
        figures, artifacts = self.explain_oom(error, dict(context, files=self.files))
        explanation = explanation_of(error, **figures)
        self.artifacts = artifacts
        return explanation.as_dict()

    def take_artifacts(self) -> dict[str, bytes]:
        """The files of the explanation being recorded, handed over once."""
        artifacts, self.artifacts = self.artifacts, {}
        return artifacts


def headroom_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    """Per device: the allocator's peak against the capacity, and the batch that would fit."""
    out = []
    for row in rows or []:
        peak, capacity = row.get("peak_bytes"), row.get("capacity_bytes")
        text = f"GPU {row.get('device')}: peak {format_bytes(peak)}"
        if capacity:
            text += f" of {format_bytes(capacity)} ({100.0 * float(peak or 0) / float(capacity):.0f}%)"
        if row.get("fits_batch") is not None:
            text += f"; a batch of {row['fits_batch']} would fit ({row.get('fits_from')})"
        out.append(text)
    return out


__all__ = ["Explainer", "OOMExplanation", "explanation_of", "headroom_lines", "parse_message", "tensor_bytes"]
