"""The `keras-gpu-tools` command: `doctor` and `demo`.

    keras-gpu-tools doctor             # is my GPU used? if not, why?
    keras-gpu-tools demo --logdir DIR  # a small training run with every tool attached
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional


def _doctor(args) -> int:
    from keras_gpu_tools._core import doctor

    print(doctor.run())
    return 0


def _demo(args) -> int:
    import warnings

    import keras
    import numpy as np

    from keras_gpu_tools import GPUUtilizationLogger
    from keras_gpu_tools._core.deps import loaded
    from keras_gpu_tools._core.tensorboard import check_log_dir

    logdir = check_log_dir(args.logdir, "--logdir")
    os.makedirs(logdir, exist_ok=True)
    print(f"Keras {keras.__version__}, backend {keras.backend.backend()}; logs in {os.path.abspath(logdir)}")

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    n, features, classes = args.samples, 64, 10
    centers = rng.normal(scale=2.0, size=(classes, features))
    labels = rng.integers(0, classes, size=n)
    x = (centers[labels] + rng.normal(size=(n, features))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    gpu_logger = GPUUtilizationLogger(log_dir=logdir, interval=0.1)
    callbacks = [gpu_logger]
    if loaded("tensorflow") is not None or _importable("tensorflow"):
        callbacks.append(keras.callbacks.TensorBoard(log_dir=logdir))
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            x, labels, batch_size=args.batch_size, epochs=args.epochs, validation_split=0.1,
            verbose=2 if args.verbose else 0, callbacks=callbacks,
        )
    seconds = time.perf_counter() - t0
    for w in {str(w.message) for w in caught if "keras_gpu_tools" in str(w.filename) or "GPU" in str(w.message)}:
        print(f"note: {w}")

    h = history.history
    print(f"\nTrained {args.epochs} epochs ({gpu_logger.global_step} steps) in {seconds:.1f} s; "
          f"final accuracy {h['accuracy'][-1]:.3f}, val_accuracy {h['val_accuracy'][-1]:.3f}.")
    shown = sorted(k for k in h if k.startswith(("gpu/", "host/")) and not k.endswith("_max"))
    if shown:
        print("Last epoch, measured by GPUUtilizationLogger:")
        for k in shown:
            print(f"  {k:40s} {h[k][-1]:10.1f}")
    print(f"\nTensorBoard logs: {os.path.abspath(logdir)}")
    print(f"View them with:   tensorboard --logdir {logdir}")
    return 0


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keras-gpu-tools", description="Keras GPU training tools.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("doctor", help="report what GPUs Keras and NVML see, and why a GPU may be unused")
    d.set_defaults(func=_doctor)
    demo = sub.add_parser("demo", help="train a small model with the package's callbacks and write TensorBoard logs")
    demo.add_argument("--logdir", default="logs/keras-gpu-tools-demo", help="where to write TensorBoard logs")
    demo.add_argument("--epochs", type=_positive_int, default=5)
    demo.add_argument("--samples", type=_positive_int, default=20000)
    demo.add_argument("--batch-size", type=_positive_int, default=128)
    demo.add_argument("--verbose", action="store_true", help="show Keras's per-epoch lines")
    demo.set_defaults(func=_demo)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: Optional[List[str]] = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"keras-gpu-tools {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
