"""Overhead of LiveView: training time per step with and without it, in a real Jupyter kernel.

What LiveView costs the training thread: one clock read per step, and a redraw
(an HTML table with SVG sparklines, sent to the notebook) every `interval`
seconds. This measures both ways:

1. In a real Jupyter kernel (ipykernel, driven by nbclient, as a notebook
   would be): fits with and without `LiveView()` (its default 2 s interval, and
   a stress setting of 0.1 s), interleaved off/on/off/on on one compiled model
   so drift hits both alike; the ratio of median step times is reported. The
   GPUUtilizationLogger and InputBoundDetector run in every fit, so the view
   has something to draw.
2. Directly: the time LiveView itself spent per redraw (`redraw_seconds /
   redraws`, measured around the drawing and the display call) and per step
   (its batch-end hook called in a tight loop).

    python benchmarks/live_view_overhead.py              # CPU-sized (about 1 minute)
    python benchmarks/live_view_overhead.py --gpu        # bigger model, more steps

Results on the 2-core CPU development machine (TensorFlow 2.21 CPU, Keras
3.15.1, ipykernel 7.4, nbclient 0.11; 2,000-step fits of a 64-wide MLP at about
1.5 ms per step; the machine was shared with other jobs, so single fits vary
by up to 40%):

| | run 1 (6 repeats) | run 2 (6) | run 3 (10) |
|---|---|---|---|
| median step, no LiveView | 1.600 ms | 1.602 ms | 1.561 ms |
| LiveView() (2 s) | +0.9% | -4.2% | -4.1% |
| LiveView(interval=0.1) | +5.6% | +18.5% | +65.9% |
| draw + send one update | 2.8 ms | 3.1 ms | 2.1 ms |
| draw alone | - | 0.18 ms | 0.30 ms |
| batch-end hook, no redraw | 0.09 us | 0.12 us | 0.11 us |

At the default 2 s interval the cost is within the noise of the measurement;
from the direct timings it is 2-3 ms per 2 s, about 0.15%. Redrawing ten
times a second is not free on 2 cores: the notebook client handling the
updates competes with training for the CPU. Keep `interval` at 1 s or more.
"""

import argparse
import json
import os
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNEL_CODE = """
import json, os, statistics, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
import keras, numpy as np
from keras_gpu_tools import GPUUtilizationLogger
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.live_view import LiveView

a = {args!r}
rng = np.random.default_rng(0)
x = rng.normal(size=(a["batch"] * a["steps"], a["width"])).astype("float32")
y = rng.integers(0, 10, size=a["batch"] * a["steps"])
model = keras.Sequential([keras.Input((a["width"],))] + [keras.layers.Dense(a["width"], activation="relu") for _ in range(a["depth"])] + [keras.layers.Dense(10)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x[: a["batch"] * 50], y[: a["batch"] * 50], batch_size=a["batch"], verbose=0)  # compile

def run(view):
    cbs = [GPUUtilizationLogger(log_dir=None), InputBoundDetector(log_dir=None, verbose=0)]
    if view is not None:
        cbs.append(view)
    t = time.perf_counter()
    model.fit(x, y, batch_size=a["batch"], epochs=1, verbose=0, callbacks=cbs)
    return (time.perf_counter() - t) / a["steps"]

out = {{"off": [], "on": [], "stress": [], "redraw_ms_on": [], "redraw_ms_stress": [], "redraws_on": [],
        "redraws_stress": [], "in_notebook": None}}
for r in range(a["repeats"]):
    for mode in ("off", "on", "stress"):
        view = None if mode == "off" else LiveView(interval=2.0 if mode == "on" else 0.1)
        out[mode].append(run(view))
        if view is not None:
            out["in_notebook"] = view.redraws > 0
            out["redraws_" + mode].append(view.redraws)
            if view.redraws:
                out["redraw_ms_" + mode].append(1e3 * view.redraw_seconds / view.redraws)
            last_view = view

# Drawing alone (the HTML of the last fit's view, no sending).
from keras_gpu_tools.live.render import render
t = time.perf_counter()
for i in range(200):
    render(last_view._state, time.monotonic())
out["render_ms"] = 1e3 * (time.perf_counter() - t) / 200

# The per-step hook alone, in a tight loop (no redraw falls in it).
view = LiveView(interval=1e9, display=lambda html: None)
view._active = True
logs = {{"loss": 0.1}}
n = 200_000
t = time.perf_counter()
for i in range(n):
    view.on_train_batch_end(i, logs)
out["hook_us"] = 1e6 * (time.perf_counter() - t) / n
print("RESULT " + json.dumps(out))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=2000, help="steps per timed fit")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--gpu", action="store_true", help="a bigger model and more steps (GPU machine)")
    p.add_argument("--out", default=None, help="write the raw figures as JSON here")
    a = p.parse_args()
    if a.gpu:
        a.width, a.depth, a.batch, a.steps = 2048, 4, 1024, 5000

    import nbformat
    from nbclient import NotebookClient

    code = KERNEL_CODE.format(
        root=ROOT, args={k: getattr(a, k) for k in ("width", "depth", "batch", "steps", "repeats")}
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(code))])
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=3600, kernel_name="python3").execute()
    wall = time.perf_counter() - t0
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])

    import statistics

    med = {k: statistics.median(r[k]) for k in ("off", "on", "stress")}
    print(
        f"Jupyter kernel; live view displayed: {r['in_notebook']}; {a.repeats} x {a.steps} steps per setting ({wall:.0f} s)"
    )
    print(f"  median step without LiveView:        {1e3 * med['off']:.3f} ms")
    for k, label in (("on", "LiveView() (2 s interval)"), ("stress", "LiveView(interval=0.1)")):
        print(f"  median step with {label:26s} {1e3 * med[k]:.3f} ms  ({100 * (med[k] / med['off'] - 1):+.2f}%)")
    pairs = [100 * (on / off - 1) for off, on in zip(r["off"], r["on"])]
    print(f"  per-pair difference (2 s interval):  {', '.join(f'{d:+.1f}%' for d in pairs)}")
    for k in ("on", "stress"):
        print(
            f"  redraws per fit ({k}): {statistics.median(r['redraws_' + k]):.0f}; draw + send to the notebook "
            f"{statistics.median(r['redraw_ms_' + k]):.2f} ms median (worst fit mean {max(r['redraw_ms_' + k]):.2f} ms)"
        )
    print(f"  drawing alone (HTML + SVG):          {r['render_ms']:.3f} ms")
    print(f"  batch-end hook without a redraw:     {r['hook_us']:.2f} us per step")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "raw": r}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
