"""All callbacks on against off in adjacent blocks of one long fit(), with the same fit's A/A beside it.

Why: whole fits of identical models on the lent GPU machines differ from
round to round by 10-40% (``gpu_overhead_aa.py``: the epoch time of one bare
model ran from 0.97 to 1.97 ms a step within minutes on an H100), far more
than the 1% to resolve. The noise comes in phases of seconds, so this script
compares what runs milliseconds apart, with the device busy the whole time:

- One model, one fit of ``--epochs`` x ``--steps`` steps, all six callbacks of
  the package in it (logger, detector, profiler window with no window due, OOM
  reducer, live view, mixed-precision check; ``--callbacks`` picks a subset). Every
  ``--block`` steps a harness flips them: *on*, Keras calls the callbacks' batch hooks
  and trains through the package's step path (step hook, detector, reducer);
  *off*, the batch hooks are not called and Keras's own train function is put
  back. Their per-fit work (threads, epoch ends) runs in both halves, so the
  figure is the per-step cost; the per-epoch cost is ``gpu_overhead_aa.py``'s.
- ``--dispatch`` picks the harness. ``gate`` (the default, and the harness of
  every GPU figure in ``RESULTS.md``): one callback holds the six and forwards
  their hooks through a loop of its own, a little dearer than Keras's.
  ``keras``: the six stay in fit()'s own list, the harness first in it, and
  *off* blocks take them out of Keras's list (in place, from the harness's
  batch-begin hook, so the step's other hooks follow at once; whole again at
  each epoch's last step, which no timed block holds). Keras then dispatches
  their hooks itself, on its batch-end thread where that is on (whose calls
  follow a flip a step or two late), so *on* minus *off* is what a user's fit
  pays. ``--callbacks Callback,...`` flips plain ``keras.callbacks.Callback()``
  objects: what Keras's dispatch alone costs for that many callbacks.
- A block is 400 steps, the detector's sampling period: each *on* block holds
  exactly one synced step and its share of fetch-timed steps (the detector
  counts only the steps it sees), so every pair carries the whole periodic cost.
  Shorter blocks (``--block 50``: pairs closer in time, where the host drifts)
  put the synced step in one *on* block in 400 / block: then the mean over
  pairs carries it, the median does not.
- The figure is the on/off time ratio of adjacent blocks (the *on* block first
  in half the pairs), as the mean and the median over pairs; steady state only
  (the first epoch, with compilation, is left out). The A/A is a second fit
  of the same kind whose harness never turns the callbacks on: two *off* halves, timed and paired
  the same way. Fits of both kinds alternate, ``--rounds`` each.
- A block is timed from its first call to the end of its last one *on the
  device*: at each boundary the harness waits for the outputs of the block's last
  call (kept by a one-call wrapper put in front of that call only, in every
  kind of block) before it reads the clock, so a block's time does not depend
  on how far the host ran ahead of the device at its boundaries. The wait
  drains the queue once a block in both halves alike (about one step's
  dispatch, the same on and off). It did not make blocks steadier on the lent
  H200 (``RESULTS.md``): what moves them is the device's clock at its power
  limit (a saturated GPU) or the host (a GPU that waits for it).

    KERAS_BACKEND=jax python benchmarks/gpu_overhead_blocks.py --batch 1024 --out results/gpu_overhead_blocks_jax.json
    # steadier on an H200: float32 GEMMs keep the GPU busy below its power limit
    JAX_DEFAULT_MATMUL_PRECISION=highest KERAS_BACKEND=jax python benchmarks/gpu_overhead_blocks.py \
        --width 2048 --batch 1024 --rounds 6 --out results/gpu_overhead_blocks_jax_fp32.json
    KERAS_BACKEND=torch python benchmarks/gpu_overhead_blocks.py --batch 1024 --steps 800 --out results/...torch.json
    # torch with an A/A within 0.5% on an H200: two large GEMMs fed from the GPU, many short pairs
    KERAS_BACKEND=torch python benchmarks/gpu_overhead_blocks.py --width 8192 --layers 2 --batch 512 \
        --device-data --steps 1000 --block 50 --rounds 9 --out results/gpu_overhead_blocks_torch_gpu_bound.json
    # the per-step cost on the 2-core CPU, through Keras's own dispatch (RESULTS.md, issue 12)
    OMP_NUM_THREADS=1 KERAS_BACKEND=jax python benchmarks/gpu_overhead_blocks.py --width 32 --layers 1 \
        --batch 32 --steps 3000 --block 100 --epochs 3 --rounds 10 --dispatch keras --out results/...json
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

from _per_backend import CALLBACKS, callback_makers, keras_batch_end_on_training_thread, write_json


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=2, help="fits of each kind (A/B and A/A), alternating")
    p.add_argument("--epochs", type=int, default=3, help="per fit; the first is left out")
    p.add_argument("--steps", type=int, default=4000, help="steps per epoch")
    p.add_argument("--block", type=int, default=400)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument(
        "--device-data",
        action="store_true",
        help="torch: feed batches sliced from tensors already on the GPU (no host-to-device copy, which "
        "from NumPy makes every step wait for the previous one)",
    )
    p.add_argument(
        "--callbacks",
        default=",".join(CALLBACKS),
        help="comma-separated subset of the six to flip (to find which one a cost comes from); `Callback` is "
        "a keras.callbacks.Callback() that overrides nothing (six of them: what Keras's dispatch alone costs)",
    )
    p.add_argument(
        "--no-batch-end-thread",
        action="store_true",
        help="diagnostic: Keras runs the batch-end hooks on the training thread instead of its thread pool",
    )
    p.add_argument(
        "--dispatch",
        choices=("gate", "keras"),
        default="gate",
        help="gate: one callback holds the callbacks and forwards their hooks through a loop of its own; "
        "keras: the callbacks stay in fit()'s list, and *off* blocks take them out of Keras's own list",
    )
    args = p.parse_args()
    unknown = set(args.callbacks.split(",")) - set(CALLBACKS) - {"Callback"}
    if unknown:
        p.error(f"--callbacks: unknown {sorted(unknown)}; expected names from {', '.join(CALLBACKS)}, or Callback")
    return args


def _harnesses():
    """The two harnesses: ``gate`` (holds the callbacks, forwards their hooks) and ``keras`` (Keras's own list)."""
    import sys

    import keras

    from keras_gpu_tools import backends
    from keras_gpu_tools.runtime import keras_internals as ki

    class Blocks(keras.callbacks.Callback):
        """Times blocks of ``block`` steps; between blocks flips the callbacks' batch hooks and the step path."""

        async_safe = True  # as the callbacks it holds: Keras keeps its batch-end thread pool

        def __init__(self, inner, block: int, ab: bool):
            super().__init__()
            self.inner, self.block, self.ab = inner, block, ab
            self.sync = backends.get().sync
            self.last = None

        def on_train_begin(self, logs=None):
            self.wrapped = None  # read at the first step, once every callback has started

        def _start(self):
            # The model itself: on JAX, Keras's `Callback.model` writes the state back into
            # the variables (a sync) on each access; inside a step that corrupts the fit.
            self.m = self.model
            self.wrapped = ki.get_train_function(self.m)
            # Without a step hook (callbacks that only have batch hooks), only the hooks flip.
            self.keras_own = getattr(self.wrapped, "__wrapped__", self.wrapped)
            self.on, self.count, self.epoch, self.t = True, 0, 0, None
            self.blocks: list[tuple[int, bool, float]] = []  # (epoch, on, seconds per step)

        def on_train_end(self, logs=None):
            if self.wrapped is not None:
                ki.set_train_function(self.m, self.wrapped)
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
                    self.sync(self.last)  # the device has finished the block: its time, not the host's
                    self.blocks.append((self.epoch, self.on, (time.perf_counter() - self.t) / self.block))
                self.on = not self.on
                ki.set_train_function(self.m, self.wrapped if self.on and self.ab else self.keras_own)
                self.flip(self.on and self.ab)
                self.t = time.perf_counter()

        def flip(self, on: bool) -> None:
            """Turns the callbacks' batch hooks on or off."""

        def _keep_outputs_of_next_call(self):
            """The block's last call keeps its outputs for the sync (once a block; in every kind of block)."""
            fn = ki.get_train_function(self.m)

            def last_of_block(*args):
                ki.set_train_function(self.m, fn)
                self.last = fn(*args)
                return self.last

            ki.set_train_function(self.m, last_of_block)

    class Gate(Blocks):
        """Holds the callbacks and forwards every hook to them through a loop of its own (a little dearer than Keras's)."""

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

        Keras calls their batch hooks as it calls any callback's (its own loops, on
        its batch-end thread when that is on), so *on* minus *off* is what a user's
        fit pays per step. The list changes in place, from this callback's batch-begin
        hook, the first of each step: the step's other hooks already follow it. It is
        whole again before every epoch end: at the last step of each epoch, which is
        in no timed block.
        """

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            self.cbl = _fit_callback_list()
            self.full = list(self.cbl.callbacks)
            self.without = [cb for cb in self.full if not any(cb is i for i in self.inner)]
            if self.full[0] is not self:
                raise RuntimeError("the keras harness must come first in fit()'s callbacks")
            self.last_step = self.params["steps"] - 1

        def flip(self, on: bool) -> None:
            self.cbl.callbacks[:] = self.full if on else self.without  # in place: Keras's loop over it is at this one

        def on_train_batch_begin(self, batch, logs=None):
            super().on_train_batch_begin(batch, logs)
            if batch == self.last_step:
                self.flip(True)  # every callback sees the epoch end

    def _fit_callback_list():
        from keras.src.callbacks.callback_list import CallbackList

        frame = sys._getframe(2)
        while frame is not None:
            found = frame.f_locals.get("callbacks")
            if isinstance(found, CallbackList):
                return found
            frame = frame.f_back
        raise RuntimeError("fit()'s CallbackList not found (Keras internals changed?)")

    return {"gate": Gate, "keras": KerasList}


def _pairs(blocks) -> list[float]:
    """on/off ratios of adjacent blocks of the same epoch, epoch 0 left out (first block of a pair: either)."""
    out = []
    for (e1, on1, t1), (e2, on2, t2) in zip(blocks[::2], blocks[1::2]):
        if e1 == e2 and e1 > 0 and on1 != on2:
            out.append((t1 / t2) if on1 else (t2 / t1))
    return out


def _device_batches(x, y, batch: int):
    """A torch DataLoader of ``(x, y)`` batches sliced from copies of both on the first GPU: views, no copy."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: only to try the script

    class Slices(torch.utils.data.IterableDataset):
        def __init__(self):
            self.x, self.y = torch.as_tensor(x, device=device), torch.as_tensor(y, device=device)

        def __len__(self):
            return len(self.x) // batch

        def __iter__(self):
            for i in range(len(self)):
                yield self.x[i * batch : (i + 1) * batch], self.y[i * batch : (i + 1) * batch]

    return torch.utils.data.DataLoader(Slices(), batch_size=None)


def main():
    args = _parse()
    warnings.simplefilter("ignore")
    if args.no_batch_end_thread:
        keras_batch_end_on_training_thread()
    import keras
    import numpy as np

    from keras_gpu_tools import backends

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, 64)).astype("float32")
    y = rng.integers(0, 10, size=(args.batch * args.steps,)).astype("int32")
    tmp = tempfile.mkdtemp(prefix="kgt_gpu_blocks_")
    keras.utils.set_random_seed(0)
    layers = [keras.Input((64,))] + [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
    model = keras.Sequential(layers + [keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    Harness = _harnesses()[args.dispatch]

    def six():
        makers = {**callback_makers(tmp), "Callback": keras.callbacks.Callback}
        return [makers[name]() for name in args.callbacks.split(",")]

    if args.device_data and keras.backend.backend() != "torch":
        raise SystemExit("--device-data: torch only (JAX puts NumPy batches on the device asynchronously)")
    data = _device_batches(x, y, args.batch) if args.device_data else None

    def fit(epochs, callbacks, steps=None):
        if data is not None:
            return model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        n = len(x) if steps is None else steps * args.batch
        return model.fit(
            x[:n], y[:n], batch_size=args.batch, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks
        )

    fit(1, six(), steps=20)
    ratios: dict[str, list[float]] = {"ab": [], "aa": []}
    step_ms: dict[str, list[float]] = {"ab": [], "aa": []}
    blocks: dict[str, list] = {"ab": [], "aa": []}  # (on, ms per step) of every steady-state block, in order
    gpus = backends.get().gpu_devices()

    def summary(values):
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
            step_us = 1e3 * statistics.median(step_ms["ab"] + step_ms["aa"])
            out["added_us_per_step"] = {
                k: round((out[k] - 1) * step_us, 2) for k in ("mean", "median", "trimmed_mean_10pct")
            }
            out["standard_error_us"] = round(out["stdev"] / len(values) ** 0.5 * step_us, 2)
        return out

    def result() -> dict:
        return {
            "backend": keras.backend.backend(),
            "device": gpus[0] if gpus else "CPU",
            "keras": keras.__version__,
            "args": vars(args),
            "matmul_precision": os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"),
            "data": "torch tensors on the GPU" if data is not None else "NumPy arrays",
            "callbacks": args.callbacks.split(","),  # flipped ("all_six_on_over_off" is their on/off)
            "dispatch": args.dispatch,
            "off_step_ms_median": statistics.median(step_ms["ab"] + step_ms["aa"]),
            "all_six_on_over_off": summary(ratios["ab"]),
            "aa_off_over_off": summary(ratios["aa"]),
            "ratios": ratios,
            "blocks": blocks,
        }

    for r in range(args.rounds):
        for kind in ("ab", "aa") if r % 2 == 0 else ("aa", "ab"):
            inner = six()
            harness = Harness(inner, args.block, ab=kind == "ab")
            fit(args.epochs, [harness] if args.dispatch == "gate" else [harness, *inner])
            ratios[kind] += _pairs(harness.blocks)
            step_ms[kind] += [1e3 * t for e, on, t in harness.blocks if e > 0 and not on]
            blocks[kind] += [(on, round(1e3 * t, 5)) for e, on, t in harness.blocks if e > 0]
            print(
                kind,
                f"round {r}: {len(_pairs(harness.blocks))} pairs, mean ratio {statistics.mean(_pairs(harness.blocks)):.4f}",
            )
            write_json(args.out, result())  # after every fit: a run cut short keeps what it measured

    final = result()
    print("step (off)", round(final["off_step_ms_median"], 4), "ms")
    for key in ("all_six_on_over_off", "aa_off_over_off"):
        print(key, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in final[key].items()})


if __name__ == "__main__":
    main()
