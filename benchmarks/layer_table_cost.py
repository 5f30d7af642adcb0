"""ProfilerWindow's layer table on a ResNet-50: how long its analysis takes after a 10-step window, off the training thread.

What it measures: a `keras.applications.ResNet50` (no weights) trains with a `ProfilerWindow` of
`--steps` steps (`analyze=False`: xprof's input-pipeline conversion is not part of this figure).
The layer table is built on the window's background thread; its own timer (`LayerTable.seconds`:
reading the trace, attributing every op, sorting) is the analysis time. Also: the trace's size,
the ops it counted, the rows, the five heaviest layers, and how long the training thread waited
in `wait_for_analysis()` after the fit (0 when the analysis ended during the remaining steps).

Output: `analysis_seconds`, `trace_mib`, `rows`, `total_ms_per_step` (the ops' time per step)
beside `mean_step_ms` (the window's wall time per step), `top`. Goal: under 10 s for a 10-step
window of ResNet-50 (the issue's figure); `--smoke` runs a 3-step window at 32x32 on the CPU.

    python benchmarks/layer_table_cost.py --backend torch            # a GPU: batch 64 at 224x224
    python benchmarks/layer_table_cost.py --backend tensorflow --smoke
"""

from __future__ import annotations

import sys
import tempfile
import time

import _common

BENCHMARK = "layer_table_cost"


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="steps in the profiled window")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image", type=int, default=224, help="image side in pixels")
    p.add_argument("--start", type=int, default=5, help="the window's first step (past compilation)")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.batch, args.image, args.start = 3, 2, 32, 2
    return args


def measure(args) -> dict:
    import keras
    import numpy as np

    from keras_gpu_tools import ProfilerWindow

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.image, args.image, 3), classes=10)
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    n = (args.start + args.steps + 2) * args.batch
    x = np.random.default_rng(0).random((n, args.image, args.image, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, n)
    with tempfile.TemporaryDirectory(prefix="kgt_layers_") as log_dir:
        cb = ProfilerWindow(log_dir, start_step=args.start, num_steps=args.steps, analyze=False, verbose=0)
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, callbacks=[cb])
        t0 = time.perf_counter()
        table = cb.layer_table()
        waited = time.perf_counter() - t0
        capture = cb.captures[0] if cb.captures else None
    if table is None:
        return {"error": "no layer table (no profiler on this backend and Python?)"}
    return {
        "error": table.error,
        "analysis_seconds": None if table.seconds is None else round(table.seconds, 3),
        "waited_after_fit_seconds": round(waited, 3),
        "trace_mib": None if capture is None else round(capture.size_bytes / 2**20, 2),
        "steps": table.num_steps,
        "source": table.source,
        "rows": len(table.rows),
        "total_ms_per_step": None if table.total_ms_per_step is None else round(table.total_ms_per_step, 3),
        "mean_step_ms": None if capture is None or capture.mean_step_ms is None else round(capture.mean_step_ms, 3),
        "top": [(r.path, round(r.ms_per_step, 3), round(100 * r.share, 1)) for r in table.rows[:5]],
    }


def main() -> int:
    args = _parse()
    result = _common.measure_and_save(args, BENCHMARK, measure)

    check = _common.Checks()
    check(not result.get("error"), f"a layer table was built ({result.get('error') or 'ok'})")
    check(result.get("rows", 0) >= 50, f"ResNet-50's layers in rows ({result.get('rows')})")
    seconds = result.get("analysis_seconds")
    check(seconds is not None and seconds < 10.0, f"the analysis under 10 s ({seconds} s)")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
