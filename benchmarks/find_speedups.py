"""find_speedups: is each row's speed-up what a plain fit with that one change made by hand gives?

Three cases modelled on the performance guides: (a) a `PyDataset` that decodes images in Python
(it sleeps `--decode-ms` for each 64 images, so a batch of 256 takes four times as long) feeding a
small conv net at batch 64; (b) a float32 conv net on
128x128x3 images at batch 256 (NumPy arrays); (c) a small MLP at batch 64 whose steps are
dispatch-bound (NumPy arrays). For each: the finder (`max_seconds=180`, its wall time, the model's
weights compared before and after), in a process of its own, which has exited before the first plain
fit (a process that ran its trials fits torch models 6-10% slower); then, for every row it measured, a
comparison by hand: plain `model.fit` calls of the model as given (the baseline, A) and of the model
with that change made by hand (B), alternated A (B A) x3 in one process, each timing at least an epoch
and 2 s after the model's first epoch (which compiles); samples/s is a call's samples over its epochs'
time (what the fit pays, its slow epochs too, as the finder's timing reads it). Each B is
read over the mean of the A's either side, seconds apart, and the row's ratio is the median of the
three: plain fits move 6-40% from one fit to the next (a shared host's dispatch-bound steps, the first
fit in a process), which one fit of each would read as the change's. The A/A, the median of how far
each A moved from the one before, says whether the ratio can be read (within 5%). The same for every
change that paid together (`report.apply` for the compile-time ones, the rows' code for the rest): its
goal is a floor, judged over the faster A either side where the A's moved. Where the plain fits run:
on TensorFlow each comparison in a fresh process, as a user's script (its fits slow as a process fits
more models; a smoke run so runs case (c)'s first comparison alone); on JAX and torch in the
benchmark's process (on a GPU a second process alive beside it would share its memory). A batch change
fits the same samples (200 batches of the case's batch) at the new batch.

Goals (a full run exits non-zero and names the one missed): each row's A/A within 5%;
the finder's own baseline within 10% of the plain fits' (every row's speed-up is over it); each
measured row's speed-up within 10% of its plain fit's; the combination at least 2x the baseline
on (a) and (b) with JAX, and at least 1.5x on every case where any change pays; the finder within 180 s on each case; the model
untouched. A smoke run (CPU, tiny sizes) checks the output's structure and prints the goals
unenforced.

    python benchmarks/find_speedups.py --backend jax             # H200: the three cases, ~10-20 min
    python benchmarks/find_speedups.py --backend torch --case b  # one case
    python benchmarks/find_speedups.py --backend jax --smoke     # CPU check, under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import _common

BENCHMARK = "find_speedups"
FINDER_SECONDS = 180.0  # the finder's budget and goal on each case
ROW_TOLERANCE = 0.10  # a row's speed-up within 10% of the plain fit with that change by hand
AA_TOLERANCE = 0.05  # the plain baseline's fits either side of those by hand move within 5% (the median)
ROUNDS = 3  # a comparison's plain fits: A (B A) x3, each B read over the A's either side
CALL_EPOCHS, CALL_SECONDS = 1, 2.0  # each of those fits times at least one epoch, and 2 s of them
COMBINED_GOAL = 1.5  # the combination, where any change pays
JAX_COMBINED_GOAL = {"a": 2.0, "b": 2.0}  # JAX's combination on (a) and (b)
CASES = ("a", "b", "c")


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--case", choices=(*CASES, "all"), default="all")
    p.add_argument("--decode-ms", type=float, default=4.0, help="case (a): the Python decode's time per 64 images")
    p.add_argument("--max-seconds", type=float, default=FINDER_SECONDS, help="the finder's budget")
    # --paired SPEC: the plain fits of one comparison in this process, printed as JSON (how _paired asks a fresh
    # process for them); --finder: the finder alone in this process, its report printed as JSON (how _finder runs
    # it in a process of its own).
    p.add_argument("--paired", default=None, help=argparse.SUPPRESS)
    p.add_argument("--finder", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def _sizes(case: str, smoke: bool) -> dict[str, Any]:
    """The case's model and data sizes: the issue's at full scale, tiny in a smoke run."""
    if case == "a":
        return {"image": 16 if smoke else 64, "width": 8 if smoke else 32, "batch": 64, "batches": 16 if smoke else 200}
    if case == "b":
        return {"image": 16 if smoke else 128, "width": 8 if smoke else 64, "batch": 32 if smoke else 256}
    return {"width": 32 if smoke else 256, "batch": 64}


def _model(case: str, smoke: bool, policy: str | None = None, **compile_args):
    import keras

    from keras_gpu_tools import MixedPrecisionOutput

    s = _sizes(case, smoke)
    keras.utils.set_random_seed(0)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy or "float32")
    try:
        if case in ("a", "b"):
            inp = keras.Input((s["image"], s["image"], 3))
            h = inp
            for _ in range(3):
                h = keras.layers.Conv2D(s["width"], 3, padding="same", activation="relu")(h)
            logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h))
        else:
            inp = keras.Input((64,))
            h = keras.layers.Dense(s["width"], activation="relu")(inp)
            h = keras.layers.Dense(s["width"], activation="relu")(h)
            logits = keras.layers.Dense(10)(h)
        out = MixedPrecisionOutput()(logits) if policy else logits
        model = keras.Model(inp, out)
    finally:
        keras.config.set_dtype_policy(previous)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(1e-3), loss, **compile_args)
    return model


def _arrays(case: str, smoke: bool, n: int):
    import numpy as np

    s = _sizes(case, smoke)
    rng = np.random.default_rng(0)
    shape = (s["image"], s["image"], 3) if case in ("a", "b") else (64,)
    block = min(n, 4096)
    x = rng.standard_normal((block, *shape), dtype="float32")
    y = rng.integers(0, 10, (block,))
    return (np.resize(x, (n, *shape)), np.resize(y, (n,))) if block < n else (x, y)


def _decoded(smoke: bool, decode_s: float, batch: int | None = None, **options):
    """Case (a)'s input: a PyDataset whose batches take ``decode_s`` per 64 images to prepare, in Python."""
    import keras

    s = _sizes("a", smoke)
    b = batch or s["batch"]
    x, y = _arrays("a", smoke, s["batches"] * s["batch"])

    class Decoded(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(**options)

        def __len__(self):
            return len(x) // b

        def __getitem__(self, i):
            time.sleep(decode_s * b / 64)  # a decode per image, in Python; sleeping releases the GIL
            return x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]

    return Decoded()


def _input(case: str, args, batch: int | None = None, **options) -> dict[str, Any]:
    """``model.fit``'s data arguments for the case (200 batches of the case's batch at full scale), at ``batch``."""
    if case == "a":
        return {"x": _decoded(args.smoke, args.decode_ms / 1e3, batch, **options)}
    b0 = _sizes(case, args.smoke)["batch"]
    steps = 8 if args.smoke else 200
    x, y = _arrays(case, args.smoke, steps * b0)  # the user's arrays: the same samples at any batch
    return {"x": x, "y": y, "batch_size": batch or b0}


def _built(case: str, args, spec: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """The case's model and ``model.fit``'s data arguments, as given or with ``spec``'s changes made by hand (its
    ``batch``, input ``options``, ``compile_args`` and ``policy``), fitted one epoch (which compiles)."""
    import keras

    spec = spec or {}
    if keras.backend.backend() == "torch" and spec.get("compile_args", {}).get("jit_compile"):
        import torch._dynamo  # each compiled model as in a fresh process: dynamo's recompile limit is per process

        torch._dynamo.reset()
    model = _model(case, args.smoke, spec.get("policy"), **spec.get("compile_args", {}))
    data = _input(case, args, spec.get("batch"), **spec.get("options", {}))
    model.fit(**data, epochs=1, shuffle=False, verbose=0)
    return model, data


def _rate(model, data: dict[str, Any], smoke: bool) -> float:
    """samples/s of one plain fit of an already compiled ``model``: its epochs' samples over their time, timed until
    at least ``CALL_EPOCHS`` of them have run for at least ``CALL_SECONDS`` together. Their total, not their median:
    a host that stalls one epoch in a few (a CPU's TensorFlow fits) makes the fit that much slower, and the finder's
    timing, the mean over its windows, pays it too (docs/decisions/0024)."""
    times: list[float] = []
    # Timed by duration, not by steps: 600 steps of a 1 ms step is too short to read, and of a batch of 4096
    # decoded in Python far too long.
    stop = (1, 0.0) if smoke else (CALL_EPOCHS, CALL_SECONDS)
    clock = _common.epoch_clock(times, stop_after=stop, warmup=0)
    model.fit(**data, epochs=10_000, shuffle=False, verbose=0, callbacks=[clock])
    x = data["x"]
    samples = len(x) * x[0][0].shape[0] if "y" not in data else len(x)
    return samples * len(times) / sum(times)


_BASELINES: dict[str, tuple[Any, dict[str, Any]]] = {}  # each case's baseline model, built once in this process


def _paired(case: str, args, spec: dict[str, Any] | None, fresh: bool) -> dict[str, list[float]]:
    """samples/s of plain fits of the case's model as given (the baseline, A) and with ``spec``'s changes made by
    hand (B), alternated A (B A) x ``ROUNDS`` in one process: each B between two A's, seconds apart, so that what
    moves a plain fit from one fit to the next (the host's pace, what the process holds) moves both. No ``spec``:
    two A's, for the A/A alone. In a fresh process where ``fresh``, as a user's script runs it."""
    if fresh:
        return json.loads(_child(case, args, ["--paired", json.dumps(spec)], "paired "))
    base = _BASELINES.get(case) or _BASELINES.setdefault(case, _built(case, args, None))
    changed = None if spec is None else _built(case, args, spec)
    a, b = [_rate(*base, args.smoke)], []
    for _ in range(1 if args.smoke or changed is None else ROUNDS):
        if changed is not None:
            b.append(_rate(*changed, args.smoke))
        a.append(_rate(*base, args.smoke))
    return {"baselines": a, "changed": b}


def _child(case: str, args, extra: list[str], mark: str) -> str:
    """The rest of the last line, which starts with ``mark``, of this script run with ``extra`` in a process of its
    own on ``case``."""
    command = [sys.executable, os.path.abspath(__file__), "--backend", _common.setup(args), "--case", case]
    command += ["--decode-ms", str(args.decode_ms), "--max-seconds", str(args.max_seconds), *extra]
    done = subprocess.run(command + (["--smoke"] if args.smoke else []), capture_output=True, text=True, timeout=900)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith(mark):
        raise RuntimeError(f"the {extra[0][2:]} process (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    if lines[:-1]:
        print("\n".join(lines[:-1]))
    return lines[-1][len(mark) :]


def _read(pairs: dict[str, list[float]]) -> dict[str, Any]:
    """What a by-hand comparison says: its ratio, the median of each B over the mean of the A's either side (the
    host's drift over a round cancels out of it); the floor, the same over the faster A; and the A/A, the median
    of how far each A moved from the one before (where over 5%, the ratio carries the drift: not read)."""
    a, b = pairs["baselines"], pairs["changed"]
    return {
        "samples_per_sec": statistics.median(b),
        **pairs,
        "by_hand": statistics.median(x / ((a[i] + a[i + 1]) / 2) for i, x in enumerate(b)),
        "floor": statistics.median(x / max(a[i], a[i + 1]) for i, x in enumerate(b)),
        "a_a": statistics.median(abs(a[i + 1] / a[i] - 1.0) for i in range(len(a) - 1)),
    }


def _by_hand(rows: list[Any], policy: str | None) -> dict[str, Any]:
    """The changes of ``rows`` made by hand, as :func:`_built`'s ``spec``."""
    compile_args: dict[str, Any] = {}
    options: dict[str, Any] = {}
    batch = None
    for row in rows:
        compile_args.update(row.compile_args)
        if row.kind == "input":
            options.update(row.settings)
        if row.kind == "batch_size":
            batch = row.settings["batch_size"]
    mixed = policy if any(r.kind == "mixed_precision" for r in rows) else None
    return {"batch": batch, "options": options, "compile_args": compile_args, "policy": mixed}


def _fresh(args, first: bool = False) -> bool:
    """Whether a comparison's plain fits run in a fresh process: on TensorFlow, whose fits slow as a process fits
    more models (JAX's and torch's do not, once the finder's trials are out of the process; on a GPU a second
    process would share the first one's memory). A smoke run: case (c)'s first comparison alone, so that the path
    runs in CI within its limit."""
    return _common.setup(args) == "tensorflow" and (first or not args.smoke)


def _finder(case: str, args) -> dict[str, Any]:
    """The finder on the case's model and input: its report (as a dict), its wall time, whether the model's
    weights are as before, and its log (where its budget went: each trial's share and seconds, the package's DEBUG
    lines), kept for whoever tunes the split. Run here with ``--finder``; otherwise in a process of its own (see
    :func:`measure`)."""
    if not args.finder:
        return json.loads(_child(case, args, ["--finder"], "finder "))
    import logging

    import numpy as np

    from keras_gpu_tools import find_speedups

    log: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log.append(f"{time.perf_counter() - t0:6.1f} s {record.getMessage()}")  # seconds into the finder

    package = logging.getLogger("keras_gpu_tools")
    package.addHandler(Kept(logging.DEBUG))
    package.setLevel(logging.DEBUG)

    model = _model(case, args.smoke)
    data = _input(case, args)
    weights = [np.array(w) for w in model.get_weights()]
    t0 = time.perf_counter()
    report = find_speedups(
        model, data["x"], data.get("y"), batch_size=data.get("batch_size"), max_seconds=args.max_seconds
    )
    seconds = time.perf_counter() - t0
    print(report)
    untouched = all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    return {"report": report.as_dict(), "seconds": seconds, "untouched": untouched, "log": log}


def measure(case: str, args) -> dict[str, Any]:
    from keras_gpu_tools.speedups.report import SpeedupReport

    # The finder runs in a process of its own, and the plain fits after it: a process that has run the finder's
    # trials (torch.compile's modules and caches, more live objects for every collection) fits 6-10% slower on
    # torch, which a plain fit made there would read as the change's (docs/decisions/0021).
    found = _finder(case, args)
    report, seconds, untouched = SpeedupReport.from_dict(found["report"]), found["seconds"], found["untouched"]
    mixed = report.row("mixed_precision")
    policy = None if mixed is None else mixed.settings.get("dtype_policy")
    # Each row's plain fit by hand alternates with the plain baseline's, A (B A) x ROUNDS (_paired): plain fits of
    # one model move 6-40% from one fit to the next (a shared host's dispatch-bound steps, the first fit in a
    # process), which one fit of each, a minute apart, would read as the change's.
    pairs: list[dict[str, list[float]]] = []

    def by_hand(spec: dict[str, Any]) -> dict[str, Any]:
        pairs.append(_paired(case, args, spec, _fresh(args, first=case == "c" and not pairs)))
        return _read(pairs[-1])

    hand: dict[str, Any] = {}
    for row in report.rows:
        if row.kind in ("baseline", "ceiling", "combined") or row.speedup is None or row.status == "unsafe":
            continue
        try:
            hand[row.change] = {"finder": row.speedup, **by_hand(_by_hand([row], policy))}
        except Exception as e:  # recorded, not fatal
            hand[row.change] = {"finder": row.speedup, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        h = hand[row.change]
        print(f"  {row.change}: finder {row.speedup:.2f}x, by hand {h['by_hand']:.2f}x (A/A {100 * h['a_a']:.1f}%)")
    combined = None
    if report.taken:
        mixed = policy if report.row("mixed_precision") in report.taken else None
        applied = report.apply(_model(case, args.smoke, mixed))  # the compile-time changes, as a user applies them
        inputs = [r for r in report.taken if r.kind == "input"]  # the fastest input change, as the finder combines
        options = max(inputs, key=lambda r: r.after or 0.0).settings if inputs else {}
        batch = next((r.settings["batch_size"] for r in report.taken if r.kind == "batch_size"), None)
        # The model compiled with what apply() applied.
        try:
            combined = by_hand({"batch": batch, "options": options, "compile_args": applied, "policy": mixed})
        except Exception as e:  # recorded, not fatal
            combined = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    if not pairs:  # no row: the A/A still needs two baselines
        pairs.append(_paired(case, args, None, _fresh(args, first=case == "c")))
    baselines = [a for p in pairs for a in p["baselines"]]
    print("  plain baselines (A/A): " + ", ".join(f"{b:,.0f}" for b in baselines) + " samples/s")
    return {
        "baseline_samples_per_sec": statistics.mean(baselines),
        "baseline_a_a": baselines,
        "finder_seconds": round(seconds, 2),
        "finder_log": found.get("log", []),
        "untouched": untouched,
        "report": report.as_dict(),
        "rows_by_hand": hand,
        "combined": combined,
        "combined_speedup": None if combined is None else combined.get("by_hand"),
    }


def _steady(check, what: str, h: dict[str, Any]) -> bool:
    """The A/A goal of one row: its plain baseline's fits move within 5% from one to the next (the median); where
    they do not, the row is not read (its ratio would carry the drift)."""
    steady = h["a_a"] <= AA_TOLERANCE
    check.goal(
        steady,
        f"{what}: the plain baseline's fits either side within {100 * AA_TOLERANCE:g}% (A/A {100 * h['a_a']:.1f}%: "
        + ", ".join(f"{a:,.0f}" for a in h["baselines"])
        + " samples/s): its tolerance can be read",
    )
    if not steady:
        print(f"{what}: not read (the plain baseline moved more than the A/A allows)")
    return steady


def main() -> int:
    args = _parse()
    if args.paired is not None:  # the plain fits for the process that asked (_paired)
        _common.setup(args)
        print("paired", json.dumps(_paired(args.case, args, json.loads(args.paired), False)))
        return 0
    if args.finder:  # the finder for the process that asked (_finder)
        _common.setup(args)
        print("finder", json.dumps(_finder(args.case, args)))
        return 0
    cases = CASES if args.case == "all" else (args.case,)
    if args.smoke:
        args.max_seconds = min(args.max_seconds, 8.0)
    results = _common.measure_and_save(args, BENCHMARK, lambda a: {case: measure(case, a) for case in cases})
    backend = _common.setup(args)
    check = _common.Checks(args)
    for case, r in results.items():
        check.figure(f"({case}) the baseline's samples/s", r["baseline_samples_per_sec"], 0.0)
        own = next(row["after"] for row in r["report"]["rows"] if row["kind"] == "baseline")
        check.goal(
            abs(own / r["baseline_samples_per_sec"] - 1.0) <= ROW_TOLERANCE,
            f"({case}) the finder's baseline within {100 * ROW_TOLERANCE:g}% of the plain fits' ({own:,.0f} "
            f"against {r['baseline_samples_per_sec']:,.0f} samples/s): every row's speed-up is over it",
        )
        check(bool(r["report"]["rows"]), f"({case}) the report has rows")
        check(r["untouched"], f"({case}) the model's weights are as before the finder")
        check.goal(
            r["finder_seconds"] <= FINDER_SECONDS,
            f"({case}) the finder within {FINDER_SECONDS:g} s ({r['finder_seconds']} s)",
        )
        for change, h in r["rows_by_hand"].items():
            if "by_hand" not in h:
                check(False, f"({case}) {change}: the plain fit by hand ran ({h['error']})")
            elif _steady(check, f"({case}) {change}", h) or args.smoke:  # a smoke run runs every check
                check.goal(
                    abs(h["finder"] / h["by_hand"] - 1.0) <= ROW_TOLERANCE,
                    f"({case}) {change}: finder {h['finder']:.2f}x within {100 * ROW_TOLERANCE:g}% of by hand "
                    f"{h['by_hand']:.2f}x",
                )
        combined = r["combined"]
        if combined is None:
            print(f"({case}) no change paid")
            continue
        if "error" in combined:
            check(False, f"({case}) the combination's plain fit ran ({combined['error']})")
            continue
        check.figure(f"({case}) the combination's speed-up", combined["by_hand"], 0.0)
        goal = JAX_COMBINED_GOAL.get(case, COMBINED_GOAL) if backend == "jax" else COMBINED_GOAL
        # A floor, not a ratio to read: where the baseline moved, it is judged over the faster baseline either side
        # (a drift can only have made it look smaller).
        if combined["a_a"] <= AA_TOLERANCE:
            speedup, over = combined["by_hand"], "the baselines either side"
        else:
            speedup, over = combined["floor"], "the faster baseline either side"
        check.goal(speedup >= goal, f"({case}) the combination applied at least {goal:g}x over {over} ({speedup:.2f}x)")
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
