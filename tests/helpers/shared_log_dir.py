"""One of two independent trainings into one log directory, both profiling at once (no keras.distribution).

Run as ``python -m tests.helpers.shared_log_dir INDEX OUT``: trains a small
model whose layers are named after INDEX (``dense_a0``, ...) with
ProfilerWindow and InputBoundDetector into ``OUT/logs``; both processes meet
at a barrier (files in OUT) right before the window, so they profile in the
same second. Writes what it saw to ``OUT/result_<INDEX>.json``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

START, STEPS = 3, 3  # the window: steps 4-6


def main(index: int, out: Path) -> None:
    import keras
    import numpy as np

    from keras_gpu_tools import InputBoundDetector, ProfilerWindow

    class Barrier(keras.callbacks.Callback):
        """Waits, before the window's first step, until the other process is there too."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == START - 1:
                (out / f"ready_{index}").touch()
                deadline = time.monotonic() + 120
                while not (out / f"ready_{1 - index}").exists() and time.monotonic() < deadline:
                    time.sleep(0.005)

    from tests.helpers.fresh_process import tensorflow_hidden

    with tensorflow_hidden():  # JAX and torch: Keras seeds TensorFlow too where installed, an import never used
        keras.utils.set_random_seed(index)
    letter = "ab"[index]
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(32, activation="relu", name=f"dense_{letter}0"),
            keras.layers.Dense(1, name=f"dense_{letter}1"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(index)
    x, y = rng.random((16 * 8, 8), dtype=np.float32), rng.random((16 * 8, 1), dtype=np.float32)
    logs = str(out / "logs")
    profiler = ProfilerWindow(log_dir=logs, start_step=START, num_steps=STEPS, analyze=False, verbose=0)
    detector = InputBoundDetector(log_dir=logs, verbose=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[Barrier(), profiler, detector])
        profiler.wait_for_analysis()
    table = profiler.layer_table()
    result = {
        "training": profiler.topology.training,
        "run_dir": profiler.run_dir,
        "detector_run_dir": detector.run_dir,
        "captures": [
            {"start": c.start_step, "steps": c.num_steps, "reason": c.reason, "files": c.files}
            for c in profiler.captures
        ],
        "layers": sorted(r.path for r in table.rows) if table is not None else None,
        "table_error": table.error if table is not None else "no table",
        "warnings": [
            str(w.message) for w in seen if "keras_gpu_tools" in str(w.filename) or "Profiler" in str(w.message)
        ],
        "epochs": len(detector.epoch_history),
    }
    (out / f"result_{index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
