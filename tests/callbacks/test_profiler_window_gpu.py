"""ProfilerWindow on a real GPU (GPU machine; JAX needs Python 3.12+, torch too)."""

import json
import os

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

pytestmark = pytest.mark.gpu


def _rows(obj):
    """Rows of every gviz table in xprof's JSON output."""
    if isinstance(obj, dict):
        rows = list(obj.get("rows", []))
        for v in obj.values():
            if isinstance(v, (dict, list)):
                rows += _rows(v)
        return rows
    if isinstance(obj, list):
        return [r for item in obj for r in _rows(item)]
    return []


def test_trace_contains_gpu_kernels(tmp_path):
    width, batch = 2048, 2048
    x = np.random.default_rng(0).normal(size=(batch * 16, width)).astype("float32")
    model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width) for _ in range(3)])
    model.compile(optimizer="sgd", loss="mse")
    cb = ProfilerWindow(log_dir=tmp_path, start_step=5, num_steps=4, verbose=1)
    model.fit(x, x, batch_size=batch, epochs=1, verbose=0, callbacks=[cb])
    cb.wait_for_analysis()
    cap = cb.captures[0]
    assert cap.num_steps == 4 and cap.files
    report = {
        "backend": keras.backend.backend(),
        "trace": os.path.basename(cap.files[0]),
        "size_mib": round(cap.size_bytes / 2**20, 2),
        "mean_step_ms": round(cap.mean_step_ms, 3),
    }
    if keras.backend.backend() == "torch":
        events = json.load(open(cap.files[0]))["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        report.update(kernels=len(kernels), steps=sorted(steps))
        assert kernels, "no CUDA kernel in the torch trace"
        assert steps == {f"ProfilerStep#{i}" for i in range(5, 9)}
    else:
        from keras_gpu_tools.profiling.trace import tool_data

        kernel_rows = _rows(tool_data(cap.files, "kernel_stats"))
        report.update(
            kernel_rows=len(kernel_rows),
            analysis=cap.analysis.conclusion,
            hardware=cap.analysis.hardware,
            steps=len(cap.analysis.step_rows),
        )
        assert kernel_rows, "xprof's kernel_stats found no GPU kernel in the trace"
        assert len(cap.analysis.step_rows) == 4
        assert "No step time measured" not in cap.analysis.conclusion
    print("\nPROFILER_FIGURES " + json.dumps(report))
    out = os.environ.get("KGT_GPU_REPORT_DIR")
    if out:
        with open(os.path.join(out, f"profiler_{keras.backend.backend()}.json"), "w") as f:
            json.dump(report, f, indent=1)
