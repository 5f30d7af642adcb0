"""The `keras-gpu-tools` command: `doctor`, `demo` and `report`.

keras-gpu-tools doctor             # is my GPU used? if not, why?
keras-gpu-tools demo --logdir DIR  # a small training run with every tool attached
keras-gpu-tools report DIR         # the training report, from a TensorBoard log directory

The exit codes of `doctor` and `report` are in `DOCTOR_EXIT_CODES` and `REPORT_EXIT_CODES`,
shown by their `--help`.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from typing import TYPE_CHECKING

from keras_gpu_tools.logdir.reader import printable  # light: no Keras, no TensorBoard

if TYPE_CHECKING:
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer

DOCTOR_EXIT_CODES = """\
exit codes:
  0  no finding is a problem: every line under Findings is [OK  ], [WARN]
     or [INFO].
  1  a finding is a problem, printed [FAIL] (e.g. "No NVIDIA GPU is usable"
     on a machine without one): the report is printed all the same.
"""

REPORT_EXIT_CODES = """\
exit codes:
  0  the report is written, also when some event files could not be read:
     they are named in the report and in a warning on stderr.
  2  nothing is written, and an earlier report is kept: no event file could
     be read at all (the directory holds none, or only empty or unreadable
     ones), or an output path cannot be written (--output a directory, --png
     a file; both are checked before anything is written), or --layout names
     runs the directory does not hold. A report that is
     written replaces the earlier one whole, never in part.
"""

DEMO_LOG_DIR = "logs/demo"  # the demo's default --logdir, also named in `report`'s help and README.md
WIDTH = 100  # the demo's messages are wrapped at this many characters

# Keras, its backend and matplotlib take seconds to import: every subcommand
# imports what it needs itself, so `--help` and argument errors answer at once.


def _doctor(args: argparse.Namespace) -> int:
    from keras_gpu_tools.cli import doctor

    text, findings = doctor.examine()
    print(text)
    return doctor.exit_code(findings)


def _demo(args: argparse.Namespace) -> int:
    import warnings

    from keras_gpu_tools.logdir.writer import check_log_dir

    # Checked before Keras is imported: a --logdir that cannot be one answers at once.
    logdir = check_log_dir(args.logdir, "--logdir")
    assert logdir is not None  # --logdir has a default; tells type checkers so

    import keras
    import numpy as np

    from keras_gpu_tools.callbacks import GPUUtilizationLogger, MixedPrecisionCheck
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.callbacks.live_view import LiveView
    from keras_gpu_tools.callbacks.memory_leak_detector import MemoryLeakDetector
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
    from keras_gpu_tools.layers import MixedPrecisionOutput
    from keras_gpu_tools.profiling.capture import steps_name
    from keras_gpu_tools.reporting.report import report
    from keras_gpu_tools.runtime.deps import loaded

    os.makedirs(logdir, exist_ok=True)
    print(f"Keras {keras.__version__}, backend {keras.backend.backend()}; logs in {os.path.abspath(logdir)}")

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    n, features, classes = args.samples, 64, 10
    centers = rng.normal(scale=0.3, size=(classes, features))  # overlapping classes: a visible learning curve
    labels = rng.integers(0, classes, size=n)
    x = (centers[labels] + rng.normal(size=(n, features))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(classes),
            MixedPrecisionOutput("softmax"),  # float32 probabilities under any dtype policy
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    gpu_logger = GPUUtilizationLogger(log_dir=logdir, interval=0.1)
    detector = InputBoundDetector(log_dir=logdir, window=50, verbose=0)
    steps_per_epoch = -(-int(n * 0.9) // args.batch_size)
    profiler = ProfilerWindow(log_dir=logdir, start_step=min(steps_per_epoch + 5, 20), num_steps=5, verbose=0)
    mp_check = MixedPrecisionCheck()
    leaks = MemoryLeakDetector(log_dir=logdir, verbose=0)
    callbacks = [gpu_logger, detector, profiler, mp_check, leaks]
    oom = _oom_reducer(logdir)
    if oom is not None:
        callbacks.insert(0, oom)
    callbacks.append(LiveView())  # in a notebook: a table that updates in place; here: nothing
    if loaded("tensorflow") is not None or _importable("tensorflow"):
        callbacks.append(keras.callbacks.TensorBoard(log_dir=logdir))
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            x,
            labels,
            batch_size=args.batch_size,
            epochs=args.epochs,
            validation_split=0.1,
            verbose=2 if args.verbose else 0,
            callbacks=callbacks,
        )
    seconds = time.perf_counter() - t0
    for w in sorted(
        {str(w.message) for w in caught if "keras_gpu_tools" in str(w.filename) or "GPU" in str(w.message)}
    ):
        _say(f"note: {w}")

    h = history.history
    print(
        f"\nTrained {args.epochs} epochs ({gpu_logger.global_step} steps) in {seconds:.1f} s; "
        f"final accuracy {h['accuracy'][-1]:.3f}, val_accuracy {h['val_accuracy'][-1]:.3f}."
    )
    shown = sorted(k for k in h if k.startswith(("gpu/", "host/")) and not k.endswith("_max"))
    if shown:
        print("Last epoch, measured by GPUUtilizationLogger:")
        for k in shown:
            print(f"  {k:40s} {h[k][-1]:10.1f}")
    if detector.verdict is not None:
        _say(f"InputBoundDetector: {detector.verdict.message}")
    for c in profiler.captures:  # the window's own input wait (as the detector measures it), beside xprof's
        if c.input is not None and c.input.text:
            for line in c.input.text.splitlines():  # "ProfilerWindow: steps a-b: ...", then why xprof differs
                _say(line)
        else:
            conclusion = c.analysis.conclusion if c.analysis is not None and c.analysis.conclusion else "no conclusion"
            _say(f"ProfilerWindow: {steps_name(c.start_step, c.num_steps)}: xprof: {conclusion}")
    print(f"MixedPrecisionCheck: {len(mp_check.findings)} finding(s)")
    if leaks.verdict is not None:
        _say(f"MemoryLeakDetector: {leaks.verdict.message}")
    if oom is not None:
        _say(oom.summary())

    rep = report(callbacks, model, title="keras-gpu-tools demo")
    rep.write_to_tensorboard(logdir)  # keeps the findings for `keras-gpu-tools report LOGDIR`
    html_path = rep.save(os.path.join(logdir, "report.html"))
    pngs = rep.save_figures(os.path.join(logdir, "report_png"))
    print(f"\nTensorBoard logs: {os.path.abspath(logdir)}")
    print(f"View them with:   tensorboard --logdir {logdir}")
    print(f"HTML report:      {os.path.abspath(html_path)}")
    print(f"Plots as PNG:     {os.path.join(logdir, 'report_png')} ({len(pngs)} files)")
    print(f"Rebuild it with:  keras-gpu-tools report {logdir}")
    return 0


def _say(text: str, width: int = WIDTH, table_rows: bool = False) -> None:
    """Prints `text` with each of its lines wrapped at `width` characters, continuations indented.

    With `table_rows`, a table's row is kept whole: a line that starts with "|" (Markdown), or
    whose columns are aligned with runs of spaces.
    """
    import textwrap

    for line in text.splitlines() or [""]:
        indent = " " * (len(line) - len(line.lstrip()))
        row = line.lstrip().startswith("|") or "  " in line.strip()
        keep = len(line) <= width or (table_rows and row)
        print(
            line
            if keep
            else textwrap.fill(
                line, width, subsequent_indent=indent + "    ", break_long_words=False, break_on_hyphens=False
            )
        )


def _oom_reducer(logdir: str) -> OOMBatchSizeReducer | None:
    """The OOMBatchSizeReducer, where this version of the package has it."""
    try:
        from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
    except ImportError:
        return None
    try:
        return OOMBatchSizeReducer(log_dir=logdir)
    except Exception as e:  # a constructor that wants arguments: leave it out of the demo
        print(f"note: OOMBatchSizeReducer left out of the demo ({type(e).__name__}: {e})")
        return None


def _report(args: argparse.Namespace) -> int:
    from keras_gpu_tools.reporting.report import report

    out = args.output or os.path.join(args.log_dir, "report.html")
    _check_output(out, "--output" if args.output else "LOG_DIR", directory=False)
    if args.png:
        _check_output(args.png, "--png", directory=True)
    rep = report(log_dir=args.log_dir, layout=args.layout)  # raises ValueError when no event file could be read at all
    for path, why in rep.data.unreadable:  # some could: the report is still worth writing
        print(f"keras-gpu-tools report: warning: {printable(os.path.join(args.log_dir, path))} {why}", file=sys.stderr)
    if not args.quiet:
        _say(rep.text(), table_rows=True)  # prose wrapped; a table's rows kept whole
    try:
        path = rep.save(out)
        print(f"\nHTML report: {printable(os.path.abspath(path))}")
        if args.png:
            pngs = rep.save_figures(args.png)
            print(f"PNG plots:   {len(pngs)} in {printable(os.path.abspath(args.png))}")
    except OSError as e:  # a full disk, no permission: the earlier report is kept (written whole or not at all)
        raise ValueError(
            f"could not write {printable(e.filename or out)!r} ({type(e).__name__}: {e.strerror or e})"
        ) from e
    return 0


def _check_output(path: str, flag: str, directory: bool) -> None:
    """ValueError unless `path` can become the file (or, with `directory`, the folder) to write; writes nothing.

    The path itself must be a file (or a folder) or not exist yet, and its first existing ancestor a folder.
    """
    what = "the folder to write the PNG files into" if directory else "the path of the HTML file to write"
    problem = None
    if directory and os.path.exists(path) and not os.path.isdir(path):
        problem = "which exists and is not a directory"
    elif not directory and os.path.isdir(path):
        problem = "which is a directory"
    else:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent) and os.path.dirname(parent) != parent:
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            problem = f"under {printable(parent)!r}, which is not a directory"
    if problem is not None:
        raise ValueError(
            f"Invalid value for argument `{flag}`. Received: {printable(path)!r}, {problem}. Expected {what}."
        )


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keras-gpu-tools", description="Keras GPU training tools.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "doctor",
        help="report what GPUs Keras and NVML see, why a GPU may be unused, whether mixed precision pays off, "
        "and the distribution in use; exits 1 where a finding is [FAIL]",
        description=textwrap.fill(  # (the raw formatter keeps the exit codes' layout, so wrapped here)
            "Report the Keras version and backend, the devices the backend sees, NVML's view (driver, each "
            "GPU's name, UUID, memory and compute capability), whether the two agree, whether mixed precision can "
            "pay off on these GPUs, and the distribution in use.",
            79,
        ),
        epilog=DOCTOR_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.set_defaults(func=_doctor)
    demo = sub.add_parser(
        "demo",
        help="train a small model with every callback attached; write TensorBoard logs and the HTML report",
        description="Train a small model with every callback attached; write TensorBoard logs and the HTML report "
        "(LOGDIR/report.html, its plots also as PNG in LOGDIR/report_png/) and print where they are.",
    )
    demo.add_argument(
        "--logdir",
        default=DEMO_LOG_DIR,
        help=f"where to write the TensorBoard logs and the HTML report (default: {DEMO_LOG_DIR})",
    )
    demo.add_argument("--epochs", type=_positive_int, default=5, help="epochs to train (default: 5)")
    demo.add_argument(
        "--samples", type=_positive_int, default=20000, help="synthetic samples, 10%% for validation (default: 20000)"
    )
    demo.add_argument("--batch-size", type=_positive_int, default=128, help="batch size (default: 128)")
    demo.add_argument("--verbose", action="store_true", help="show Keras's per-epoch lines")
    demo.set_defaults(func=_demo)
    rep = sub.add_parser(
        "report",
        help="build the training report (text and HTML with plots) from a TensorBoard log directory",
        description="Build the training report (text and HTML with plots) from a TensorBoard log directory.",
        epilog=REPORT_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument(
        "log_dir", metavar="LOG_DIR", help=f"the log_dir given to the callbacks (e.g. {DEMO_LOG_DIR}, the demo's)"
    )
    rep.add_argument(
        "--output", "-o", default=None, help="where to write the HTML report (default: LOG_DIR/report.html)"
    )
    rep.add_argument("--png", default=None, metavar="DIR", help="also write each plot as a PNG file into DIR")
    rep.add_argument("--quiet", "-q", action="store_true", help="do not print the text report")
    rep.add_argument(
        "--layout",
        default="latest",
        metavar="{latest,single,job,<host>_pid<pid>}",
        help="a log directory reused by a single-process fit and a job of several processes: report the runs "
        "written last (latest, the default), the single process's (single) or the job's (job); "
        "a second training that wrote it at the same time: its name; the report names the runs it leaves out",
    )
    rep.set_defaults(func=_report)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"keras-gpu-tools {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
