"""Reading ``.xplane.pb`` traces without TensorFlow: the few XSpace and HLO fields the layer table needs.

The message classes are built at first use from a hand-written descriptor of
the fields read (wire-compatible subsets of ``tsl/profiler/protobuf/xplane.proto``
and ``xla/service/hlo.proto``); the protobuf runtime skips every other field in
C, so a trace of tens of MiB parses in well under a second.
"""

from __future__ import annotations

import functools
from typing import Any

_I64, _U64, _DBL, _STR, _BYTES, _MSG, _I32 = 3, 4, 1, 9, 12, 11, 5
_OPT, _REP = 1, 3

_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    # name: [(field, number, type, label, message type)]
    "XSpace": [("planes", 1, _MSG, _REP, "XPlane")],
    "XPlane": [
        ("id", 1, _I64, _OPT, ""),
        ("name", 2, _STR, _OPT, ""),
        ("lines", 3, _MSG, _REP, "XLine"),
        ("event_metadata", 4, _MSG, _REP, "EventMetadataEntry"),
        ("stat_metadata", 5, _MSG, _REP, "StatMetadataEntry"),
    ],
    "EventMetadataEntry": [("key", 1, _I64, _OPT, ""), ("value", 2, _MSG, _OPT, "XEventMetadata")],
    "StatMetadataEntry": [("key", 1, _I64, _OPT, ""), ("value", 2, _MSG, _OPT, "XStatMetadata")],
    "XLine": [
        ("id", 1, _I64, _OPT, ""),
        ("name", 2, _STR, _OPT, ""),
        ("timestamp_ns", 3, _I64, _OPT, ""),
        ("events", 4, _MSG, _REP, "XEvent"),
    ],
    "XEvent": [
        ("metadata_id", 1, _I64, _OPT, ""),
        ("offset_ps", 2, _I64, _OPT, ""),
        ("duration_ps", 3, _I64, _OPT, ""),
        ("stats", 4, _MSG, _REP, "XStat"),
    ],
    "XStat": [
        ("metadata_id", 1, _I64, _OPT, ""),
        ("double_value", 2, _DBL, _OPT, ""),
        ("uint64_value", 3, _U64, _OPT, ""),
        ("int64_value", 4, _I64, _OPT, ""),
        ("str_value", 5, _STR, _OPT, ""),
        ("bytes_value", 6, _BYTES, _OPT, ""),
        ("ref_value", 7, _U64, _OPT, ""),
    ],
    "XEventMetadata": [
        ("id", 1, _I64, _OPT, ""),
        ("name", 2, _STR, _OPT, ""),
        ("display_name", 4, _STR, _OPT, ""),
        ("stats", 5, _MSG, _REP, "XStat"),
    ],
    "XStatMetadata": [("id", 1, _I64, _OPT, ""), ("name", 2, _STR, _OPT, "")],
    "HloProto": [("hlo_module", 1, _MSG, _OPT, "HloModuleProto")],
    "HloModuleProto": [
        ("name", 1, _STR, _OPT, ""),
        ("computations", 3, _MSG, _REP, "HloComputationProto"),
        ("entry_computation_id", 6, _I64, _OPT, ""),
        ("schedule", 7, _MSG, _OPT, "HloScheduleProto"),
    ],
    "HloComputationProto": [
        ("name", 1, _STR, _OPT, ""),
        ("instructions", 2, _MSG, _REP, "HloInstructionProto"),
        ("id", 5, _I64, _OPT, ""),
    ],
    "HloInstructionProto": [
        ("name", 1, _STR, _OPT, ""),
        ("opcode", 2, _STR, _OPT, ""),
        ("shape", 3, _MSG, _OPT, "ShapeProto"),
        ("metadata", 7, _MSG, _OPT, "OpMetadata"),
        ("id", 35, _I64, _OPT, ""),
        ("operand_ids", 36, _I64, _REP, ""),
        ("called_computation_ids", 38, _I64, _REP, ""),
    ],
    "ShapeProto": [
        ("element_type", 2, _I32, _OPT, ""),
        ("dimensions", 3, _I64, _REP, ""),
        ("tuple_shapes", 4, _MSG, _REP, "ShapeProto"),
    ],
    "HloScheduleProto": [("sequences", 1, _MSG, _REP, "SequenceEntry")],
    "SequenceEntry": [("key", 1, _I64, _OPT, ""), ("value", 2, _MSG, _OPT, "InstructionSequence")],
    "InstructionSequence": [("instruction_ids", 1, _I64, _REP, "")],
    "OpMetadata": [("op_type", 1, _STR, _OPT, ""), ("op_name", 2, _STR, _OPT, "")],
}
_PACKAGE = "keras_gpu_tools_xplane"


@functools.lru_cache(maxsize=1)
def _classes() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name=f"{_PACKAGE}.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = file.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            f = msg.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in _MESSAGES
    }


def read_xspace(path: str) -> Any:
    """The XSpace of an ``.xplane.pb`` file (only the fields above)."""
    space = _classes()["XSpace"]()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def parse_hlo(data: bytes) -> Any:
    """An ``HloProto`` (its module's instructions' names and op metadata)."""
    hlo = _classes()["HloProto"]()
    hlo.ParseFromString(data)
    return hlo


def stat_value(stat: Any, names: dict[int, str]) -> Any:
    """One XStat's value (a ``ref_value`` is the name of the stat metadata it refers to)."""
    if stat.ref_value:
        return names.get(stat.ref_value)
    for attr in ("str_value", "int64_value", "uint64_value", "double_value", "bytes_value"):
        v = getattr(stat, attr)
        if v:
            return v
    return None
