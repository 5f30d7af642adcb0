"""Host time each callback adds per training step, against a bare fit(), on every backend.

A tiny model (16 -> 32 -> 3, batch 32) trains on in-memory arrays, so the step is
dominated by Keras's own per-step host work (100-400 us on a CPU) and anything a
callback adds per step shows.

Method. One model per backend serves every condition (bare, a second bare fit as
the A/A, each callback alone, all of them together, all but the reducer): each condition keeps its
own callback objects, but they all train the same compiled model, so nothing
differs between conditions but the callbacks. (With one model per condition, two
bare fits differed by up to 13 us per step on the 2-core machine: the models'
memory placement, not any callback.) After a warm-up fit per condition,
``--rounds`` rounds run every condition once each, in a fresh random order
every round (a fixed rotation keeps the same neighbours: a condition that
follows the one that stops six callbacks' threads was always the bare fit),
two epochs per fit; the steps of the second epoch are timed (wall time / steps,
and the training thread's CPU time / steps), from after every callback's
``on_epoch_begin`` to before any ``on_epoch_end``: per-step cost. The epoch hooks,
once an epoch, are timed apart and reported in ms (``median_epoch_hooks_ms``). Per condition two figures against
the bare fit: the fastest round minus the bare fit's fastest (the issue's
statistic), and the median over rounds of the difference to the bare fit of the
same round (paired: robust to the machine's slow phases, which hit both).

    python benchmarks/host_overhead.py --backends tensorflow,jax,torch --out results/host_overhead_cpu.json

Diagnostics (``--conditions``): ``idle_callback`` (a callback of the package's base
that does nothing), ``sleeping_thread`` and ``sleeping_threads_3`` (the same, keeping
one or three Python threads blocked in ``Event.wait()`` during the fit): what a
thread that never runs costs the training thread. ``all_unhooked``: all six, with
Keras's own train function put back once every ``on_train_begin`` has run, so the
package's step path (step hook, reducer, detector's timed calls) is off and all else
stays (threads, event writers, epoch hooks, Keras's dispatch of the batch hooks):
``all`` minus ``all_unhooked`` is the step path, ``all_unhooked`` the rest.

``--batch-end-workers N``: Keras's pool for batch-end hooks with N threads instead of
its default (the CPU count + 4): how much of a cost is the pool's threads contending
for the interpreter lock. ``--windows PATH``: each timed epoch's bounds on
CLOCK_MONOTONIC, for ``host_profile.py``, which says where the time goes.

With each figure, the training thread's context switches per timed step (Linux:
``/proc/thread-self/status``), voluntary (it blocked: the GIL, a lock, the device)
and involuntary (the scheduler took its core): where the time of a thread-bound
cost goes on a machine with few cores.

Prints a table (us per step) and writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import threading
import time

from _per_backend import (
    callback_makers,
    keras_batch_end_on_training_thread,
    keras_batch_end_workers,
    run_per_backend,
    write_json,
)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--backends", default=None, help="comma-separated; each runs in a subprocess")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--steps", type=int, default=1500, help="steps per epoch")
    p.add_argument(
        "--conditions",
        default=None,
        help="comma-separated subset of the conditions, or of the diagnostics "
        "(idle_callback, sleeping_thread, sleeping_threads_3, all_unhooked)",
    )
    p.add_argument("--width", type=int, default=32, help="hidden width (a wider model has a longer step)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="framework compute threads (fewer: less noise)")
    p.add_argument(
        "--no-batch-end-thread",
        action="store_true",
        help="diagnostic: Keras runs the batch-end hooks on the training thread instead of its thread pool",
    )
    p.add_argument(
        "--batch-end-workers",
        type=int,
        default=None,
        help="diagnostic: threads in Keras's pool for batch-end hooks (its default: the CPU count + 4)",
    )
    p.add_argument(
        "--windows",
        default=None,
        help="writes each timed epoch's (condition, training thread id, CLOCK_MONOTONIC begin, end) "
        "as JSON here, for host_profile.py (one backend, no --backends)",
    )
    args = p.parse_args()
    known = (*CONDITIONS, *DIAGNOSTICS, UNHOOKED)
    unknown = set(args.conditions.split(",")) - set(known) if args.conditions else set()
    if unknown:
        p.error(f"--conditions: unknown {sorted(unknown)}; expected names from {', '.join(known)}")
    if args.batch_end_workers is not None and (args.batch_end_workers < 1 or args.no_batch_end_thread):
        p.error(f"--batch-end-workers: got {args.batch_end_workers}; expected 1 or more, without --no-batch-end-thread")
    if args.windows and args.backends:
        p.error("--windows: needs one backend in this process (KERAS_BACKEND), not --backends")
    return args


CONDITIONS = (
    "bare",
    "bare_again",
    "GPUUtilizationLogger",
    "ProfilerWindow",
    "InputBoundDetector",
    "OOMBatchSizeReducer",
    "LiveView",
    "MixedPrecisionCheck",
    "all",
    "all_but_reducer",
)
# Diagnostics, not in the default run: a do-nothing callback of the package's base, and the same
# with one or three Python threads blocked in Event.wait() for the whole fit (they never run).
DIAGNOSTICS = {"idle_callback": 0, "sleeping_thread": 1, "sleeping_threads_3": 3}  # name -> threads
UNHOOKED = "all_unhooked"  # all six, the package's step path off (module docstring)


def _sleepers(threads: int):
    """A do-nothing callback (the package's base) that keeps ``threads`` threads blocked in Event.wait() during fit()."""
    import threading

    from keras_gpu_tools.callbacks._lean import LeanCallback

    class Sleepers(LeanCallback):
        def on_train_begin(self, logs=None):
            self.wake = threading.Event()
            self.threads = [threading.Thread(target=self.wake.wait, daemon=True) for _ in range(threads)]
            for t in self.threads:
                t.start()

        def on_train_end(self, logs=None):
            self.wake.set()
            for t in self.threads:
                t.join()

    return Sleepers()


def _unhook():
    """Last in the list: puts Keras's own train function back for the fit (the six keep everything else).

    The swap of ``step_path_overhead.py`` and ``gpu_overhead_blocks.py``, for a whole fit.
    """
    import keras

    from keras_gpu_tools.runtime import keras_internals as ki

    class Unhook(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.wrapped = ki.get_train_function(self.model)
            keras_own = getattr(self.wrapped, "__wrapped__", None)
            if keras_own is None:
                raise RuntimeError("all_unhooked: no callback attached the step hook; nothing to put back")
            ki.set_train_function(self.model, keras_own)

        def on_train_end(self, logs=None):
            ki.set_train_function(self.model, self.wrapped)  # so the hook's own teardown finds itself

    return Unhook()


def _switches() -> tuple[int, int] | None:
    """This thread's (voluntary, involuntary) context switches so far; None off Linux."""
    try:
        with open("/proc/thread-self/status") as f:
            found = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
        return int(found["voluntary_ctxt_switches"]), int(found["nonvoluntary_ctxt_switches"])
    except (OSError, KeyError, ValueError):
        return None


def _callbacks(name: str, log_dir: str) -> list:
    if name in DIAGNOSTICS:
        return [_sleepers(DIAGNOSTICS[name])]
    makers = callback_makers(log_dir)
    if name == UNHOOKED:
        return [make() for make in makers.values()] + [_unhook()]
    if name in ("bare", "bare_again"):  # bare_again: an A/A, the noise floor of the method
        return []
    if name == "all":
        return [make() for make in makers.values()]
    if name == "all_but_reducer":  # the five that watch: TF's idle reducer step is faster than Keras's
        return [make() for key, make in makers.items() if key != "OOMBatchSizeReducer"]
    return [makers[name]()]


def run_backend(args) -> dict:
    import warnings

    import keras
    import numpy as np

    warnings.simplefilter("ignore")
    if args.no_batch_end_thread:
        keras_batch_end_on_training_thread()
    if args.batch_end_workers:
        keras_batch_end_workers(args.batch_end_workers)
    if keras.backend.backend() == "torch":  # its CPU kernels spin in a thread pool: noise in the timings
        import torch

        torch.set_num_threads(args.threads)

    class EpochClock:
        """Times the steps of each epoch apart from the callbacks' epoch hooks.

        ``first`` goes first in the callback list and ``last`` last: the steps run
        from ``last.on_epoch_begin`` (every other callback's epoch begin is done)
        to ``first.on_epoch_end`` (Keras has waited for the last step's batch-end
        hooks; no other callback's epoch end has run). What the callbacks do once
        an epoch is timed apart (``hooks``): per-epoch work, not per-step.
        Epoch hooks only, so the clock adds nothing per step.
        """

        def __init__(self):
            self.seconds, self.cpu_seconds, self.hook_seconds, self.switches = [], [], [], []
            self.monotonic = []  # (begin, end) of each epoch's steps, on CLOCK_MONOTONIC (perf's -k mono)
            clock = self

            class First(keras.callbacks.Callback):
                def on_epoch_begin(self, epoch, logs=None):
                    clock._t0 = time.perf_counter()

                def on_epoch_end(self, epoch, logs=None):
                    clock._t2, clock._c2 = time.perf_counter(), time.thread_time()
                    clock._s2 = _switches()
                    clock._m2 = time.clock_gettime(time.CLOCK_MONOTONIC)
                    clock._t2_read = time.perf_counter()  # the reads above are not a callback's epoch hook

            class Last(keras.callbacks.Callback):
                def on_epoch_begin(self, epoch, logs=None):
                    t = time.perf_counter()
                    clock._s1 = _switches()
                    clock._m1 = time.clock_gettime(time.CLOCK_MONOTONIC)
                    clock._t0 += time.perf_counter() - t  # the reads are not a callback's epoch hook
                    clock._t1, clock._c1 = time.perf_counter(), time.thread_time()

                def on_epoch_end(self, epoch, logs=None):
                    t3 = time.perf_counter()
                    clock.seconds.append(clock._t2 - clock._t1)
                    clock.cpu_seconds.append(clock._c2 - clock._c1)
                    clock.hook_seconds.append((clock._t1 - clock._t0) + (t3 - clock._t2_read))
                    s1, s2 = clock._s1, clock._s2
                    clock.switches.append(None if s1 is None or s2 is None else (s2[0] - s1[0], s2[1] - s1[1]))
                    clock.monotonic.append((clock._m1, clock._m2))

            self.first, self.last = First(), Last()

    rng = np.random.default_rng(0)
    batch = args.batch
    x = rng.normal(size=(args.steps * batch, 16)).astype("float32")
    y = rng.integers(0, 3, size=(args.steps * batch,)).astype("int32")
    conditions = args.conditions.split(",") if args.conditions else list(CONDITIONS)
    import tempfile

    tmp = tempfile.mkdtemp(prefix="kgt_host_overhead_")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(args.width, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    setups = {}
    for name in conditions:
        cbs = _callbacks(name, os.path.join(tmp, name))
        model.fit(x[: 20 * batch], y[: 20 * batch], batch_size=batch, epochs=1, verbose=0, callbacks=cbs)  # warm up
        setups[name] = cbs
    per_step = {name: [] for name in conditions}
    cpu_per_step = {name: [] for name in conditions}
    hooks_ms = {name: [] for name in conditions}
    switches = {name: [] for name in conditions}
    windows = []
    order = random.Random(0)
    for _ in range(args.rounds):
        for name in order.sample(conditions, len(conditions)):
            clock = EpochClock()
            cbs = [clock.first, *setups[name], clock.last]
            model.fit(x, y, batch_size=batch, epochs=2, verbose=0, shuffle=False, callbacks=cbs)
            per_step[name].append(1e6 * clock.seconds[1] / args.steps)
            cpu_per_step[name].append(1e6 * clock.cpu_seconds[1] / args.steps)
            hooks_ms[name].append(1e3 * clock.hook_seconds[1])
            switches[name].append(clock.switches[1])
            windows.append([name, threading.get_native_id(), *clock.monotonic[1]])
    if args.windows:
        write_json(args.windows, {"steps": args.steps, "windows": windows})

    def paired(series, name):
        if "bare" not in series:
            return None
        return round(statistics.median(a - b for a, b in zip(series[name], series["bare"])), 2)

    bare = min(per_step["bare"]) if "bare" in per_step else None
    bare_cpu = min(cpu_per_step["bare"]) if "bare" in cpu_per_step else None
    rows = []
    for name in conditions:
        best = min(per_step[name])
        rows.append(
            {
                "condition": name,
                "fastest_us_per_step": round(best, 2),
                "added_us_per_step": round(best - bare, 2) if bare is not None else None,
                "paired_median_added_us_per_step": paired(per_step, name),
                "rounds_us_per_step": [round(v, 2) for v in per_step[name]],
                # CPU time of the training thread alone: what this process's Python does per
                # step, nearly blind to other processes competing for the cores.
                "fastest_thread_cpu_us_per_step": round(min(cpu_per_step[name]), 2),
                "added_thread_cpu_us_per_step": (
                    round(min(cpu_per_step[name]) - bare_cpu, 2) if bare_cpu is not None else None
                ),
                "paired_median_added_thread_cpu_us_per_step": paired(cpu_per_step, name),
                "rounds_thread_cpu_us_per_step": [round(v, 2) for v in cpu_per_step[name]],
                # Every callback's on_epoch_begin + on_epoch_end (wall), once an epoch.
                "median_epoch_hooks_ms": round(statistics.median(hooks_ms[name]), 3),
                # The training thread's context switches per timed step, median over rounds.
                "switches_per_step": _per_step_switches(switches[name], args.steps),
            }
        )
    return {"backend": keras.backend.backend(), "width": args.width, "batch": batch, "steps": args.steps, "rows": rows}


def _per_step_switches(rounds: list, steps: int) -> dict | None:
    if not rounds or any(r is None for r in rounds):
        return None
    return {
        "voluntary": round(statistics.median(v for v, _ in rounds) / steps, 3),
        "involuntary": round(statistics.median(i for _, i in rounds) / steps, 3),
    }


def _versions() -> dict:
    out = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    for mod in ("keras", "tensorflow", "jax", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    return out


def _fmt_switches(sw: dict | None) -> str:
    return "" if sw is None else f" | switches/step {sw['voluntary']:.2f} vol {sw['involuntary']:.2f} invol"


def main():
    args = _parse()
    if args.backends:
        argv = ["--rounds", str(args.rounds), "--steps", str(args.steps), "--width", str(args.width)]
        argv += ["--batch", str(args.batch), "--threads", str(args.threads)]
        argv += ["--no-batch-end-thread"] if args.no_batch_end_thread else []
        argv += ["--batch-end-workers", str(args.batch_end_workers)] if args.batch_end_workers else []
        argv += ["--conditions", args.conditions] if args.conditions else []
        results = run_per_backend(__file__, args.backends, argv)
    else:
        results = [run_backend(args)]
    doc = {"what": "host us per step added to a bare fit (fastest of interleaved rounds)", "versions": _versions()}
    doc["keras_batch_end_thread"] = not args.no_batch_end_thread
    doc["keras_batch_end_workers"] = args.batch_end_workers or "Keras's default"
    doc["results"] = results
    for r in results:
        if "error" in r:
            print(f"{r['backend']}: failed\n{r['error']}")
            continue
        print(
            f"\n{r['backend']}  (us per step over {args.rounds} rounds: fastest, added by the fastest,"
            " added by the paired median; wall | training-thread CPU)"
        )
        for row in r["rows"]:

            def fmt(v):
                return "" if v is None else f"{v:+7.1f}"

            print(
                f"  {row['condition']:22s} {row['fastest_us_per_step']:8.1f} {fmt(row['added_us_per_step'])}"
                f" {fmt(row['paired_median_added_us_per_step'])}   | {row['fastest_thread_cpu_us_per_step']:8.1f}"
                f" {fmt(row['added_thread_cpu_us_per_step'])} {fmt(row['paired_median_added_thread_cpu_us_per_step'])}"
                f"   | epoch hooks {row['median_epoch_hooks_ms']:.2f} ms{_fmt_switches(row['switches_per_step'])}"
            )
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
