"""ProfilerWindow's layer table on a model whose FLOPs sit in one layer: that layer first, with most of the time.

What it measures: a functional model 4096 -> Dense(8192) `heavy` -> Dense(64) `proj` -> a shared
Dense(64) called twice -> Dense(10) `head` (about 97% of its multiply-adds in `heavy`) trains with
SGD at batch 1024 and a `ProfilerWindow` of `--steps` steps. The table's rows then say where the
window's kernel time went:

- `heavy_share`: the `heavy` row's share of the table's time per step (its rows' sum: the
  kernels; the copies of batches between host and device are no layer's work and stand apart,
  as `copy_ms_per_step`). Goal: `heavy` is the first row and holds at least 60%.
- `outside_share`: the `(outside layers)` row's share (the loss and the SGD update).

Output: `rows`, `total_ms_per_step`, `copy_ms_per_step`, `heavy_ms_per_step`, `heavy_share`,
`outside_share`, `top`. Every run checks that a table was built with the model's layers and
that the shares were computed; `--smoke` runs a small model (256 -> 1024, batch 64) with a
2-step window on the CPU and checks only that.

    python benchmarks/layer_table_heavy.py --backend jax               # a GPU
    python benchmarks/layer_table_heavy.py --backend tensorflow --smoke
"""

from __future__ import annotations

import sys
import tempfile

import _common

BENCHMARK = "layer_table_heavy"


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="steps in the profiled window")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--features", type=int, default=4096, help="the input's width")
    p.add_argument("--heavy", type=int, default=8192, help="the heavy layer's units")
    p.add_argument("--start", type=int, default=5, help="the window's first step (past compilation)")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.batch, args.features, args.heavy, args.start = 2, 64, 256, 1024, 2
    return args


def _model(features: int, heavy: int):
    import keras

    keras.utils.set_random_seed(0)
    shared = keras.layers.Dense(64, name="shared")
    inputs = keras.Input((features,))
    h = keras.layers.Dense(heavy, activation="relu", name="heavy")(inputs)
    h = keras.layers.Dense(64, name="proj")(h)
    h = shared(shared(h))
    model = keras.Model(inputs, keras.layers.Dense(10, name="head")(h), name="net")
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    return model


def measure(args) -> dict:
    import numpy as np

    from keras_gpu_tools import ProfilerWindow

    model = _model(args.features, args.heavy)
    n = (args.start + args.steps + 2) * args.batch
    x = np.random.default_rng(0).random((n, args.features), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, n)
    with tempfile.TemporaryDirectory(prefix="kgt_heavy_") as log_dir:
        cb = ProfilerWindow(log_dir, start_step=args.start, num_steps=args.steps, analyze=False, verbose=0)
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, callbacks=[cb])
        table = cb.layer_table()
    if table is None:
        return {"error": "no layer table (no profiler on this backend and Python?)"}
    total = table.total_ms_per_step
    rows = {r.path: r for r in table.rows}
    heavy = rows.get("heavy")
    outside = rows.get(_common.outside_layers())
    return {
        "error": table.error,
        "source": table.source,
        "rows": len(table.rows),
        "total_ms_per_step": None if total is None else round(total, 4),
        "copy_ms_per_step": None if table.copy_ms_per_step is None else round(table.copy_ms_per_step, 4),
        "heavy_ms_per_step": None if heavy is None else round(heavy.ms_per_step, 4),
        "heavy_share": None if heavy is None else round(heavy.share, 4),
        "outside_share": round(outside.share, 4) if outside is not None else 0.0,
        "top": [(r.path, round(r.ms_per_step, 4), round(100 * r.share, 1)) for r in table.rows[:5]],
    }


def main() -> int:
    args = _parse()
    result = _common.measure_and_save(args, BENCHMARK, measure)

    check = _common.Checks(args)
    check(not result.get("error"), f"a layer table was built ({result.get('error') or 'ok'})")
    top = [row[0] for row in result.get("top", [])]
    check({"heavy", "proj", "shared", "head"} <= set(top), f"the model's layers in rows ({top})")
    share = result.get("heavy_share")
    check.figure("the heavy layer's share", share, 0.0, 1.0)
    check.figure("the share outside layers", result.get("outside_share"), 0.0, 1.0)
    check.goal(top[:1] == ["heavy"], f"'heavy' is the first row ({top[:1]})")
    check.goal(share is not None and share >= 0.60, f"'heavy' holds at least 60% of the window ({share})")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
