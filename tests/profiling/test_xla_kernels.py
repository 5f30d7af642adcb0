"""GPU kernels of an XLA program booked to their framework ops: command buffers, reused kernels, library kernels.

Two real traces of one model from a JAX GPU (the heavy-layer model of
``tests.helpers.models.one_heavy_layer_model(features=1024, heavy=16384)``, Adam,
batch 512, a 6-step ProfilerWindow), taken in one process each: one with XLA's
command buffers (its default), where every kernel's ``hlo_op`` is the buffer;
one with them off, where ``hlo_op`` names each kernel's own instruction. The
second is the reference for the first. Also a written XSpace for the cases a
small trace shows exactly.
"""

import html
import json
import os

import pytest

from keras_gpu_tools.logdir.writer import to_plain
from keras_gpu_tools.profiling import xla_kernels
from keras_gpu_tools.profiling.capture import copies_sentence
from keras_gpu_tools.profiling.layer_table import build_table
from keras_gpu_tools.profiling.layer_trace import _host_device_copy
from keras_gpu_tools.profiling.layers import OUTSIDE, LayerNode
from keras_gpu_tools.profiling.xplane import _classes, read_xspace
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.sections.layer_table import SECTION, layer_table_dict, layer_table_lines

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BUFFERED = os.path.join(DATA, "jax_gpu_command_buffers.xplane.pb")
UNBUFFERED = os.path.join(DATA, "jax_gpu_no_command_buffers.xplane.pb")
HEAVY = LayerNode(
    "net",
    "",
    1,
    (
        LayerNode("heavy", "heavy"),
        LayerNode("proj", "proj"),
        LayerNode("shared", "shared", 2),
        LayerNode("inner", "inner", 1, (LayerNode("small", "inner/small"),)),
        LayerNode("head", "head"),
    ),
)
US = 1_000_000  # ps


def test_a_command_buffer_trace_books_each_layer_as_the_trace_without_buffers_does():
    buffered = build_table(5, 6, [BUFFERED], HEAVY)
    reference = build_table(5, 6, [UNBUFFERED], HEAVY)
    for table in (buffered, reference):
        assert not table.error and table.source == "device kernels"
    ours = {r.path: r.share for r in buffered.rows}
    theirs = {r.path: r.share for r in reference.rows}
    assert set(ours) == set(theirs) == {OUTSIDE, "heavy", "proj", "shared", "inner/small", "head"}
    layers = [r for r in buffered.rows if r.path != OUTSIDE]
    assert layers[0].path == "heavy" and all(r.ms_per_step > 0 for r in layers)
    # the two runs' kernels differ by their own run-to-run spread only
    assert max(abs(ours[p] - theirs[p]) for p in ours) < 0.03, (ours, theirs)
    assert {r.path: r.calls for r in buffered.rows}["shared"] == 2


def test_copies_between_host_and_device_are_kept_out_of_the_rows_and_said_apart():
    """The input batches' copies run on the copy engines' streams: no layer's work, so no row's share."""
    space = read_xspace(BUFFERED)
    copies = every = 0
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        names = {e.key: e.value.name for e in plane.event_metadata}
        for line in plane.lines:
            if line.name.startswith("Stream"):
                every += sum(ev.duration_ps for ev in line.events)
                copies += sum(
                    ev.duration_ps for ev in line.events if names[ev.metadata_id] in ("MemcpyH2D", "MemcpyD2H")
                )
    table = build_table(5, 6, [BUFFERED], HEAVY)
    assert copies > 0 and table.copy_ms_per_step == pytest.approx(copies / 6 / 1e9)
    assert table.total_ms_per_step == pytest.approx((every - copies) / 6 / 1e9)
    assert sum(r.ms_per_step for r in table.rows) == pytest.approx(table.total_ms_per_step)
    said = copies_sentence(table.copy_ms_per_step)
    assert f"{table.copy_ms_per_step:.3f} ms per step, not in the rows" in said and said in table.text()
    # the report reads the same figure from the table's record (the JSON TensorBoard keeps)
    data = ReportData(layer_table=layer_table_dict(json.loads(json.dumps(to_plain(table)))))
    assert said in layer_table_lines(data.layer_table)[1]
    assert f"<p>{html.escape(said)}</p>" in "".join(SECTION.html(data, {}))


@pytest.mark.parametrize(
    ("name", "details", "copy"),
    [
        ("MemcpyH2D", "kind_src:pinned kind_dst:device size:4096 dest:0 async:1", True),
        ("MemcpyD2H", "kind_src:device kind_dst:pageable size:4 dest:0 async:1", True),
        ("MemcpyD2D", "kind_src:device kind_dst:device size:4096 dest:0 async:1", False),  # a layer's own copy
        ("MemcpyH2D", "", True),  # no details: by the event's name
        ("memcpy32_post", "", False),  # a kernel XLA generates
    ],
)
def test_a_host_device_copy_is_told_by_its_kinds_else_its_name(name, details, copy):
    assert _host_device_copy(name, details) is copy


def _module_hlo():
    """An HLO module: a cuBLAS call, two identical fusions (one kernel), a layout copy, in this schedule."""
    c = _classes()
    hlo = c["HloProto"]()
    m = hlo.hlo_module
    m.name, m.entry_computation_id = "jit_step", 1
    fused_a = m.computations.add(name="fused_a", id=2)
    fused_b = m.computations.add(name="fused_b", id=3)
    for comp in (fused_a, fused_b):  # the same ops and shapes: XLA compiles one kernel for both
        for n, op in enumerate(("parameter", "multiply", "reduce")):
            i = comp.instructions.add(name=f"{comp.name}.{n}", opcode=op, id=100 * comp.id + n)
            i.shape.element_type = 11
            i.shape.dimensions.extend([64, 8])
    entry = m.computations.add(name="main", id=1)
    rows = [
        (1, "param.1", "parameter", ""),
        (2, "cublas-gemm.1", "custom-call", "jit(step)/jvp(net)/heavy/dot_general"),
        (3, "reduce_fusion.1", "fusion", "jit(step)/transpose(jvp(net))/heavy/reduce_sum"),
        (4, "copy.1", "copy", ""),
        (5, "reduce_fusion.2", "fusion", "jit(step)/transpose(jvp(net))/inner/small/reduce_sum"),
        (6, "add_fusion.3", "fusion", "jit(step)/adam/add"),
    ]
    for iid, name, op, op_name in rows:
        i = entry.instructions.add(name=name, opcode=op, id=iid)
        i.metadata.op_name = op_name
        i.shape.element_type = 11
        i.shape.dimensions.extend([64, 8])
        if name.startswith("reduce_fusion"):
            i.called_computation_ids.append(2 if name.endswith(".1") else 3)
        if name == "copy.1":
            i.operand_ids.append(3)
    m.computations.add(name="fused_add", id=4)
    entry.instructions[-1].called_computation_ids.append(4)
    m.schedule.sequences.add(key=1).value.instruction_ids.extend([1, 2, 3, 4, 5, 6])
    return hlo.SerializeToString()


def _buffered_trace(path):
    c = _classes()
    space = c["XSpace"]()
    meta = space.planes.add(name="/host:metadata")
    meta.stat_metadata.add(key=1).value.name = "Hlo Proto"
    meta.stat_metadata.add(key=2).value.name = "program_id"
    m = meta.event_metadata.add(key=1).value
    m.name = "jit_step(7)"
    m.stats.add(metadata_id=1, bytes_value=_module_hlo())
    m.stats.add(metadata_id=2, int64_value=7)
    gpu = space.planes.add(name="/device:GPU:0")
    for key, name in enumerate(["hlo_op", "hlo_module", "program_id", "correlation_id", "tf_op"], start=1):
        gpu.stat_metadata.add(key=key).value.name = name
    kernels = ["sm90_xmma_gemm_f32f32", "reduce_fusion_1", "copy_1", "add_fusion_3"]
    for key, name in enumerate(kernels, start=1):
        gpu.event_metadata.add(key=key).value.name = name
    stream = gpu.lines.add(name="Stream #14(Compute)")
    t = 0
    # per step, one launch of the buffer: the library gemm, the shared kernel twice, the copy, the add
    for step in range(2):
        for key, dur in [(1, 500), (2, 100), (3, 10), (2, 40), (4, 20)]:
            ev = stream.events.add(metadata_id=key, offset_ps=t * US, duration_ps=dur * US)
            ev.stats.add(metadata_id=1, str_value="command_buffer_1")
            ev.stats.add(metadata_id=2, str_value="jit_step")
            ev.stats.add(metadata_id=3, int64_value=7)
            ev.stats.add(metadata_id=4, int64_value=10 + step)
            ev.stats.add(metadata_id=5, str_value="XlaModule:")  # XLA's launch, not a framework op
            t += dur
    with open(path, "wb") as f:
        f.write(space.SerializeToString())
    return str(path)


TREE = LayerNode(
    "net", "", 1, (LayerNode("heavy", "heavy"), LayerNode("inner", "inner", 1, (LayerNode("small", "inner/small"),)))
)


def test_library_reused_and_layout_kernels_in_a_buffer_go_to_the_instructions_they_ran(tmp_path):
    table = build_table(0, 2, [_buffered_trace(tmp_path / "host.xplane.pb")], TREE)
    assert not table.error and table.source == "device kernels"
    by = {r.path: r for r in table.rows}
    # the gemm (a library kernel: the custom call before the next named kernel), the first reduce and the
    # layout copy of its result
    assert by["heavy"].ms_per_step == pytest.approx(0.61)
    assert by["heavy"].backward_ms == pytest.approx(0.11)
    assert by["inner/small"].ms_per_step == pytest.approx(0.04)  # the second run of the shared kernel
    assert by[OUTSIDE].ms_per_step == pytest.approx(0.02)  # the optimizer's add


def test_a_kernel_name_stands_for_every_fusion_with_the_same_computation():
    c = _classes()
    hlo = c["HloProto"]()
    hlo.ParseFromString(_module_hlo())
    module = xla_kernels._module(hlo.hlo_module)
    assert module.same["reduce_fusion_1"] == module.same["reduce_fusion_2"] == [2, 4]
    assert module.same["add_fusion_3"] == [5]
    assert module.op_names["copy_1"] == module.op_names["reduce_fusion_1"]  # the layout copy: its operand's
    assert module.calls == [(1, "jit(step)/jvp(net)/heavy/dot_general")]


def test_a_trace_without_layer_names_says_it_cannot_book_time_to_layers_and_shows_no_rows(tmp_path):
    c = _classes()
    space = c["XSpace"]()
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.event_metadata.add(key=1).value.name = "some_custom_kernel"
    gpu.lines.add(name="Stream #14(Compute)").events.add(metadata_id=1, offset_ps=0, duration_ps=100 * US)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    table = build_table(0, 1, [str(path)], TREE)
    assert table.rows == []
    assert "cannot be booked to layers" in table.error and "name-scope metadata" in table.error
    assert "cannot be booked" in table.text()
