"""The layer table of a real JAX trace on this Python: Keras disables JAX profiling below 3.12 (a crash was
reported), so the trace is taken with `jax.profiler` itself, in a subprocess that may crash alone."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

pytestmark = [pytest.mark.multibackend, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import glob, json, sys
    import numpy as np, jax
    from keras_gpu_tools.profiling.layer_table import build_table
    from keras_gpu_tools.profiling.layers import layer_tree
    from tests.helpers.fresh_process import tensorflow_hidden
    from tests.helpers.models import one_heavy_layer_model

    with tensorflow_hidden():  # Keras seeds TensorFlow too where installed: an import this JAX fit never uses
        model = one_heavy_layer_model()
    x = np.random.default_rng(0).random((64 * 8, 256), dtype=np.float32)
    y = np.random.default_rng(1).random((64 * 8, 1), dtype=np.float32)
    model.fit(x, y, batch_size=64, verbose=0)  # compiled before the trace
    jax.profiler.start_trace(sys.argv[1])
    model.fit(x, y, batch_size=64, verbose=0)
    jax.profiler.stop_trace()
    table = build_table(0, 8, glob.glob(sys.argv[1] + "/plugins/profile/*/*.xplane.pb"), layer_tree(model))
    print(json.dumps({"error": table.error, "source": table.source, "rows": [
        [r.path, r.calls, r.ms_per_step, r.share, r.forward_ms, r.backward_ms] for r in table.rows],
        # a Dense layer's FLOPs per step are 6 x batch x its kernel's size: ranked by kernel size, exactly
        "kernels": {l.name: int(np.prod(l.kernel.shape)) for l in model._flatten_layers() if hasattr(l, "kernel")}}))
    """
)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="a JAX trace")
def test_a_jax_trace_gives_the_heavy_layer_first_forward_and_backward(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode < 0:
        pytest.skip(f"jax.profiler crashed on this Python (signal {-proc.returncode}), as Keras warns")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["error"] and out["source"] == "host ops"
    rows = {r[0]: r for r in out["rows"]}
    # heavy first by its exact FLOPs (which layer takes longest is measured: the benchmark's); times well formed
    kernels = out["kernels"]
    assert max(kernels, key=kernels.get) == "heavy" and kernels["heavy"] > 0.5 * sum(kernels.values()), kernels
    assert all(r[2] >= 0 for r in out["rows"]) and sum(r[3] for r in out["rows"]) == pytest.approx(1.0)
    assert [r[2] for r in out["rows"]] == sorted((r[2] for r in out["rows"]), reverse=True)
    assert rows["heavy"][4] > 0 and rows["heavy"][5] > 0  # forward and the transposed (backward) ops
    assert rows["shared"][1] == 2 and "inner/small" in rows
