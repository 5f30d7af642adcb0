"""A trace's op times for the layer table: XLA/TensorFlow ops from ``.xplane.pb``, torch ops from its Chrome trace.

Where the trace has a device plane with kernels (a GPU), the kernels' times
count; its copies between host and device are marked apart (``OpTime.copy``):
they move batches and results on the copy engines, no layer's work. On a CPU
the ops' own times on the host threads count (an op's time without the
counted ops nested in it, so nothing counts twice).

- ``.xplane.pb`` (TensorFlow, JAX): a GPU kernel is named after its framework
  op by its ``tf_op`` stat, else by the XLA program's HLO (``xla_kernels``:
  command buffers and library kernels included), else by the annotation of its
  launch (``level 0``);
  a CPU XLA thunk by its HLO instruction's name; a TensorFlow op run without
  XLA by its event ``<op name>:<op type>``.
- ``.pt.trace.json`` (torch): an op belongs to the innermost
  ``keras_layer::<path>`` range around it (forward); a backward op to the
  layer of the forward op with the same autograd sequence number; a GPU
  kernel to the op that launched it (its ``correlation``). A layer's peak
  memory is the allocator's (``profile_memory``): the highest its thread's
  allocations less frees rose inside one of the layer's ranges, on the GPU
  where there is one (:func:`range_peaks`).
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.profiling import xla_kernels
from keras_gpu_tools.profiling.layers import OpTime
from keras_gpu_tools.profiling.xplane import read_xspace, stat_value

#: The name of the torch range around one call of a layer: ``keras_layer::<path>``.
TORCH_SCOPE = "keras_layer::"

_TF_OP = re.compile(r"^([^:\s]+):([A-Za-z_]\w*)$")
_TF_NOT_COMPUTE = ("PartitionedCall", "StatefulPartitionedCall", "IteratorGetNext", "XlaLaunch", "XlaLaunchV2")
_DERIVED_LINES = {"Steps", "XLA Modules", "XLA Ops", "XLA TraceMe", "Framework Name Scope", "Framework Ops"}
_DEVICE_PLANE = re.compile(r"^/device:(GPU|TPU)")
TORCH_HOST_COPIES = ("Memcpy HtoD", "Memcpy DtoH")  # torch's names of copies between host and device


@dataclass
class TraceOps:
    """What a trace gives the layer table."""

    ops: list[OpTime] = field(default_factory=list)
    source: str = ""  # "device kernels" or "host ops"
    calls: dict[str, int] | None = None  # counted calls per layer path, per step (torch)
    steps: int | None = None  # steps marked in the trace (torch)
    peaks: dict[str, int] | None = None  # the allocator's peak bytes inside a layer's range (torch; None: not traced)


# ---------------------------------------------------------------------------
# .xplane.pb
# ---------------------------------------------------------------------------
def _self_times(events: list[tuple[int, int, OpTime]]) -> None:
    """Takes the counted events nested in a counted event (same line) off its time."""
    events.sort(key=lambda e: (e[0], -e[1]))
    stack: list[tuple[int, OpTime]] = []
    for start, dur, op in events:
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            stack[-1][1].ps -= dur
        stack.append((start + dur, op))
    for _, _, op in events:
        op.ps = max(op.ps, 0)


def _is_backward(op_name: str) -> bool:
    return "gradient_tape/" in op_name or "transpose(" in op_name


def xplane_ops(paths: Iterable[str]) -> TraceOps:
    """The op times of ``.xplane.pb`` traces (every host's: a job's processes add up)."""
    out = TraceOps()
    device: list[OpTime] = []
    host: list[OpTime] = []
    for path in paths:
        planes = list(read_xspace(path).planes)
        progs = xla_kernels.programs(planes)
        for plane in planes:
            on_device = bool(_DEVICE_PLANE.match(plane.name))
            if not on_device and plane.name != "/host:CPU":
                continue
            names = {e.key: e.value.name for e in plane.event_metadata}
            stat_names = {e.key: e.value.name for e in plane.stat_metadata}
            lines = [ln for ln in plane.lines if ln.name not in _DERIVED_LINES]
            if on_device and any(ln.name.startswith("Stream") for ln in lines):
                lines = [ln for ln in lines if ln.name.startswith("Stream")]
            for line in lines:
                if on_device:
                    device.extend(_device_ops(line, names, stat_names, progs))
                    continue
                if line.name.startswith("tf_data"):
                    continue  # the input pipeline's threads
                counted: list[tuple[int, int, OpTime]] = []
                for ev in line.events:
                    op = _host_op(names.get(ev.metadata_id, ""), ev.duration_ps, progs.any_name)
                    if op is not None:
                        counted.append((ev.offset_ps, ev.duration_ps, op))
                _self_times(counted)
                host.extend(op for _, _, op in counted)
    out.ops, out.source = (device, "device kernels") if device else (host, "host ops")
    return out


def _device_ops(line, names, stat_names, progs: xla_kernels.Programs) -> list[OpTime]:
    """One stream's kernels as ops: by TensorFlow's op where it names one, else by the XLA program's HLO."""
    kernels: list[tuple[xla_kernels.Kernel, Any, str]] = []
    copies: list[OpTime] = []
    for ev in line.events:
        stats = {stat_names.get(s.metadata_id, ""): s for s in ev.stats}

        def stat(key: str, stats=stats) -> str:
            return str(stat_value(stats[key], stat_names) or "") if key in stats else ""

        if _host_device_copy(names.get(ev.metadata_id, ""), stat("memcpy_details")):
            copies.append(OpTime("", ev.duration_ps, copy=True))
            continue
        tf_op = stat("tf_op")
        if tf_op.startswith("XlaModule:"):  # XLA's own launch, not a framework op
            tf_op = ""
        module = progs.module(stat("program_id"), stat("hlo_module")) if not tf_op else None
        k = xla_kernels.Kernel(
            ev.offset_ps, stat("correlation_id"), names.get(ev.metadata_id, ""), stat("hlo_op"), module, tf_op
        )
        kernels.append((k, ev, stat("level 0")))
    xla_kernels.resolve([k for k, _, _ in kernels if not k.op_name], progs)
    out = []
    for k, ev, launch in kernels:
        op_name = k.op_name
        if not op_name and launch:  # the launch's annotation: "outer::op_name:OpType#key=value#"
            op_name = launch.split("::")[-1].split("#")[0]
        flops = next((stat_value(s, stat_names) for s in ev.stats if stat_names.get(s.metadata_id) == "flops"), None)
        out.append(OpTime(op_name, ev.duration_ps, _is_backward(op_name), float(flops) if flops else None))
    return out + copies


def _host_device_copy(name: str, details: str) -> bool:
    """A device event that copies between host and device memory (``memcpy_details``: ``kind_src:pinned kind_dst:device ...``)."""
    kinds = dict(part.split(":", 1) for part in details.split() if part.startswith(("kind_src:", "kind_dst:")))
    if kinds:
        src, dst = kinds.get("kind_src", ""), kinds.get("kind_dst", "")
        return src != dst and "device" in (src, dst)
    return name in ("MemcpyH2D", "MemcpyD2H")


def _host_op(name: str, ps: int, hlo: dict[str, str]) -> OpTime | None:
    if name in hlo:  # an XLA thunk on the CPU
        return OpTime(hlo[name], ps, _is_backward(hlo[name]))
    m = _TF_OP.match(name)
    if m is None:
        return None
    op_name, op_type = m.groups()
    if op_type.startswith("__") or op_type.startswith("_Xla") or op_type in _TF_NOT_COMPUTE:
        return None  # a function call or an XLA launch (its ops counted on their own), or the input
    return OpTime(op_name, ps, _is_backward(op_name))


# ---------------------------------------------------------------------------
# torch's Chrome trace
# ---------------------------------------------------------------------------
def torch_ops(paths: Iterable[str]) -> TraceOps:
    """The op times of torch Chrome traces, resolved to layer paths (see the module's docstring)."""
    out = TraceOps(calls={}, steps=0)
    kernels: list[dict] = []
    ops: list[OpTime] = []
    calls: dict[str, int] = {}
    peaks: dict[str, int] | None = None
    steps = 0
    for path in paths:
        with open(path) as f:
            every = json.load(f).get("traceEvents", [])
        events = [e for e in every if e.get("ph") == "X"]
        found = range_peaks(every)
        if found is not None:
            peaks = peaks or {}
            for p, n in found.items():
                peaks[p] = max(peaks.get(p, 0), n)
        marks = sorted(
            (float(e.get("ts", 0)), float(e.get("ts", 0)) + float(e.get("dur", 0)), n)
            for n, e in enumerate(e for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
        )
        steps += len(marks)
        by_tid: dict = {}
        for e in events:
            cat = e.get("cat")
            if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                kernels.append(e)
            elif cat in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"):
                by_tid.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        seq_layer: dict = {}
        launches: dict = {}  # correlation -> the top-level op (OpTime) that launched it
        top: list[tuple[OpTime, dict]] = []
        for evs in by_tid.values():
            _walk_thread(evs, seq_layer, launches, top, calls)
        starts = [m[0] for m in marks]
        for op, e in top:  # a backward op: the layer of its forward op
            if op.path is None and op.backward:
                op.path = seq_layer.get(e["_seq"])
            i = bisect.bisect_right(starts, float(e.get("ts", 0))) - 1
            op.step = marks[i][2] if i >= 0 and float(e.get("ts", 0)) <= marks[i][1] else None
        ops.extend(op for op, _ in top)
        if kernels:
            device = []
            for k in kernels:
                launcher = launches.get((k.get("args") or {}).get("correlation"))
                path_ = launcher.path if launcher is not None else None
                bwd = launcher.backward if launcher is not None else False
                step = launcher.step if launcher is not None else None
                ps = int(float(k.get("dur", 0)) * 1e6)
                copy = k.get("cat") == "gpu_memcpy" and str(k.get("name", "")).startswith(TORCH_HOST_COPIES)
                device.append(OpTime("", ps, bwd, path=path_, resolved=True, step=step, copy=copy))
            ops, kernels = device, []
            out.source = "device kernels"
    out.source = out.source or "host ops"
    out.ops, out.steps, out.peaks = ops, steps, peaks
    out.calls = {p: max(1, round(n / max(steps, 1))) for p, n in calls.items()}
    return out


def range_peaks(events: list[dict]) -> dict[str, int] | None:
    """The allocator's peak inside each layer range: bytes its thread allocated less freed, at their highest.

    From torch's ``[memory]`` events (``profile_memory=True``): within each
    ``keras_layer::<path>`` range, the running sum of the ``Bytes`` of the
    allocations and frees on the range's own thread (other threads' allocations,
    the input pipeline's, are not the layer's), its highest point above the
    range's start; a layer called several times keeps its largest. The GPU's
    events where there are any, else the CPU's. None: the trace has no memory
    events (memory was not profiled).
    """
    memory = [e for e in events if e.get("name") == "[memory]" and isinstance(e.get("args"), dict)]
    if not memory:
        return None
    gpu = any(e["args"].get("Device Type") == 1 for e in memory)
    kind = 1 if gpu else 0
    by_thread: dict = {}
    for e in memory:
        if e["args"].get("Device Type") == kind:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(
                (float(e.get("ts", 0)), int(e["args"].get("Bytes", 0)))
            )
    for evs in by_thread.values():
        evs.sort()
    peaks: dict[str, int] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") != "X" or e.get("cat") != "user_annotation" or not name.startswith(TORCH_SCOPE):
            continue
        start = float(e.get("ts", 0))
        end = start + float(e.get("dur", 0))
        evs = by_thread.get((e.get("pid"), e.get("tid")), [])
        level = peak = 0
        for _, n in evs[bisect.bisect_left(evs, (start, -(1 << 62))) : bisect.bisect_right(evs, (end, 1 << 62))]:
            level += n
            peak = max(peak, level)
        path = name[len(TORCH_SCOPE) :]
        peaks[path] = max(peaks.get(path, 0), peak)
    return peaks


def _walk_thread(evs: list[dict], seq_layer: dict, launches: dict, top: list, calls: dict) -> None:
    """One thread's events: layer ranges, top-level ops (with their layer), launches and sequence numbers."""
    evs.sort(key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
    # Each open range: (end, innermost layer path, its top-level op, inside the data loader), as of inside it.
    stack: list[tuple[float, Any, Any, bool]] = []
    for e in evs:
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        while stack and stack[-1][0] <= ts:
            stack.pop()
        _, layer, outer, skipped = stack[-1] if stack else (0.0, None, None, False)
        name, cat = str(e.get("name", "")), e.get("cat")
        args = e.get("args") or {}
        if cat == "user_annotation":
            if name.startswith(TORCH_SCOPE):
                path = name[len(TORCH_SCOPE) :]
                calls[path] = calls.get(path, 0) + 1
                stack.append((ts + dur, path, outer, skipped))
            elif name.startswith("enumerate(DataLoader)"):
                stack.append((ts + dur, layer, outer, True))
            continue
        if cat in ("cuda_runtime", "cuda_driver"):
            if outer is not None and "correlation" in args:
                launches[args["correlation"]] = outer
            continue
        seq = args.get("Sequence number")
        if seq is not None and layer is not None:
            seq_layer.setdefault(seq, layer)
        flops = args.get("flops")
        if outer is None and not skipped:
            backward = name.startswith("autograd::engine::evaluate_function") or name.endswith("Backward0")
            op = OpTime(name, int(dur * 1e6), backward, float(flops) if flops else None, path=layer, resolved=True)
            e["_seq"] = seq
            top.append((op, e))
            stack.append((ts + dur, layer, op, skipped))
        else:
            if outer is not None and flops:
                outer.flops = (outer.flops or 0.0) + float(flops)
            stack.append((ts + dur, layer, outer, skipped))  # nested: its time is its top-level op's
