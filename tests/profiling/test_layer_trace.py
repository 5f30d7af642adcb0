"""Reading op times from traces of a GPU, which this machine has not: XSpace and Chrome traces written as the
profilers write them (the fields the reader uses), read back by the package's readers."""

import json

import pytest

from keras_gpu_tools.profiling.layer_table import build_table
from keras_gpu_tools.profiling.layer_trace import range_peaks, torch_ops, xplane_ops
from keras_gpu_tools.profiling.layers import OUTSIDE, LayerNode
from keras_gpu_tools.profiling.xplane import _classes

TREE = LayerNode(
    "net", "", 1, (LayerNode("heavy", "heavy"), LayerNode("inner", "inner", 1, (LayerNode("small", "inner/small"),)))
)
US = 1_000_000  # ps


def _hlo(module, ops):
    c = _classes()
    hlo = c["HloProto"]()
    hlo.hlo_module.name = module
    comp = hlo.hlo_module.computations.add(name="main")
    for name, op_name in ops.items():
        comp.instructions.add(name=name).metadata.op_name = op_name
    return hlo.SerializeToString()


def _xspace(path):
    c = _classes()
    space = c["XSpace"]()
    meta = space.planes.add(name="/host:metadata")
    meta.stat_metadata.add(key=1).value.name = "Hlo Proto"
    m = meta.event_metadata.add(key=1).value
    m.name = "jit_step(1)"
    ops = {
        "dot.1": "jit(step)/jit(main)/net/heavy/dot_general",
        "fusion.2": "jit(step)/transpose(jvp(net))/heavy/dot_general",
        "add.3": "jit(step)/adam/add",
    }
    m.stats.add(metadata_id=1, bytes_value=_hlo("jit_step", ops))
    gpu = space.planes.add(name="/device:GPU:0")
    for key, name in enumerate(["hlo_op", "hlo_module", "tf_op"], start=1):
        gpu.stat_metadata.add(key=key).value.name = name
    for key, name in enumerate(["dot.1", "fusion.2", "add.3", "MatMul_kernel"], start=1):
        gpu.event_metadata.add(key=key).value.name = name
    stream = gpu.lines.add(name="Stream #14(Compute)")
    derived = gpu.lines.add(name="XLA Ops")  # xprof's own view of the same kernels: not counted again
    for line in (stream, derived):
        t = 0
        for key, hlo_op, dur in [(1, "dot.1", 600), (2, "fusion.2", 300), (3, "add.3", 50), (1, "dot.1", 600)]:
            ev = line.events.add(metadata_id=key, offset_ps=t * US, duration_ps=dur * US)
            ev.stats.add(metadata_id=1, str_value=hlo_op)
            ev.stats.add(metadata_id=2, str_value="jit_step")
            t += dur
    ev = stream.events.add(metadata_id=4, offset_ps=9000 * US, duration_ps=50 * US)  # TensorFlow names its op
    ev.stats.add(metadata_id=3, str_value="net_1/inner_1/small_1/MatMul:MatMul")
    with open(path, "wb") as f:
        f.write(space.SerializeToString())
    return str(path)


def test_xplane_kernels_go_to_their_layers_by_hlo_metadata_and_tf_op(tmp_path):
    path = _xspace(tmp_path / "host.xplane.pb")
    found = xplane_ops([path])
    assert found.source == "device kernels" and len(found.ops) == 5
    table = build_table(0, 2, [path], TREE)
    by = {r.path: r for r in table.rows}
    assert [r.path for r in table.rows] == ["heavy", OUTSIDE, "inner/small"]
    assert by["heavy"].ms_per_step == pytest.approx(0.75)  # (600 + 300 + 600) us over 2 steps
    assert by["heavy"].backward_ms == pytest.approx(0.15)
    assert by["heavy"].share == pytest.approx(1500 / 1600)
    assert by["inner/small"].ms_per_step == pytest.approx(0.025)


def _torch_trace(path):
    ev = []

    def x(name, cat, ts, dur, tid=1, **args):
        ev.append({"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args})

    for step, t0 in enumerate((0, 10_000)):
        x(f"ProfilerStep#{step}", "user_annotation", t0, 9_000)
        x("keras_layer::heavy", "user_annotation", t0 + 10, 100)
        x("aten::linear", "cpu_op", t0 + 20, 80, **{"Sequence number": 10 + step})
        x("aten::mm", "cpu_op", t0 + 30, 50, **{"Sequence number": 11 + step})
        x("cudaLaunchKernel", "cuda_runtime", t0 + 40, 5, correlation=100 * step + 1)
        x("keras_layer::inner", "user_annotation", t0 + 200, 100)
        x("keras_layer::inner/small", "user_annotation", t0 + 210, 80)
        x("aten::mm", "cpu_op", t0 + 220, 50, **{"Sequence number": 20 + step})
        x("cudaLaunchKernel", "cuda_runtime", t0 + 230, 5, correlation=100 * step + 2)
        # backward on the autograd thread, by sequence number
        x(
            "autograd::engine::evaluate_function: MmBackward0",
            "cpu_op",
            t0 + 400,
            50,
            tid=2,
            **{"Sequence number": 11 + step},
        )
        x("cudaLaunchKernel", "cuda_runtime", t0 + 410, 5, tid=2, correlation=100 * step + 3)
        x("Optimizer.step#Adam.step", "cpu_op", t0 + 600, 50)
        x("cudaLaunchKernel", "cuda_runtime", t0 + 610, 5, correlation=100 * step + 4)
        x("aten::to", "cpu_op", t0 + 700, 50)  # the next batch to the device: a copy, no layer's work
        x("cudaMemcpyAsync", "cuda_runtime", t0 + 710, 5, correlation=100 * step + 5)
        for corr, dur in ((1, 2000), (2, 100), (3, 1000), (4, 400)):
            x("kernel", "kernel", t0 + 1000 + corr * 2000, dur, tid=7, correlation=100 * step + corr)
        x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", t0 + 8500, 300, tid=7, correlation=100 * step + 5)
    # a copy outside the profiled steps (the window's warm-up): not the steps' time
    x("aten::to", "cpu_op", 30_000, 50)
    x("cudaMemcpyAsync", "cuda_runtime", 30_010, 5, correlation=999)
    x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 30_100, 5_000, tid=7, correlation=999)
    with open(path, "w") as f:
        json.dump({"traceEvents": ev}, f)
    return str(path)


def test_torch_kernels_go_to_the_layer_of_the_op_that_launched_them(tmp_path):
    path = _torch_trace(tmp_path / "host.pt.trace.json")
    found = torch_ops([path])
    assert (
        found.source == "device kernels"
        and found.steps == 2
        and found.calls
        == {
            "heavy": 1,
            "inner": 1,
            "inner/small": 1,
        }
    )
    table = build_table(0, 2, [path], TREE)
    by = {r.path: r for r in table.rows}
    assert [r.path for r in table.rows] == ["heavy", OUTSIDE, "inner/small"]
    assert by["heavy"].ms_per_step == pytest.approx(3.0)  # 2 ms forward + 1 ms backward kernels per step
    assert (by["heavy"].forward_ms, by["heavy"].backward_ms) == (pytest.approx(2.0), pytest.approx(1.0))
    assert by[OUTSIDE].ms_per_step == pytest.approx(0.4)
    assert by["inner/small"].ms_per_step == pytest.approx(0.1)
    # the input copies of the steps are in no row and not in the total: their own figure, said under the table
    assert table.total_ms_per_step == pytest.approx(3.5) and table.copy_ms_per_step == pytest.approx(0.3)
    assert "Copies between host and device: 0.300 ms per step" in table.text()


def test_an_unreadable_trace_gives_a_table_that_says_why(tmp_path):
    bad = tmp_path / "host.xplane.pb"
    bad.write_bytes(b"\xff\xff not a trace")
    table = build_table(0, 2, [str(bad)], TREE)
    assert table.error.startswith("the trace could not be read") and not table.rows
    assert "none (the trace could not be read" in table.text()


def test_a_kernel_known_only_by_its_launch_annotation_goes_to_its_layer(tmp_path):
    c = _classes()
    space = c["XSpace"]()
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.stat_metadata.add(key=1).value.name = "level 0"
    gpu.event_metadata.add(key=1).value.name = "volta_sgemm_128x64_nn"
    line = gpu.lines.add(name="Stream #7(Compute)")
    for t, annotation in enumerate(["train::net_1/heavy_1/MatMul:MatMul", "gradient_tape/net_1/heavy_1/MatMul/MatMul"]):
        ev = line.events.add(metadata_id=1, offset_ps=t * 1000 * US, duration_ps=400 * US)
        ev.stats.add(metadata_id=1, str_value=annotation)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    table = build_table(0, 1, [str(path)], TREE)
    assert [(r.path, r.forward_ms, r.backward_ms) for r in table.rows] == [
        ("heavy", pytest.approx(0.4), pytest.approx(0.4))
    ]


def _mem(ts, nbytes, tid=1, device=0):
    args = {"Bytes": nbytes, "Total Allocated": 0, "Device Type": device, "Device Id": -1 if device == 0 else 0}
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts, "args": args}


def _range(path, ts, dur, tid=1):
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"keras_layer::{path}",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }


def test_a_layers_peak_memory_is_its_threads_highest_rise_inside_its_range():
    events = [
        _range("heavy", 10, 10),
        _mem(5, 100),  # before the range: not the layer's
        _mem(12, 400),
        _mem(13, 10_000, tid=2),  # another thread (the input pipeline): not the layer's
        _mem(14, 200),
        _mem(16, -400),
        _mem(18, 100),
        _range("heavy", 30, 10),  # a second call, smaller: the largest call stands
        _mem(32, 50),
        _range("inner/small", 50, 5),  # a range with no allocation in it: 0, measured
    ]
    assert range_peaks(events) == {"heavy": 600, "inner/small": 0}
    gpu = [*events, _mem(15, 4096, device=1), _mem(16, -1024, device=1), _mem(17, 512, device=1)]
    assert range_peaks(gpu) == {"heavy": 4096, "inner/small": 0}  # the GPU's allocator where there is one
    assert range_peaks([_range("heavy", 10, 10)]) is None  # memory not profiled: no figure at all


def test_the_table_shows_peak_memory_only_where_the_trace_has_it(tmp_path):
    marks = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 100}]
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 11, "dur": 5, "args": {}}
    events = [*marks, _range("heavy", 10, 10), op]
    for name, extra in (("without.pt.trace.json", []), ("with.pt.trace.json", [_mem(12, 3 * 2**20)])):
        path = tmp_path / name
        path.write_text(json.dumps({"traceEvents": events + extra}))
        table = build_table(3, 1, [str(path)], TREE)
        heavy = next(r for r in table.rows if r.path == "heavy")
        if extra:
            assert heavy.peak_activation_bytes == 3 * 2**20 and "| 3.00 |" in table.text()
        else:
            assert heavy.peak_activation_bytes is None and "peak MiB" not in table.text()
