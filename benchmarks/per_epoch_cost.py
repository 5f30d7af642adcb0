"""Per-epoch cost of the package's callbacks: their epoch hooks early against late in a long fit, with an A/A and a control beside.

What it measures: the time each callback's `on_epoch_begin` and `on_epoch_end` take together (its
per-epoch cost), early in a long fit and late in it. A callback that keeps per-epoch state it
rescans, or rebuilds a summary from the whole history, costs more with every epoch; the goal is
that the last epochs (of 3,000 by default) cost within 10% of the early ones.

How:

- A real `model.fit` of a tiny model (a Dense layer of 8 units) on 8 samples of one batch: one
  step per epoch, `--epochs` epochs, every callback of `--callbacks` in it (all seven by default,
  writing event files to a temporary log dir; `LiveView` on, drawing into nothing). Each
  callback's epoch hooks are wrapped with `time.perf_counter`; "all" is their sum per epoch.
- *early* is the median over the `--window` epochs from epoch 10 on (epochs 0-9, compilation, the
  first writes and the warm-up, are left out), *late* the median over the last `--window` epochs,
  each then the median over the rounds (`rounds_ms` keeps every round's); the A/B is
  `late / early` per callback. The window is wide (100 epochs by default): medians of
  15 epochs take single slow epochs in; a shared machine's load still moves a whole round (the A/A
  and the control show it), which the control's `late / early` tells apart from a callback's growth.
- The controls, timed the same way beside the others (not in "all"): a callback whose epoch hooks
  do nothing (the wrapping alone) and one whose epoch end does the same pure-Python work every
  epoch, about as much as a callback's (the fixed-work control). The fixed-work control's
  `late / early` is how much slower the process runs the same work late in the fit: on a shared
  machine it can move by tens of percent between fits of one command, with or without the
  package's callbacks, far more than the 10% the goal is about (decision record 0013).
- Paced: in every epoch, each callback's time over the fixed-work control's in that same epoch
  (microseconds apart, so at the same pace of the machine); `paced_late_over_early` is the median
  of that ratio late over its median early. A callback whose own work grows shows in it as in the
  raw `late / early`; the machine's pace, which moves both alike, cancels.
  `vs_control` is each callback's raw `late / early` over the no-op control's.
- The calls: one more fit, untimed (not with `--job`), counts the Python and C calls each
  callback's epoch hooks make on the training thread (`sys.setprofile`); `calls_early` and
  `calls_late` are their means over the same windows. A count does not move with the machine's
  load: it tells a hook whose work grows with the epochs from a process that runs slower late.
  (A NumPy call over a growing array is one call: the timings still watch for that.)
- The cost goal: "all" (every epoch hook of the seven together) at most 1 ms an epoch, early and late.
- `--job` (JAX only): the same fit in a job of 2 processes on this machine's CPU (over gloo, as
  `tests/distributed/launch.py` starts them), data-parallel, so the detector's and logger's
  epoch ends exchange their figures; process 0's times are reported.

Output, per callback, for "all" and for the controls: `early_ms`, `late_ms`, `late_over_early`,
`paced_late_over_early`, `vs_control`, the A/A's `aa_early` and `aa_late`, each round's ratios,
and `calls_early` and `calls_late`. `--callbacks none` times the controls alone (the process's
own pace, without the package).

Goals (a full run exits non-zero and names the callbacks that miss one): `paced_late_over_early` at
most 1.1 for "all" and for every callback whose late cost is at least 0.01 ms (below that the
clock and a shared machine move a ratio by more than 10%, and a growth of a few microseconds an
epoch is not what the goal is about); `calls_late` at most 1.05 times `calls_early` plus one, for
every callback and "all"; "all" at most 1 ms an epoch, early and late (not with `--job`, whose
epoch ends wait for the other process). The raw `late / early` is printed and kept beside the
paced one. A smoke run (50 epochs, a window of 20) checks that every callback and the controls
were timed in every round and every time is finite and positive, and prints the goals unenforced.

    python benchmarks/per_epoch_cost.py --backend tensorflow             # 3,000 epochs x 2 rounds
    python benchmarks/per_epoch_cost.py --backend jax --job --epochs 1000
    python benchmarks/per_epoch_cost.py --backend jax --callbacks none   # the controls alone
    python benchmarks/per_epoch_cost.py --smoke                          # CPU check, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common
from _common import CALLBACKS as PER_STEP_CALLBACKS

# The six of every benchmark, and the one that works at epoch ends only.
CALLBACKS = (*PER_STEP_CALLBACKS, "MemoryLeakDetector")

BENCHMARK = "per_epoch_cost"
EARLY = 10  # the first epoch of the early window: the ones before are compilation, first writes, warm-up
WINDOW = 100  # epochs per median: single slow epochs of a shared machine left out (15 took them in)
SMOKE_WINDOW = 20
CONTROL = "control (no-op)"  # a callback whose epoch hooks do nothing: the process-wide drift
WORK = "control (fixed work)"  # a callback doing the same Python work every epoch: the process's own pace
CONTROLS = (CONTROL, WORK)
GOAL = 1.10  # late / early at most
GOAL_FLOOR_MS = 0.01  # late costs below this are left out of the late / early goal: a ratio of noise
CALLS_GOAL = 1.05  # mean calls an epoch late over early, at most (plus one)
GOAL_ALL_MS = 1.0  # every epoch hook of all the callbacks together, an epoch, at most (on a GPU machine)


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3000, help="epochs per fit (one step each)")
    p.add_argument("--rounds", type=int, default=2, help="identical fits; round 2 over round 1 is the A/A")
    p.add_argument(
        "--window", type=int, default=WINDOW, help=f"epochs per median (from epoch {EARLY} on; the last ones)"
    )
    p.add_argument(
        "--callbacks",
        default=",".join(CALLBACKS),
        help="comma-separated subset of the seven, or none (the controls alone)",
    )
    p.add_argument("--job", action="store_true", help="JAX: a job of 2 processes on the CPU (gloo)")
    p.add_argument("--worker", nargs=3, metavar=("INDEX", "PORT", "DIR"), help=argparse.SUPPRESS)
    return p


def _fixed_work_callback():
    """A callback whose epoch end does the same pure-Python work every epoch, about what a callback's takes.

    Its ``late / early`` is how much slower the process runs the same work late in the fit (the
    allocator, the garbage collector, caches, the machine's clock and load), at the scale of the
    callbacks' own work, where the no-op control times the wrapping alone.
    """
    import keras

    class FixedWork(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            figures = {f"figure_{i}": float(i) * 1.5 for i in range(48)}
            lines = [f"{k}: {v:.4g}" for k, v in figures.items()]
            self.last = (sum(figures.values()), len("".join(lines)))

    return FixedWork()


def _timed(cb, name: str, times: dict[str, list[float]]) -> None:
    """Wraps ``cb``'s epoch hooks: each epoch's begin and end time together, appended to ``times[name]``."""
    begin, end = cb.on_epoch_begin, cb.on_epoch_end
    spent = [0.0]

    def on_epoch_begin(epoch, logs=None):
        t0 = time.perf_counter()
        try:
            return begin(epoch, logs)
        finally:
            spent[0] = time.perf_counter() - t0

    def on_epoch_end(epoch, logs=None):
        t0 = time.perf_counter()
        try:
            return end(epoch, logs)
        finally:
            times[name].append(spent[0] + time.perf_counter() - t0)

    cb.on_epoch_begin, cb.on_epoch_end = on_epoch_begin, on_epoch_end


def _counted(cb, name: str, calls: dict[str, list[float]]) -> None:
    """Wraps ``cb``'s epoch hooks: the Python and C calls each epoch's begin and end make on this thread, together.

    A count does not move with the machine's load or speed: a hook whose work grows with the epochs
    makes more calls late (a loop over a history, a rebuilt summary), whatever the clock says.
    """
    begin, end = cb.on_epoch_begin, cb.on_epoch_end
    made = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            made[0] += 1

    def wrap(hook, last: bool):
        def inner(epoch, logs=None):
            if not last:
                made[0] = 0
            sys.setprofile(count)
            try:
                return hook(epoch, logs)
            finally:
                sys.setprofile(None)
                if last:
                    calls[name].append(float(made[0]))

        return inner

    cb.on_epoch_begin, cb.on_epoch_end = wrap(begin, False), wrap(end, True)


def _fit(names: list[str], epochs: int, log_dir: str, job: bool = False, count: bool = False) -> dict[str, list[float]]:
    """One fit of ``epochs`` one-step epochs with the callbacks ``names``; each one's per-epoch seconds (calls)."""
    import keras
    import numpy as np

    import keras_gpu_tools as kgt

    makers = _common.callback_makers(log_dir)
    makers["LiveView"] = lambda: kgt.LiveView(enabled=True, display=lambda html: None)  # drawn every epoch end
    makers["MemoryLeakDetector"] = lambda: kgt.MemoryLeakDetector(log_dir=log_dir, verbose=0)
    makers[CONTROL] = keras.callbacks.Callback  # its epoch hooks do nothing: what is timed is the wrapping alone
    makers[WORK] = _fixed_work_callback
    times: dict[str, list[float]] = {n: [] for n in [*names, *CONTROLS]}
    cbs = []
    for n in [*names, *CONTROLS]:
        cb = makers[n]()
        (_counted if count else _timed)(cb, n, times)
        cbs.append(cb)
    if job:
        import jax

        dist = keras.distribution.DataParallel(devices=jax.devices())
        dist.auto_shard_dataset = False
        keras.distribution.set_distribution(dist)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 4), dtype="float32"), rng.random((8, 1), dtype="float32")
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=cbs)
    for cb in cbs:
        close = getattr(cb, "close", None)
        if close is not None:
            close()
    return times


def _medians(times: dict[str, list[float]], window: int) -> dict[str, tuple[float, float, float, float]]:
    """Per callback, for "all" (the sum per epoch, the controls left out) and the controls: (early, late) medians
    in ms, then (early, late) medians of its time over the fixed-work control's in the same epoch (paced)."""
    own = [t for n, t in times.items() if n not in CONTROLS]
    per_epoch = {**times, "all": [sum(t) for t in zip(*own)]} if own else times
    work = times[WORK]

    def paced(t: list[float], part: slice) -> float:
        return statistics.median(a / w for a, w in zip(t[part], work[part]) if w > 0)

    early, late = slice(EARLY, EARLY + window), slice(len(work) - window, len(work))
    return {
        n: (
            1e3 * statistics.median(t[early]),
            1e3 * statistics.median(t[late]),
            paced(t, early),
            paced(t, late),
        )
        for n, t in per_epoch.items()
    }


def _means(calls: dict[str, list[float]], window: int) -> dict[str, tuple[float, float]]:
    """(early, late) mean calls an epoch, per callback, for "all" and the controls (windows as :func:`_medians`)."""
    own = [c for n, c in calls.items() if n not in CONTROLS]
    per_epoch = {**calls, "all": [sum(c) for c in zip(*own)]} if own else calls
    return {n: (statistics.mean(c[EARLY : EARLY + window]), statistics.mean(c[-window:])) for n, c in per_epoch.items()}


def _job_round(args, names: list[str], log_dir: str) -> dict[str, list[float]]:
    """One fit in a job of 2 JAX processes (this script with --worker); process 0's times."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    out = Path(log_dir)
    procs = []
    for i in range(2):
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
        cmd = [
            sys.executable,
            __file__,
            "--backend",
            "jax",
            "--epochs",
            str(args.epochs),
            "--callbacks",
            args.callbacks,
        ]
        cmd += ["--worker", str(i), str(port), str(out)]
        procs.append(subprocess.Popen(cmd, env=env))
    for p in procs:
        if p.wait(timeout=3600):
            raise SystemExit(f"a process of the job exited with {p.returncode}")
    return json.loads((out / "times_0.json").read_text())


def _worker(args, names: list[str]) -> int:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras

    index, port, out = int(args.worker[0]), args.worker[1], Path(args.worker[2])
    keras.distribution.initialize(job_addresses=f"localhost:{port}", num_processes=2, process_id=index)
    times = _fit(names, args.epochs, str(out / "logs"), job=True)
    (out / f"times_{index}.json").write_text(json.dumps(times))
    return 0


def main() -> int:
    args = _parse().parse_args()
    if args.smoke:
        args.epochs, args.rounds, args.window = min(args.epochs, 50), 2, min(args.window, SMOKE_WINDOW)
    if args.job:
        args.backend = "jax"
    backend = _common.setup(args)
    names = [n for n in args.callbacks.split(",") if n and n != "none"]  # none: the controls alone
    unknown = set(names) - set(CALLBACKS)
    if unknown or not (names or args.callbacks == "none"):
        raise SystemExit(f"--callbacks: unknown {sorted(unknown)}; expected some of {', '.join(CALLBACKS)}, or none")
    if args.worker:
        return _worker(args, names)
    if args.epochs < EARLY + 2 * args.window:
        raise SystemExit(f"--epochs {args.epochs}: at least {EARLY + 2 * args.window} (--window {args.window})")
    import warnings

    warnings.simplefilter("ignore")  # the logger's "no GPU" and the like: once per fit, not what is measured
    rounds = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kgt_epoch_") as log_dir:
            t0 = time.perf_counter()
            times = _job_round(args, names, log_dir) if args.job else _fit(names, args.epochs, log_dir)
            print(f"round {r + 1}: {args.epochs} epochs in {time.perf_counter() - t0:.1f} s", flush=True)
        rounds.append(_medians(times, args.window))
    calls = None
    if not args.job:  # one more fit, untimed: the calls each epoch's hooks make, early and late
        with tempfile.TemporaryDirectory(prefix="kgt_epoch_") as log_dir:
            calls = _means(_fit(names, args.epochs, log_dir, count=True), args.window)
    first, last = rounds[0], rounds[-1]
    table = {}

    def median(n: str, i: int) -> float:  # over the rounds: one slow round moves it less than round 1 alone
        return statistics.median(ro[n][i] for ro in rounds)

    def drift_of(control: str) -> float | None:
        early, late = median(control, 0), median(control, 1)
        return late / early if early > 0 else None

    def paced(n: str) -> float | None:
        early, late = median(n, 2), median(n, 3)
        return late / early if early > 0 else None

    drift = drift_of(CONTROL)
    for n in [*names, *(["all"] if names else []), *CONTROLS]:
        early, late = median(n, 0), median(n, 1)
        table[n] = {
            "early_ms": early,
            "late_ms": late,
            "late_over_early": late / early if early > 0 else None,
            "vs_control": late / early / drift if early > 0 and drift else None,
            "paced_late_over_early": paced(n),
            "aa_early": last[n][0] / first[n][0] if first[n][0] > 0 and len(rounds) > 1 else None,
            "aa_late": last[n][1] / first[n][1] if first[n][1] > 0 and len(rounds) > 1 else None,
            "rounds_late_over_early": [ro[n][1] / ro[n][0] if ro[n][0] > 0 else None for ro in rounds],
            "rounds_ms": [list(ro[n][:2]) for ro in rounds],
            "rounds_paced_late_over_early": [ro[n][3] / ro[n][2] if ro[n][2] > 0 else None for ro in rounds],
            "calls_early": None if calls is None else calls[n][0],
            "calls_late": None if calls is None else calls[n][1],
        }
    print(
        f"{'callback':22} {'early ms':>9} {'late ms':>9} {'late/early':>11} {'paced':>10} {'vs control':>10} "
        f"{'A/A early':>10} {'A/A late':>9} {'calls':>13}"
    )
    for n, row in table.items():
        cells = [
            row["late_over_early"],
            row["paced_late_over_early"],
            row["vs_control"],
            row["aa_early"],
            row["aa_late"],
        ]
        ratios = " ".join(f"{c:>10.2f}" if c is not None else f"{'n/a':>10}" for c in cells)
        made = "" if row["calls_early"] is None else f" {row['calls_early']:6.0f} {row['calls_late']:6.0f}"
        print(f"{n:22} {row['early_ms']:9.3f} {row['late_ms']:9.3f} {ratios}{made}")
    out = _common.out_path(args, BENCHMARK + ("_job" if args.job else ""))
    doc = {
        **_common.environment(backend),
        "args": vars(args),
        "early_epochs": f"{EARLY}-{EARLY + args.window - 1}",
        "late_epochs": f"{args.epochs - args.window}-{args.epochs - 1}",
        "callbacks": table,
    }
    # A run of other callbacks than the seven is kept beside theirs, under its own key.
    key = backend if names == list(CALLBACKS) else f"{backend}/{args.callbacks}"
    _common.save(out, BENCHMARK + ("_job" if args.job else ""), key, doc)
    print(f"result: {out}")
    check = _common.Checks(args)
    timed = len(names) + (1 if names else 0) + len(CONTROLS)
    check(all(len(ro) == timed for ro in rounds), "every callback and the controls timed in every round")
    times = [t for row in table.values() for t in (row["early_ms"], row["late_ms"])]
    check(all(math.isfinite(t) and t > 0 for t in times), "every time finite and positive")
    if names:
        check.figure("all's late / early", table["all"]["late_over_early"], 0.0)
        check.figure("all's paced late / early", table["all"]["paced_late_over_early"], 0.0)
    check.figure("the no-op control's late / early", table[CONTROL]["late_over_early"], 0.0)
    check.figure("the fixed-work control's late / early", table[WORK]["late_over_early"], 0.0)
    over = [
        f"{n} {'n/a' if row['paced_late_over_early'] is None else round(row['paced_late_over_early'], 2)}"
        for n, row in table.items()
        if n not in CONTROLS
        and (n == "all" or row["late_ms"] >= GOAL_FLOOR_MS)
        and (row["paced_late_over_early"] or math.inf) > GOAL
    ]
    check.goal(not over, f"paced late / early at most {GOAL} (over: {', '.join(over) or 'none'})")
    if calls is not None:  # load-independent: the same work late as early, within a few calls
        grown = [
            f"{n} {row['calls_early']:.0f} -> {row['calls_late']:.0f}"
            for n, row in table.items()
            if row["calls_late"] > CALLS_GOAL * row["calls_early"] + 1
        ]
        check.goal(not grown, f"calls an epoch late at most {CALLS_GOAL} x early (over: {', '.join(grown) or 'none'})")
    if not args.job and names:  # a job's epoch end waits for the other process: its time is not the hooks' cost
        worst = max(table["all"]["early_ms"], table["all"]["late_ms"])
        check.goal(worst <= GOAL_ALL_MS, f"all at most {GOAL_ALL_MS} ms an epoch, early and late ({worst:.3f} ms)")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
