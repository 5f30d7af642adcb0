"""Why torch's GPU blocks are noisy under Keras: its step runs the host and the device in series.

On one CUDA GPU, with no callback of this package:

- ``pure``: a plain torch loop (the same MLP, SGD, batches already on the GPU), timed in
  blocks of ``--block`` steps, each ended by a device sync;
- ``keras``: a bare Keras fit() of the same model from NumPy, timed the same way (a
  batch-end hook syncs every ``--block`` steps);
- ``keras_host``: the same fit at batch 32, where the device has almost nothing to do:
  Keras's host time per step;
- ``syncs``: the calls of one Keras epoch that synchronise the host with the device
  (``torch.cuda.set_sync_debug_mode("warn")``), counted by where Keras makes them.

Per kind: mean ms per step over the blocks, their standard deviation and that of the
ratio of adjacent blocks (what ``gpu_overhead_blocks.py`` pairs).

    KERAS_BACKEND=torch python benchmarks/torch_step_noise.py --out results/torch_step_noise.json
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
import traceback
import warnings

from _per_backend import write_json


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--batch", type=int, default=3200)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--block", type=int, default=100)
    return p.parse_args()


def _summary(ms: list[float]) -> dict:
    ratios = [a / b for a, b in zip(ms[::2], ms[1::2])]
    return {
        "blocks": len(ms),
        "mean_ms": round(statistics.mean(ms), 4),
        "sd_pct": round(100 * statistics.stdev(ms) / statistics.mean(ms), 3),
        "adjacent_ratio_sd_pct": round(100 * statistics.stdev(ratios), 3),
        "block_ms": [round(v, 4) for v in ms],
    }


def main() -> None:
    args = _parse()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras
    import numpy as np
    import torch

    if keras.backend.backend() != "torch" or not torch.cuda.is_available():
        raise SystemExit("needs KERAS_BACKEND=torch and a CUDA GPU")
    rng = np.random.default_rng(0)

    def pure() -> list[float]:
        torch.manual_seed(0)
        widths = [64] + [args.width] * args.layers
        layers = [m for a, b in zip(widths, widths[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())]
        net = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), 1e-4)
        loss_fn = torch.nn.CrossEntropyLoss()
        x = torch.randn(20 * args.batch, 64, device="cuda")
        y = torch.randint(0, 10, (20 * args.batch,), device="cuda")
        ms, t = [], None
        for i in range(args.steps):
            j = (i % 20) * args.batch
            opt.zero_grad()
            loss_fn(net(x[j : j + args.batch]), y[j : j + args.batch]).backward()
            opt.step()
            if (i + 1) % args.block == 0:
                torch.cuda.synchronize()
                now = time.perf_counter()
                if t is not None:
                    ms.append(1e3 * (now - t) / args.block)
                t = now
        return ms[2:]

    def keras_model():
        keras.utils.set_random_seed(0)
        dense = [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        model = keras.Sequential([keras.Input((64,)), *dense, keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def keras_fit(batch: int, steps: int) -> list[float]:
        model = keras_model()
        x = rng.normal(size=(batch * steps, 64)).astype("float32")
        y = rng.integers(0, 10, size=(batch * steps,)).astype("int32")
        model.fit(x[: 20 * batch], y[: 20 * batch], batch_size=batch, verbose=0)
        ms = []
        block = args.block

        class Clock(keras.callbacks.Callback):
            async_safe = True  # as the package's callbacks: Keras keeps its batch-end thread

            def on_train_batch_end(self, b, logs=None):
                if (b + 1) % block == 0:
                    torch.cuda.synchronize()
                    now = time.perf_counter()
                    if hasattr(self, "t"):
                        ms.append(1e3 * (now - self.t) / block)
                    self.t = now

        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[Clock()])
        return ms[2:]

    def syncs() -> list[dict]:
        model = keras_model()
        x = rng.normal(size=(320, 64)).astype("float32")
        y = rng.integers(0, 10, size=(320,)).astype("int32")
        model.fit(x, y, batch_size=32, verbose=0)
        seen: collections.Counter = collections.Counter()

        def record(message, category, filename, lineno, file=None, line=None):
            if "synchronizing" not in str(message):
                return
            frames = [f for f in traceback.extract_stack()[:-1] if "/keras/src/" in f.filename]
            where = " <- ".join(f"{f.filename.split('/keras/src/')[-1]}:{f.lineno} {f.name}" for f in frames[::-1][:4])
            seen[where] += 1

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return [{"per_epoch_of_10_steps": n, "where": w} for w, n in seen.most_common()]

    doc = {
        "what": __doc__.split("\n\n")[0],
        "versions": {"keras": keras.__version__, "torch": torch.__version__},
        "device": torch.cuda.get_device_name(0),
        "args": vars(args),
        "pure": _summary(pure()),
        "keras": _summary(keras_fit(args.batch, args.steps)),
        "keras_host": _summary(keras_fit(32, args.steps)),
        "syncs": syncs(),
    }
    for kind in ("pure", "keras", "keras_host"):
        s = doc[kind]
        print(
            f"{kind:10s} {s['mean_ms']:8.3f} ms a step, block sd {s['sd_pct']:.2f}%, adjacent sd {s['adjacent_ratio_sd_pct']:.2f}%"
        )
    for s in doc["syncs"]:
        print(f"  {s['per_epoch_of_10_steps']:3d} x {s['where']}")
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
