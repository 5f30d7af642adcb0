"""What one TensorFlow training step costs on the host, by the route Keras or the reducer takes to it.

The tiny model of ``host_overhead.py`` (16 -> 32 -> 3, batch 32) on the CPU, after one fit
has traced Keras's step. Each route runs ``--steps`` steps in a loop, outside fit(),
``--rounds`` times in turn; the fastest round's training-thread CPU per step is reported:

- ``keras``: Keras's train function on a ``tf.data`` iterator (what a bare fit() calls);
- ``fetch``: ``next()`` on the same prefetched dataset, alone;
- ``fetch_and_function``: that fetch, then the ``tf.function`` Keras's ``one_step_on_data`` wraps;
- ``fetch_and_concrete``: that fetch, then the concrete function the ``tf.function`` dispatches
  to for the batch's signature (``keras_internals.tf_batch_step``: the reducer's idle step).

    KERAS_BACKEND=tensorflow python benchmarks/tf_step_dispatch.py --out results/tf_step_dispatch_cpu.json
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from _per_backend import write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=1500)
    args = p.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_gpu_tools.runtime import keras_internals as ki

    if keras.backend.backend() != "tensorflow":
        raise SystemExit(f"KERAS_BACKEND={keras.backend.backend()!r}: this benchmark times TensorFlow's step")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * 32, 16)).astype("float32")
    y = rng.integers(0, 3, size=(64 * 32,)).astype("int32")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    keras_function = model.train_function
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True).repeat().prefetch(2)
    iterator = iter(dataset)
    concrete = ki.tf_batch_step(keras_function, next(iterator))
    if concrete is None:
        raise SystemExit("this Keras's TensorFlow train function has no compiled per-batch step to resolve")
    function = ki.tf_step_function(keras_function)

    def keras_route():
        keras_function(iterator)

    def fetch():
        next(iterator)

    def fetch_and_function():
        function(next(iterator))

    def fetch_and_concrete():
        concrete(next(iterator))

    routes = {
        f.__name__.removesuffix("_route"): f for f in (keras_route, fetch, fetch_and_function, fetch_and_concrete)
    }
    per_step: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(args.rounds):
        for name, route in routes.items():
            t = time.thread_time()
            for _ in range(args.steps):
                route()
            per_step[name].append(1e6 * (time.thread_time() - t) / args.steps)
    rows = {
        name: {"fastest_us": round(min(v), 1), "rounds_us": [round(u, 1) for u in v]} for name, v in per_step.items()
    }
    print("training-thread CPU per step, fastest of", args.rounds, "rounds (us)")
    for name, row in rows.items():
        print(f"  {name:20s} {row['fastest_us']:8.1f}")
    write_json(
        args.out,
        {
            "what": __doc__.split("\n\n")[0],
            "versions": {
                "python": platform.python_version(),
                "keras": keras.__version__,
                "tensorflow": tf.__version__,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            },
            "args": vars(args),
            "routes": rows,
        },
    )


if __name__ == "__main__":
    main()
