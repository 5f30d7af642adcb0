"""plan_batch_size: the time it takes and the batch it finds, against what fits.

What it measures: how long `keras_gpu_tools.plan_batch_size` takes on a model, the batch and
predicted peak it returns, and whether that batch is right: on a GPU, the planned batch trains
(3 steps, no reducer) and 1.5 times it runs out of memory; on a CPU (which has no memory to run
out of: `--memory-limit-mib` stands for a card), the planned batch is the largest trial that fit
and the next batch tried did not.

How: an MLP (`--inputs` -> `--layers` x Dense(`--width`, relu) -> 1; by default 64 -> 65536 -> 1,
SGD with momentum, MSE) is compiled, and
`plan_batch_size(model, x, y, memory_limit_mib=...)` is timed (JAX: XLA's memory analysis of the
compiled step, no step run; TensorFlow and torch: trial steps and the allocator's peak). Then the
planned batch is checked as above.

Output: `plan_seconds`, `batch_size`, `peak_mib` of `capacity_mib`, `method`, `trials` (every
batch tried, its peak, whether it fit), `largest_fitting_trial` and `smallest_failing_trial`
(the bracket the search ended on), and on a GPU `planned_batch_trains` and
`larger_batch_ran_out_of_memory`.

Goals, on a GPU planning for the whole card (a full run exits non-zero and names the one missed):
the planned batch trains; 1.5 times it runs out of memory. Every run checks the plan's structure:
a batch planned, its peak within the capacity less the margin, the plan the largest trial that
fit, and a larger trial that did not (on a CPU with `--memory-limit-mib` that is the whole check:
no goal applies without a card to run out of).

    python benchmarks/planner.py --backend jax                   # a GPU: plans for the whole card
    python benchmarks/planner.py --backend torch --smoke         # CPU check, seconds
"""

from __future__ import annotations

import os
import sys
import time

import _common

BENCHMARK = "planner"


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--width", type=int, default=65536)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--memory-limit-mib", type=float, default=None, help="plan for this much (default: the card)")
    args = p.parse_args()
    if args.smoke:
        args.inputs, args.width, args.layers = 32, 64, 2
        args.memory_limit_mib = args.memory_limit_mib or 1.0
    return args


def _data(n: int, inputs: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, inputs), dtype="float32")
    return x, (x.sum(1, keepdims=True) * 0.01).astype("float32")


def _trains(model, x, y) -> tuple[bool, str]:
    """Whether 3 steps at this batch ran; the error's start if not."""
    try:
        for _ in range(3):
            model.train_on_batch(x, y)
        _common.sync(model.trainable_variables[0].value)
        return True, ""
    except Exception as e:  # an out-of-memory error of any backend
        return False, f"{type(e).__name__}{' (out of memory)' if _common.is_oom(e) else ''}: {str(e)[:300]}"


def measure(args) -> dict:
    import keras

    from keras_gpu_tools import plan_batch_size

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((args.inputs,))]
        + [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        + [keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(1e-3, momentum=0.9), "mse")
    x, y = _data(256, args.inputs)  # only a sample's shapes matter; trial batches repeat these
    t0 = time.perf_counter()
    plan = plan_batch_size(model, x, y, memory_limit_mib=args.memory_limit_mib)
    seconds = time.perf_counter() - t0
    fitting = [t.batch_size for t in plan.trials if t.fits]
    failing = [t.batch_size for t in plan.trials if not t.fits]
    out = {
        "plan": str(plan),
        "plan_seconds": round(seconds, 3),
        "batch_size": plan.batch_size,
        "peak_mib": plan.peak_mib,
        "capacity_mib": plan.capacity_mib,
        "margin": plan.margin,
        "method": plan.method,
        "trials": [
            {"batch": t.batch_size, "peak_mib": [p / 2**20 for p in t.peak_bytes or []], "fits": t.fits}
            for t in plan.trials
        ],
        "largest_fitting_trial": max(fitting, default=None),
        "smallest_failing_trial": min(failing, default=None),
    }
    if _common.gpu_devices() and args.memory_limit_mib is None:
        xb, yb = _data(plan.batch_size, args.inputs)
        out["planned_batch_trains"], out["planned_batch_error"] = _trains(model, xb, yb)
        larger = int(1.5 * plan.batch_size)
        xl, yl = _data(larger, args.inputs)
        trained, error = _trains(model, xl, yl)
        out.update(larger_batch=larger, larger_batch_ran_out_of_memory=not trained, larger_batch_error=error)
    return out


def main() -> int:
    args = _parse()
    backend = _common.setup(args)
    if not _common.gpu_names():  # TensorFlow's CPU allocator keeps statistics only with this, set before import
        os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    out = _common.out_path(args, BENCHMARK)
    result = measure(args)
    print(result["plan"])
    print(
        f"{result['plan_seconds']} s, {len(result['trials'])} trials ({result['method']}); largest fitting trial "
        f"{result['largest_fitting_trial']}, smallest failing {result['smallest_failing_trial']}"
    )
    for key in ("planned_batch_trains", "larger_batch_ran_out_of_memory"):
        if key in result:
            print(key, result[key])
    device = (_common.gpu_devices() or ["CPU"])[0]
    doc = {**_common.environment(backend), "device": device, "args": vars(args)}
    _common.save(out, BENCHMARK, backend, {**doc, "result": result})
    print("written to", out)

    check = _common.Checks(args)
    check(result["batch_size"] > 0, f"a batch fits ({result['batch_size']})")
    limit = [(1 - result["margin"]) * c for c in result["capacity_mib"]]
    check(all(p <= c for p, c in zip(result["peak_mib"], limit)), "the planned peak is within the capacity less margin")
    check(result["largest_fitting_trial"] == result["batch_size"], "the plan is the largest trial that fit")
    check(
        result["smallest_failing_trial"] is not None and result["smallest_failing_trial"] > result["batch_size"],
        "a larger batch was tried and did not fit",
    )
    check.figure("the planning time", result["plan_seconds"], 0.0)
    if "planned_batch_trains" in result:  # a GPU, the whole card: the plan against what fits
        check.goal(result["planned_batch_trains"], f"the planned batch trains ({result['batch_size']})")
        check.goal(
            result["larger_batch_ran_out_of_memory"],
            f"1.5 times the planned batch runs out of memory ({result['larger_batch']})",
        )
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
