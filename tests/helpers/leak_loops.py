"""A loop of fits that builds a new model each time, as users write one, with or without
``keras.backend.clear_session()``; run as ``python -m tests.helpers.leak_loops [--clear]`` it prints
the leak verdict as JSON.

What such a loop adds to the process's RSS depends on the process's past: memory freed by earlier
work is reused before RSS grows. So the verdict on the loop is read in a fresh process.
"""

import json
import sys


def loop_of_fits(clear: bool):
    import keras

    from keras_gpu_tools import MemoryLeakDetector
    from tests.helpers.data import regression_data

    x, y = regression_data(128, features=16)
    det = None
    for _ in range(10):
        if clear:
            keras.backend.clear_session()
        # Three hidden layers: what TensorFlow keeps of an uncleared model's functions is about 12 MiB a fit,
        # ten times the per-fit threshold (eight layers keep about 20 MiB, at twice the tracing time).
        model = keras.Sequential(
            [keras.Input((16,))]
            + [keras.layers.Dense(64, activation="relu") for _ in range(3)]
            + [keras.layers.Dense(1)]
        )
        model.compile("adam", "mse")
        det = MemoryLeakDetector(log_dir=None, verbose=0)
        model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[det])
    return det


if __name__ == "__main__":
    from keras_gpu_tools import MemoryLeakDetector

    v = loop_of_fits(clear="--clear" in sys.argv).verdict
    print(
        json.dumps(
            {
                "fits": v.fits,
                "grows": v.grows,
                "causes": v.causes,
                "advice": v.advice,
                "message": v.message,
                "history": len(MemoryLeakDetector.fit_history()),
            }
        )
    )
