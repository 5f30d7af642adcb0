"""Which framework op each GPU kernel of an XLA program ran, from the HLO modules an ``.xplane.pb`` keeps.

A kernel's stats name the thunk that launched it (``hlo_op``) and its module
(``hlo_module``, ``program_id``); the module's HLO (``/host:metadata``) gives
each instruction's ``op_name`` metadata, whose name stack holds the Keras layer.

- A thunk of its own (a cuDNN convolution, a kernel outside a command buffer):
  ``hlo_op`` is the instruction.
- Inside a command buffer (a CUDA graph, XLA's default on GPUs) ``hlo_op`` is
  the buffer (``command_buffer_12``). XLA names the kernels it generates after
  their fusion (``loop_add_fusion.3`` runs as ``loop_add_fusion_3``), so those
  are found by their own name. But XLA compiles identical fusions once and runs
  that kernel, named after the first, for all of them: a kernel's name stands
  for any fusion whose fused computation is the same (its ops and shapes). Of
  those, each run goes to the next one in schedule order within its launch
  that has no kernel of its own name there.
- A copy or transpose that XLA added for a layout carries no op metadata: it
  is booked to the op of its first operand that has one.
- A library's kernels in a buffer (cuBLAS, cuDNN: ``sm90_xmma_gemm_...``) carry
  no instruction name. The buffer runs its commands in the module's schedule
  order, so such a kernel belongs to the last custom call scheduled before the
  next kernel of the same launch that is named; with no named kernel after it,
  to the first custom call after the last named one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.profiling.xplane import parse_hlo

_COMMAND_BUFFER = "command_buffer"


@dataclass
class HloModule:
    """One compiled program: op names by instruction (and kernel spelling), and its schedule."""

    name: str
    size: int = 0
    op_names: dict[str, str] = field(default_factory=dict)  # instruction or kernel name -> op_name
    position: dict[str, int] = field(default_factory=dict)  # instruction or kernel name -> place in the schedule
    calls: list[tuple[int, str]] = field(default_factory=list)  # the custom calls: (place, op_name), in order
    # kernel name -> the places of every fusion that may run that kernel (the same fused computation)
    same: dict[str, list[int]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # place -> kernel spelling of its instruction

    def call_before(self, place: int) -> str:
        """The op_name of the last custom call scheduled before ``place`` ("" if none)."""
        i = bisect.bisect_left(self.calls, (place, "")) - 1
        return self.calls[i][1] if i >= 0 else ""

    def call_after(self, place: int) -> str:
        """The op_name of the first custom call scheduled after ``place`` ("" if none)."""
        i = bisect.bisect_right(self.calls, (place, "\uffff"))
        return self.calls[i][1] if i < len(self.calls) else ""

    def op_at(self, place: int) -> str:
        return self.op_names.get(self.names.get(place, ""), "")


@dataclass
class Programs:
    """The HLO modules of a trace, by program id and by name (the largest of a name)."""

    by_id: dict[str, HloModule] = field(default_factory=dict)
    by_name: dict[str, HloModule] = field(default_factory=dict)
    any_name: dict[str, str] = field(default_factory=dict)  # instruction name -> op_name, over every module

    def module(self, program_id: str, name: str) -> HloModule | None:
        return self.by_id.get(program_id) or self.by_name.get(name)

    def op_name(self, program_id: str, module: str, name: str) -> str:
        found = self.module(program_id, module)
        if found is not None and name in found.op_names:
            return found.op_names[name]
        return self.any_name.get(name, "")


def programs(planes: Iterable[Any]) -> Programs:
    """The HLO modules kept in a trace's ``/host:metadata`` plane."""
    out = Programs()
    sizes: dict[str, int] = {}
    for plane in planes:
        if plane.name != "/host:metadata":
            continue
        stat_names = {e.key: e.value.name for e in plane.stat_metadata}
        for entry in plane.event_metadata:
            stats = {stat_names.get(s.metadata_id): s for s in entry.value.stats}
            proto = stats.get("Hlo Proto")
            if proto is None or not proto.bytes_value:
                continue
            module = _module(parse_hlo(proto.bytes_value).hlo_module)
            pid = stats.get("program_id")
            if pid is not None:
                out.by_id[str(pid.int64_value or pid.uint64_value)] = module
            if out.by_name.get(module.name) is None or out.by_name[module.name].size < module.size:
                out.by_name[module.name] = module
            for name, op in module.op_names.items():
                if sizes.get(name, -1) < module.size:
                    sizes[name], out.any_name[name] = module.size, op
    return out


def _module(proto: Any) -> HloModule:
    instructions = [i for c in proto.computations for i in c.instructions]
    module = HloModule(proto.name, size=len(instructions))
    by_id = {i.id: i for i in instructions}
    computations = {c.id: c for c in proto.computations}
    order = []
    for seq in proto.schedule.sequences if proto.HasField("schedule") else ():
        if seq.key == proto.entry_computation_id:
            order = [by_id[i] for i in seq.value.instruction_ids if i in by_id]
    if not order:  # no schedule kept: the entry computation's instructions as listed
        entry = [c for c in proto.computations if c.id == proto.entry_computation_id] or list(proto.computations[-1:])
        order = list(entry[0].instructions) if entry else []
    groups: dict[tuple, list[int]] = {}
    signature_of: dict[str, tuple] = {}
    for place, i in enumerate(order):
        spelling = _kernel_spelling(i.name)
        module.position[i.name] = module.position[spelling] = place
        module.names[place] = spelling
        if i.opcode == "custom-call":
            module.calls.append((place, i.metadata.op_name))
        elif i.opcode == "fusion":
            signature = _signature(i, computations)
            groups.setdefault(signature, []).append(place)
            signature_of[spelling] = signature
    for spelling, signature in signature_of.items():
        module.same[spelling] = groups[signature]
    for i in instructions:
        if i.metadata.op_name:
            module.op_names[i.name] = module.op_names[_kernel_spelling(i.name)] = i.metadata.op_name
    for i in order:  # a copy or transpose XLA added for a layout has no op of its own: its operand's
        if i.name not in module.op_names:
            inherited = next(
                (module.op_names[by_id[o].name] for o in i.operand_ids if by_id[o].name in module.op_names), ""
            )
            if inherited:
                module.op_names[i.name] = module.op_names[_kernel_spelling(i.name)] = inherited
    return module


def _free(module: HloModule, name: str, used: set[int], own: set[str]) -> list[int]:
    """The places a kernel of this name may run for: not yet run, and without a kernel of their own name."""
    return [p for p in module.same[name] if p not in used and (module.names[p] == name or module.names[p] not in own)]


def _only_place(module: HloModule, name: str) -> int | None:
    """The place of the one instruction a kernel of this name can be (None: none, or several)."""
    same = module.same.get(name)
    if same is not None:
        return same[0] if len(same) == 1 else None
    return module.position.get(name)


def _signature(fusion: Any, computations: dict[int, Any]) -> tuple:
    """What makes two fusions one kernel: their fused computations' ops and shapes, and their own shape."""
    ops = [
        (i.opcode, _shape(i.shape))
        for cid in fusion.called_computation_ids
        if cid in computations
        for i in computations[cid].instructions
    ]
    return (_shape(fusion.shape), tuple(ops))


def _shape(shape: Any) -> tuple:
    return (shape.element_type, tuple(shape.dimensions), tuple(_shape(t) for t in shape.tuple_shapes))


def _kernel_spelling(name: str) -> str:
    return name.replace(".", "_")


@dataclass
class Kernel:
    """One kernel event as read, and what it resolved to."""

    start: int
    launch: Any  # the launch it belongs to (correlation id)
    name: str
    hlo_op: str
    module: HloModule | None
    op_name: str = ""


def resolve(kernels: list[Kernel], progs: Programs) -> None:
    """Sets each kernel's ``op_name`` (see the module's docstring); kernels are of one stream, in any order."""
    kernels.sort(key=lambda k: k.start)
    runs: dict[int, list[Kernel]] = {}
    for k in kernels:
        if k.module is None:
            k.op_name = progs.any_name.get(k.hlo_op, "")
        else:
            runs.setdefault(id(k.module), []).append(k)
    for run in runs.values():
        _resolve_run(run)


def _resolve_run(kernels: list[Kernel]) -> None:
    """One program's kernels on one stream, in the order they ran (over its steps)."""
    module = kernels[0].module
    assert module is not None
    own = {k.name for k in kernels if k.name in module.position}  # fusions that ran a kernel of their own name
    # Anchors: kernels that stand for one instruction (a thunk of its own, or a kernel name only one fusion has).
    anchor: list[int | None] = []
    for k in kernels:
        buffered = k.hlo_op.startswith(_COMMAND_BUFFER)
        anchor.append(_only_place(module, k.name) if buffered else module.position.get(k.hlo_op))
        if not buffered:
            k.op_name = module.op_names.get(k.hlo_op, "")
    upper: list[int | None] = []
    nxt: int | None = None
    for place in reversed(anchor):
        upper.append(nxt)
        nxt = place if place is not None else nxt
    upper.reverse()
    step_back = max(len(module.names) // 2, 1)  # a jump back this far: the program's next step
    used: set[int] = set()
    places: list[int | None] = []
    cursor = -1
    for n, k in enumerate(kernels):
        place = anchor[n]
        if place is not None and place < cursor - step_back:
            used.clear()
            cursor = -1
        if place is None and k.hlo_op.startswith(_COMMAND_BUFFER) and k.name in module.same:
            free = _free(module, k.name, used, own)
            if not free:  # every fusion of this kernel ran: the program's next step
                used.clear()
                cursor = -1
                free = _free(module, k.name, used, own)
            nxt_anchor = upper[n]
            bound = nxt_anchor if nxt_anchor is not None and nxt_anchor > cursor else float("inf")
            place = next((p for p in free if cursor < p < bound), None)
            if place is None:
                place = next((p for p in free if p > cursor), free[0] if free else None)
        if place is not None:
            used.add(place)
            k.op_name = k.op_name or module.op_at(place)
            cursor = max(cursor, place)
        places.append(place)
    following: int | None = None
    for n in range(len(kernels) - 1, -1, -1):  # a library kernel in a buffer: the custom call before the next placed
        k, place = kernels[n], places[n]
        if place is not None:
            following = place
        elif k.hlo_op.startswith(_COMMAND_BUFFER):
            if following is not None:
                k.op_name = module.call_before(following)
            else:
                before = [p for p in places[:n] if p is not None]
                k.op_name = module.call_after(max(before)) if before else ""
