"""Per-step cost of the package's callbacks: on against off in adjacent blocks of one fit, with an A/A beside.

What it measures: the time each training step gains when the package's callbacks (all six by
default: logger, detector, profiler window with no window due, OOM reducer, live view,
mixed-precision check; `--callbacks` picks a subset) are attached, against the same fit without
them. Per-fit work (threads, epoch hooks) is left out by design: it runs in both halves.

How:

- One model, one fit of `--epochs` x `--steps` steps, the callbacks in it. Every `--block` steps
  a harness flips them: *on*, Keras calls the callbacks' batch hooks and trains through the
  package's step path (step hook, detector, reducer); *off*, their batch hooks are not called
  and Keras's own train function is put back. Whole fits of identical models differ from round
  to round by far more than the cost to resolve, in phases of seconds; adjacent blocks run
  milliseconds apart.
- The A/A is a second fit of the same kind whose harness never turns the callbacks on: two
  *off* halves, timed and paired alike. A/B and A/A fits alternate, `--rounds` each. Read the
  A/B only beside its A/A: a difference the A/A also shows is noise.
- `--dispatch gate` (default, the method of the GPU figures): one callback holds the callbacks
  and forwards their hooks through a loop of its own. `--dispatch keras` (the method of the CPU
  figures): the callbacks stay in fit()'s own list and *off* blocks take them out of it, so
  Keras dispatches their hooks itself (on its batch-end thread pool where that is on): on minus
  off is what a user's fit pays.
- A block is 400 steps by default, the detector's sampling period, so each *on* block carries
  one synced step and its share of fetch-timed steps. A block is timed on the device: at each
  boundary the harness waits for the outputs of the block's last call before reading the clock.
  The first epoch (compilation, warm-up) is left out.

Output: `all_six_on_over_off` and `aa_off_over_off`, each with the mean, median and 10%-trimmed
mean of the per-pair time ratios, and `added_us_per_step` (the same in microseconds a step at the
median *off* step) with its `standard_error_us`. The cost is the A/B's figure minus the A/A's:
`net_of_aa` (medians: `ratio`, the share of a step, and `us_per_step`).

Goal (a full run exits non-zero when it is missed): the net cost under 1% of a step on a GPU
(`net_of_aa.ratio` < 0.01); under 10 us a step of host time without one (`net_of_aa.us_per_step`
< 10). Every run checks its structure: the expected number of pairs, every ratio finite and
positive, each median ratio within (0.2, 5) (a bound on the timing, not the goal: a block timed
without its sync, or paired with a block of its own kind, reads far outside it; the cost itself
is a fraction of a percent), and the net cost computed. A smoke run prints the goal, unenforced.

    # the CPU figures (Keras's dispatch; one compute thread)
    OMP_NUM_THREADS=1 python benchmarks/per_step_cost.py --backend jax --width 32 --layers 1 \\
        --batch 32 --steps 3000 --block 100 --epochs 3 --rounds 10 --dispatch keras
    # a GPU (float32 GEMMs keep the GPU below its power limit: steadier blocks)
    JAX_DEFAULT_MATMUL_PRECISION=highest python benchmarks/per_step_cost.py --backend jax \\
        --width 2048 --batch 1024 --rounds 6
    python benchmarks/per_step_cost.py --backend torch --smoke     # CPU check, seconds
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
import warnings

import _common
from _common import CALLBACKS

BENCHMARK = "per_step_cost"


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="fits of each kind (A/B and A/A), alternating")
    p.add_argument("--epochs", type=int, default=3, help="per fit; the first is left out")
    p.add_argument("--steps", type=int, default=4000, help="steps per epoch")
    p.add_argument("--block", type=int, default=400, help="steps per block")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument(
        "--device-data",
        action="store_true",
        help="torch: feed batches sliced from tensors already on the GPU (no host-to-device copy)",
    )
    p.add_argument(
        "--callbacks",
        default=",".join(CALLBACKS),
        help="comma-separated subset of the six to flip; `Callback` is a keras.callbacks.Callback() that "
        "overrides nothing (what Keras's dispatch alone costs)",
    )
    p.add_argument(
        "--no-batch-end-thread",
        action="store_true",
        help="diagnostic: Keras runs the batch-end hooks on the training thread instead of its thread pool",
    )
    p.add_argument("--dispatch", choices=("gate", "keras"), default="gate")
    args = p.parse_args()
    unknown = set(args.callbacks.split(",")) - set(CALLBACKS) - {"Callback"}
    if unknown:
        p.error(f"--callbacks: unknown {sorted(unknown)}; expected names from {', '.join(CALLBACKS)}, or Callback")
    if args.smoke:
        args.width, args.layers, args.batch = 32, 1, 32
        args.steps, args.block, args.epochs, args.rounds = 250, 50, 3, 1
    if args.steps < 2 * args.block + 1:
        p.error("--steps must hold at least two blocks and one more step")
    return args


def _harnesses():
    """The two harnesses: `gate` (holds the callbacks, forwards their hooks) and `keras` (Keras's own list)."""
    import keras

    class Blocks(keras.callbacks.Callback):
        """Times blocks of `block` steps; between blocks flips the callbacks' batch hooks and the step path."""

        async_safe = True  # as the callbacks it holds: Keras keeps its batch-end thread pool

        def __init__(self, inner, block: int, ab: bool):
            super().__init__()
            self.inner, self.block, self.ab = inner, block, ab
            self.last = None
            self.hooked = False  # whether the package's step path was in place (and so flipped)

        def on_train_begin(self, logs=None):
            self.wrapped = None  # read at the first step, once every callback has started

        def _start(self):
            # The model itself: on JAX, Keras's `Callback.model` writes the state back into
            # the variables (a sync) on each access; inside a step that corrupts the fit.
            self.m = self.model
            self.wrapped = _common.train_function(self.m)
            # Without a step hook (callbacks that only have batch hooks), only the hooks flip.
            self.keras_own = getattr(self.wrapped, "__wrapped__", self.wrapped)
            self.hooked = self.keras_own is not self.wrapped
            self.on, self.epoch, self.t = True, 0, None
            self.blocks: list[tuple[int, bool, float]] = []  # (epoch, on, seconds per step)

        def on_train_end(self, logs=None):
            if self.wrapped is not None:
                _common.set_train_function(self.m, self.wrapped)
            self.flip(True)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch, self.t = epoch, None  # a block never spans an epoch end

        def on_train_batch_begin(self, batch, logs=None):
            if self.wrapped is None:
                self._start()
            pos = batch % self.block
            if pos == self.block - 1:
                self._keep_outputs_of_next_call()
            elif pos == 0:
                if self.t is not None:
                    _common.sync(self.last)  # the device has finished the block: its time, not the host's
                    self.blocks.append((self.epoch, self.on, (time.perf_counter() - self.t) / self.block))
                self.on = not self.on
                _common.set_train_function(self.m, self.wrapped if self.on and self.ab else self.keras_own)
                self.flip(self.on and self.ab)
                self.t = time.perf_counter()

        def flip(self, on: bool) -> None:
            """Turns the callbacks' batch hooks on or off."""

        def _keep_outputs_of_next_call(self):
            """The block's last call keeps its outputs for the sync (once a block; in every kind of block)."""
            fn = _common.train_function(self.m)

            def last_of_block(*args):
                _common.set_train_function(self.m, fn)
                self.last = fn(*args)
                return self.last

            _common.set_train_function(self.m, last_of_block)

    class Gate(Blocks):
        """Holds the callbacks and forwards every hook to them through a loop of its own."""

        def set_model(self, model):
            super().set_model(model)
            for cb in self.inner:
                cb.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            for cb in self.inner:
                cb.set_params(params)

        def _all(self, hook, *a):
            for cb in self.inner:
                getattr(cb, hook)(*a)

        def on_train_begin(self, logs=None):
            self._all("on_train_begin", logs)
            super().on_train_begin(logs)
            self.hooks_on = True

        def on_train_end(self, logs=None):
            super().on_train_end(logs)
            self._all("on_train_end", logs)

        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            self._all("on_epoch_begin", epoch, logs)

        def on_epoch_end(self, epoch, logs=None):
            self._all("on_epoch_end", epoch, logs)

        def flip(self, on: bool) -> None:
            self.hooks_on = on

        def on_train_batch_begin(self, batch, logs=None):
            super().on_train_batch_begin(batch, logs)
            if self.hooks_on:
                self._all("on_train_batch_begin", batch, logs)

        def on_train_batch_end(self, batch, logs=None):
            if self.hooks_on:
                self._all("on_train_batch_end", batch, logs)

    class KerasList(Blocks):
        """First in fit()'s list; *off*, takes the callbacks out of Keras's own list of callbacks.

        The list changes in place, from this callback's batch-begin hook, the first of each
        step: the step's other hooks already follow it. It is whole again at the last step
        of each epoch (in no timed block), so every callback sees the epoch end.
        """

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            self.cbl = _common.fit_callback_list()
            self.full = list(self.cbl.callbacks)
            self.without = [cb for cb in self.full if not any(cb is i for i in self.inner)]
            if self.full[0] is not self:
                raise RuntimeError("the keras harness must come first in fit()'s callbacks")
            self.last_step = self.params["steps"] - 1

        def flip(self, on: bool) -> None:
            self.cbl.callbacks[:] = self.full if on else self.without  # in place: Keras's loop is over it

        def on_train_batch_begin(self, batch, logs=None):
            super().on_train_batch_begin(batch, logs)
            if batch == self.last_step:
                self.flip(True)

    return {"gate": Gate, "keras": KerasList}


def _pairs(blocks) -> list[float]:
    """on/off time ratios of adjacent blocks of the same epoch, epoch 0 left out (either one first)."""
    out = []
    for epoch in sorted({e for e, _, _ in blocks} - {0}):
        mine = [(on, t) for e, on, t in blocks if e == epoch]
        for (on1, t1), (on2, t2) in zip(mine[::2], mine[1::2]):
            if on1 != on2:
                out.append((t1 / t2) if on1 else (t2 / t1))
    return out


def _device_batches(x, y, batch: int):
    """A torch DataLoader of `(x, y)` batches sliced from copies of both on the first GPU: views, no copy."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Slices(torch.utils.data.IterableDataset):
        def __init__(self):
            self.x, self.y = torch.as_tensor(x, device=device), torch.as_tensor(y, device=device)

        def __len__(self):
            return len(self.x) // batch

        def __iter__(self):
            for i in range(len(self)):
                yield self.x[i * batch : (i + 1) * batch], self.y[i * batch : (i + 1) * batch]

    return torch.utils.data.DataLoader(Slices(), batch_size=None)


def _summary(values: list[float], step_ms: float) -> dict:
    values = sorted(values)
    cut = len(values) // 10
    out = {
        "pairs": len(values),
        "mean": statistics.mean(values) if values else None,
        "median": statistics.median(values) if values else None,
        "trimmed_mean_10pct": statistics.mean(values[cut : len(values) - cut] or values) if values else None,
        "stdev": statistics.stdev(values) if len(values) > 1 else None,
    }
    if len(values) > 1:  # the same in microseconds a step, at the median step of the off blocks
        step_us = 1e3 * step_ms
        out["added_us_per_step"] = {
            k: round((out[k] - 1) * step_us, 2) for k in ("mean", "median", "trimmed_mean_10pct")
        }
        out["standard_error_us"] = round(out["stdev"] / len(values) ** 0.5 * step_us, 2)
    return out


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:+.2f}%"


def _net(ab: dict, aa: dict, step_ms: float) -> dict:
    """The A/B's median net of the A/A's: as a share of the step (``ratio``) and in microseconds a step."""
    if ab["median"] is None or aa["median"] is None:
        return {"ratio": None, "us_per_step": None, "standard_error_us": None}
    ratio = ab["median"] - aa["median"]
    errors = [ab.get("standard_error_us"), aa.get("standard_error_us")]
    return {
        "ratio": ratio,
        "us_per_step": round(ratio * 1e3 * step_ms, 2),
        "standard_error_us": round(math.hypot(*errors), 2) if None not in errors else None,
    }


def main() -> int:
    args = _parse()
    backend = _common.setup(args)
    out = _common.out_path(args, BENCHMARK)
    warnings.simplefilter("ignore")
    if args.no_batch_end_thread:
        _common.keras_batch_end_on_training_thread()
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, 64)).astype("float32")
    y = rng.integers(0, 10, size=(args.batch * args.steps,)).astype("int32")
    tmp = tempfile.mkdtemp(prefix="kgt_per_step_")
    keras.utils.set_random_seed(0)
    layers = [keras.Input((64,))] + [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
    model = keras.Sequential(layers + [keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    Harness = _harnesses()[args.dispatch]

    def callbacks():
        makers = {**_common.callback_makers(tmp), "Callback": keras.callbacks.Callback}
        return [makers[name]() for name in args.callbacks.split(",")]

    if args.device_data and backend != "torch":
        raise SystemExit("--device-data: torch only (JAX puts NumPy batches on the device asynchronously)")
    data = _device_batches(x, y, args.batch) if args.device_data else None

    def fit(epochs, cbs, steps=None):
        if data is not None:
            return model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=cbs)
        n = len(x) if steps is None else steps * args.batch
        return model.fit(x[:n], y[:n], batch_size=args.batch, epochs=epochs, verbose=0, shuffle=False, callbacks=cbs)

    fit(1, callbacks(), steps=20)  # compile and warm up
    ratios: dict[str, list[float]] = {"ab": [], "aa": []}
    step_ms: dict[str, list[float]] = {"ab": [], "aa": []}
    blocks: dict[str, list] = {"ab": [], "aa": []}  # (on, ms per step) of every steady-state block, in order
    hooked = []
    gpus = _common.gpu_devices()

    def result() -> dict:
        off_ms = statistics.median(step_ms["ab"] + step_ms["aa"]) if step_ms["ab"] + step_ms["aa"] else math.nan
        ab, aa = _summary(ratios["ab"], off_ms), _summary(ratios["aa"], off_ms)
        return {
            **_common.environment(backend),
            "device": gpus[0] if gpus else "CPU",
            "args": vars(args),
            "data": "torch tensors on the GPU" if data is not None else "NumPy arrays",
            "callbacks": args.callbacks.split(","),
            "dispatch": args.dispatch,
            "step_path_flipped": all(hooked) if hooked else None,
            "off_step_ms_median": off_ms,
            "all_six_on_over_off": ab,
            "aa_off_over_off": aa,
            "net_of_aa": _net(ab, aa, off_ms),
            "ratios": ratios,
            "blocks": blocks,
        }

    for r in range(args.rounds):
        for kind in ("ab", "aa") if r % 2 == 0 else ("aa", "ab"):
            inner = callbacks()
            harness = Harness(inner, args.block, ab=kind == "ab")
            fit(args.epochs, [harness] if args.dispatch == "gate" else [harness, *inner])
            pairs = _pairs(harness.blocks)
            ratios[kind] += pairs
            step_ms[kind] += [1e3 * t for e, on, t in harness.blocks if e > 0 and not on]
            blocks[kind] += [(on, round(1e3 * t, 5)) for e, on, t in harness.blocks if e > 0]
            if kind == "ab":
                hooked.append(harness.hooked)
            mean = f"{statistics.mean(pairs):.4f}" if pairs else "n/a"
            print(f"{kind} round {r}: {len(pairs)} pairs, mean ratio {mean}", flush=True)
            _common.save(out, BENCHMARK, backend, result())  # after every fit: a run cut short keeps what it measured

    final = result()
    print("step (off)", round(final["off_step_ms_median"], 4), "ms")
    for key in ("all_six_on_over_off", "aa_off_over_off"):
        print(key, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in final[key].items()})
    print("written to", out)

    check = _common.Checks(args)
    blocks_per_epoch = (args.steps - 1) // args.block
    expected = args.rounds * (args.epochs - 1) * (blocks_per_epoch // 2)
    for key, kind in (("all_six_on_over_off", "ab"), ("aa_off_over_off", "aa")):
        check(final[key]["pairs"] == expected, f"{key}: {final[key]['pairs']} pairs, expected {expected}")
        check(all(math.isfinite(v) and v > 0 for v in ratios[kind]), f"{key}: every ratio finite and positive")
        median = final[key]["median"]
        check(
            median is not None and 0.2 < median < 5.0,
            f"{key}: median ratio {median} within (0.2, 5) (the blocks' timing; the goal is below)",
        )
    check(math.isfinite(final["off_step_ms_median"]) and final["off_step_ms_median"] > 0, "off step time positive")
    if set(args.callbacks.split(",")) & {"InputBoundDetector", "OOMBatchSizeReducer"}:
        check(final["step_path_flipped"] is True, "the package's step path was in place and flipped")
    net = final["net_of_aa"]
    check.figure("the net cost as a share of a step (A/B median less A/A median)", net["ratio"])
    print("net of the A/A:", net)
    if gpus:  # the device's step: a share of it
        ok = net["ratio"] is not None and net["ratio"] < 0.01
        check.goal(ok, f"the net cost under 1% of a GPU step ({_pct(net['ratio'])}, {net['us_per_step']} us)")
    else:  # the host's step: microseconds
        ok = net["us_per_step"] is not None and net["us_per_step"] < 10.0
        check.goal(ok, f"the net cost under 10 us a step of host time ({net['us_per_step']} us)")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
