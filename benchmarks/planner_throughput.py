"""plan_batch_size(objective="throughput"): is the batch it picks as fast as the fastest that fits?

What it measures: for a conv net (three Conv2D layers, `--image-size` x `--image-size` x 3 images,
128 by default) and an MLP (64 -> 8192 -> 8192 -> 1), the plan by throughput (its wall time,
compiles included, its chosen batch and its table, each candidate's samples/s with its ±), then every measured candidate again, and the round sizes users try
(32 to 1024, where they fit), independently, with a plain `model.fit` (epoch 0 compiles, then the median of the next epochs'
samples/s). `--reference arrays` (the default) fits on NumPy arrays, as most users do, and
gives the planner arrays holding two batches of the largest candidate (`--plan-samples`), which it
times the candidates on, as a user's `plan_batch_size(model, x_train, y_train)` does;
`--reference batch` fits on one batch repeated (a `PyDataset`) and gives the planner 64 samples,
so both time the step alone: on torch, Keras's array adapter batches the arrays on the host,
which can cap the speed of the fits on arrays.

Goals (a full run exits non-zero and names the one missed): the chosen batch's independent
samples/s within 5% of the best plain fit measured, and within 5% of the largest fitting batch's (the
plan's own rule: the smallest batch within 5% of the fastest, so a larger batch may be up to 5%
faster); the conv net planned within 2 minutes, and any model within `--max-seconds` plus 10%
where given (a compile cannot be cut short).
Every run checks that a batch was planned and (unless `--plan-only`) that the chosen batch's
plain fit ran; a smoke run's CPU timings say nothing of a GPU's knee, so it prints the goals
unenforced.

    python benchmarks/planner_throughput.py --backend jax --model conv --max-seconds 110   # H200, ~4 min
    python benchmarks/planner_throughput.py --backend torch --model conv --reference batch  # H200
    python benchmarks/planner_throughput.py --backend jax --model conv --max-seconds 110 --plan-only  # its time
    python benchmarks/planner_throughput.py --backend jax --smoke                          # CPU check, seconds
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import _common

BENCHMARK = "planner_throughput"
PLAN_GOAL_SECONDS = {"conv": 120.0}  # the conv net's planning, at most
PLAN_OVER = 1.10  # planning within max_seconds plus 10%
USER_SIZES = (32, 64, 128, 256, 512, 1024)
PLAN_SAMPLES = {
    "conv": 16384,
    "mlp": 1 << 21,
}  # the arrays given to the planner (about 1.8 GB and 0.5 GB)  # the round batches users try, fitted plainly beside the plan's


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("conv", "mlp", "both"), default="both")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument(
        "--max-seconds", type=float, default=None, help="plan_batch_size's budget (default: its own, 120 s; inf: none)"
    )
    p.add_argument("--max-batch-size", type=int, default=None, help="bound the candidates (needed on a CPU)")
    p.add_argument(
        "--reference",
        choices=("arrays", "batch"),
        default="arrays",
        help="the plain fits' input: NumPy arrays, or one batch repeated (the plan's own input)",
    )
    p.add_argument(
        "--plan-samples",
        type=int,
        default=None,
        help="samples of the arrays given to the planner (default: 16384 for the conv net, 2**21 for the MLP, "
        "enough for two batches of the largest candidate, so it times them on the arrays; 64 with --reference batch)",
    )
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="the plan and its wall time alone, without the plain fits that check it",
    )
    args = p.parse_args()
    if args.smoke:
        args.image_size, args.max_batch_size = 16, args.max_batch_size or 32
    return args


def _model(kind: str, image: int, smoke: bool):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "conv":
        width = 8 if smoke else 64
        inp = keras.Input((image, image, 3))
        h = inp
        for _ in range(3):
            h = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(h)
        out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h))
        model = keras.Model(inp, out)
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        shape: tuple[int, ...] = (image, image, 3)
    else:
        width = 64 if smoke else 8192
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(width, activation="relu"),
                keras.layers.Dense(width),
                keras.layers.Dense(1),
            ]
        )
        model.compile("adam", "mse")
        shape = (64,)
    return model, shape


def _data(n: int, shape: tuple[int, ...], kind: str):
    """``n`` samples: a block of at most 64 Ki random rows, repeated (drawing gigabytes of normals takes a minute)."""
    import numpy as np

    rng = np.random.default_rng(0)
    block = min(n, 65536)
    x = rng.standard_normal((block, *shape), dtype="float32")
    y = rng.integers(0, 10, (block,)) if kind == "conv" else rng.standard_normal((block, 1), dtype="float32")
    if block < n:
        x, y = np.resize(x, (n, *shape)), np.resize(y, (n, *y.shape[1:]))
    return x, y


def _fit_epochs(model, shape, kind: str, b: int, steps: int, epochs: int, reference: str) -> list[float]:
    """Each epoch's seconds of a plain model.fit of ``steps`` steps an epoch at batch ``b``."""
    times: list[float] = []
    clock = [_common.epoch_clock(times)]
    if reference == "batch":
        x, y = _data(b, shape, kind)
        model.fit(_common.same_batch(x, y, steps), epochs=epochs, verbose=0, callbacks=clock)
    else:
        x, y = _data(steps * b, shape, kind)
        model.fit(x, y, batch_size=b, epochs=epochs, shuffle=False, verbose=0, callbacks=clock)
    return times


def _plain_fit(model, shape, kind: str, b: int, smoke: bool, reference: str) -> float:
    """samples/s of a plain model.fit at batch ``b``: the median of epochs 1.. (epoch 0 compiles).

    Epochs last about a second (at least 5 steps, 2 of a step over a second), as a user's epochs
    are long: an epoch's fixed cost (iterator, logs) would otherwise weigh on small batches only.
    A short fit first (epoch 0 compiles, then 5 steps) gives the pace that sizes them. The arrays
    stay under about 8 GiB of host memory.
    """
    import math

    if smoke:
        steps = 3
    else:
        per_sample = 4 * math.prod(shape)
        most = max(2, (8 << 30) // max(1, b * per_sample))
        probe = min(5, most)
        rough = probe * b / _fit_epochs(model, shape, kind, b, probe, 2, reference)[1]
        steps = math.ceil(rough / b)
        fewest = 5 if steps > 1 else 2  # a step of over a second: two steps an epoch are already seconds of it
        steps = max(fewest, min(steps, 2000, most))
    times = _fit_epochs(model, shape, kind, b, steps, 2 if smoke else 4, reference)
    return steps * b / statistics.median(times[1:])


def measure(args, kind: str, keep) -> dict:
    """The plan and its plain fits; ``keep(result)`` saves what is measured so far (a run cut short keeps it)."""
    from keras_gpu_tools import plan_batch_size

    model, shape = _model(kind, args.image_size, args.smoke)
    # The user's arrays, as a user passes them: the planner times its candidates on them where they hold two
    # batches of the largest, as the plain fits on arrays read them.
    samples = args.plan_samples or (64 if args.smoke or args.reference == "batch" else PLAN_SAMPLES[kind])
    x, y = _data(samples, shape, kind)
    t0 = time.perf_counter()
    plan = plan_batch_size(
        model, x, y, objective="throughput", max_seconds=args.max_seconds, max_batch_size=args.max_batch_size
    )
    seconds = time.perf_counter() - t0
    print(plan)
    fitting = [c for c in plan.candidates if c.fits]
    # The plain fits: every measured candidate, the largest that fits, and the round sizes users try.
    largest = fitting[-1].batch_size if fitting else 0
    sizes = {c.batch_size for c in fitting if c.measured} | ({largest} if largest else set())
    sizes |= {b for b in USER_SIZES if b <= largest and not args.smoke}
    independent: dict[int, float | str] = {}
    result = {
        "plan": str(plan),
        "plan_seconds": round(seconds, 2),
        "batch_size": plan.batch_size,
        "candidates": [c.as_dict() for c in plan.candidates],
        "largest_fitting": fitting[-1].batch_size if fitting else None,
        "independent_samples_per_sec": independent,
    }
    keep(result)
    for b in sorted(sizes) if not args.plan_only else []:
        try:
            independent[b] = round(_plain_fit(model, shape, kind, b, args.smoke, args.reference), 1)
        except Exception as e:  # an out-of-memory error: recorded, not fatal
            independent[b] = f"{type(e).__name__}: {str(e)[:200]}"
        print(f"  plain fit at {b}: {independent[b]} samples/s")
        keep(result)
    return result


def main() -> int:
    args = _parse()
    backend = _common.setup(args)
    out = _common.out_path(args, BENCHMARK)
    kinds = ("conv", "mlp") if args.model == "both" else (args.model,)
    device = (_common.gpu_devices() or ["CPU"])[0]
    doc = {**_common.environment(backend), "device": device, "args": vars(args)}

    def keeper(kind: str):
        # A run per backend and model ("torch/mlp"): measuring one model keeps the other's figures.
        return lambda result: _common.save(out, BENCHMARK, f"{backend}/{kind}", {**doc, "result": result})

    results = {kind: measure(args, kind, keeper(kind)) for kind in kinds}
    print("written to", out)
    from keras_gpu_tools.planner import DEFAULT_MAX_SECONDS

    check = _common.Checks(args)
    for kind, r in results.items():
        fast = {b: v for b, v in r["independent_samples_per_sec"].items() if isinstance(v, float)}
        chosen = fast.get(r["batch_size"])
        print(f"{kind}: planned in {r['plan_seconds']} s; chosen {r['batch_size']}: {chosen}; all {fast}")
        check(r["batch_size"] is not None, f"{kind}: a batch was planned ({r['batch_size']})")
        check.figure(f"{kind}: the planning time", r["plan_seconds"], 0.0)
        measured = [c for c in r["candidates"] if c["measured"]]
        check(
            bool(measured) and all(c["uncertainty"] is not None for c in measured),
            f"{kind}: every measured candidate's samples/s has its uncertainty ("
            + ", ".join(f"{c['batch_size']}: ±{100 * (c['uncertainty'] or 0):.1f}%" for c in measured)
            + ")",
        )
        budget = DEFAULT_MAX_SECONDS if args.max_seconds is None else args.max_seconds
        if math.isfinite(budget):
            check.goal(
                r["plan_seconds"] <= PLAN_OVER * budget,
                f"{kind}: planned within max_seconds={budget:g} plus 10% ({r['plan_seconds']} s)",
            )
        if kind in PLAN_GOAL_SECONDS:
            goal = PLAN_GOAL_SECONDS[kind]
            check.goal(r["plan_seconds"] <= goal, f"{kind}: planned within {goal:g} s ({r['plan_seconds']} s)")
        if args.plan_only:
            continue
        check(chosen is not None, f"{kind}: the chosen batch trains ({r['batch_size']})")
        if chosen is None:
            continue
        best = max(fast.values())
        check.goal(
            chosen >= 0.95 * best, f"{kind}: the chosen batch within 5% of the best measured ({chosen / best:.3f})"
        )
        largest = fast.get(r["largest_fitting"])
        check.goal(
            largest is None or chosen >= 0.95 * largest,
            f"{kind}: the chosen batch within 5% of the largest ({r['largest_fitting']}: {largest})",
        )
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
