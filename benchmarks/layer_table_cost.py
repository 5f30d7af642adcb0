"""ProfilerWindow's layer table on a ResNet-50: how long its analysis takes after a 10-step window, off the training thread.

What it measures: a `keras.applications.ResNet50` (no weights) trains with a `ProfilerWindow` of
`--steps` steps (`analyze=False`: xprof's input-pipeline conversion is not part of this figure).
The layer table is built on the window's background thread; its own timer (`LayerTable.seconds`:
reading the trace, attributing every op, sorting) is the analysis time. Also: the trace's size,
the ops it counted, the rows, the five heaviest layers, and how long the training thread waited
in `wait_for_analysis()` after the fit (0 when the analysis ended during the remaining steps).

Whether the table is right, two shares:

- `outside_share`: the `(outside layers)` row's time over the table's op time per step
  (`total_ms_per_step`, which is the sum of its rows): the loss, the optimizer, and every op the
  table could not put in a layer. Goal: at most 10% on ResNet-50.
- `coverage`: the layer rows' time (every row but `(outside layers)`) over the profiler's own op
  time per step, `trace_op_ms_per_step`: the trace files' device kernels (host ops without a
  device; copies between host and device left out, as the table leaves them), read with the
  package's trace reader but summed before any op is put in a layer. The
  table exposes only its rows' sum, so the denominator is read again from the window's trace.
  Goal: at least 90%.

Output: `analysis_seconds`, `trace_mib`, `rows`, `layer_rows_with_time`, `total_ms_per_step`
beside `trace_op_ms_per_step` and `mean_step_ms` (the window's wall time per step),
`outside_share`, `coverage`, `top`. Goals (a full run exits non-zero and names the one missed):
the analysis under 10 s for a 10-step window of ResNet-50; the two shares above. Every run
checks that a table was built with ResNet-50's layers, that some layer row has time (a table of
0 ms rows with everything outside is wrong, whatever its analysis time), and that both shares
were computed; `--smoke` runs a 1-step window at 32x32 on the CPU and checks only that.

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
        args.steps, args.batch, args.image, args.start = 1, 2, 32, 1
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
        trace_ms = None  # the profiler's own op time, read while the trace files exist
        try:
            trace_ms = _common.trace_op_ms_per_step(capture.files, args.steps) if capture is not None else None
        except Exception as e:  # a trace the reader does not know: the coverage check fails, the rest stands
            print(f"the trace's op time could not be read: {type(e).__name__}: {e}")
    if table is None:
        return {"error": "no layer table (no profiler on this backend and Python?)"}
    in_none = _common.outside_layers()
    outside = sum(r.ms_per_step for r in table.rows if r.path == in_none)
    layers = [r.ms_per_step for r in table.rows if r.path != in_none]
    total = table.total_ms_per_step
    return {
        "error": table.error,
        "analysis_seconds": None if table.seconds is None else round(table.seconds, 3),
        "waited_after_fit_seconds": round(waited, 3),
        "trace_mib": None if capture is None else round(capture.size_bytes / 2**20, 2),
        "steps": table.num_steps,
        "source": table.source,
        "rows": len(table.rows),
        "total_ms_per_step": None if table.total_ms_per_step is None else round(table.total_ms_per_step, 3),
        "trace_op_ms_per_step": None if trace_ms is None else round(trace_ms, 3),
        "mean_step_ms": None if capture is None or capture.mean_step_ms is None else round(capture.mean_step_ms, 3),
        "layer_rows_with_time": sum(ms > 0 for ms in layers),
        "outside_share": round(outside / total, 4) if total else None,
        "coverage": round(sum(layers) / trace_ms, 4) if trace_ms else None,
        "top": [(r.path, round(r.ms_per_step, 3), round(100 * r.share, 1)) for r in table.rows[:5]],
    }


def main() -> int:
    args = _parse()
    result = _common.measure_and_save(args, BENCHMARK, measure)

    check = _common.Checks(args)
    check(not result.get("error"), f"a layer table was built ({result.get('error') or 'ok'})")
    check(result.get("rows", 0) >= 50, f"ResNet-50's layers in rows ({result.get('rows')})")
    # rows of 0 ms and everything outside: the table read the trace but put no op in a layer
    check(result.get("layer_rows_with_time", 0) > 0, f"layer rows with time ({result.get('layer_rows_with_time')})")
    seconds = result.get("analysis_seconds")
    check.figure("the analysis time", seconds, 0.0)
    check.figure("the table's op time per step", result.get("total_ms_per_step"), 0.0)
    outside = result.get("outside_share")
    check.figure("the share outside layers", outside, 0.0, 1.0)
    coverage = result.get("coverage")
    check.figure("the rows' coverage of the profiler's op time", coverage, 0.0)
    check.goal(seconds is not None and seconds < 10.0, f"the analysis under 10 s ({seconds} s)")
    check.goal(outside is not None and outside <= 0.10, f"'(outside layers)' at most 10% of the window ({outside})")
    check.goal(
        coverage is not None and coverage >= 0.90,
        f"the layer rows cover at least 90% of the profiler's op time ({coverage})",
    )
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
