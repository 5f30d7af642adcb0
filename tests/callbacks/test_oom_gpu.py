"""OOMBatchSizeReducer on a real GPU (JAX and torch backends, H100/H200).

The model's hidden activation is (batch, 65536) float32, 256 KiB per sample,
and training keeps about three of them per sample: a batch of 2**19 needs
~400 GiB, far beyond an H100 (80 GB) or H200 (141 GB), while its FLOPs are
small (8 inputs), so each run takes seconds. The run recovers to the split
that fits; a reference trained directly at that split with Keras's own
gradient accumulation ends with the same weights.

Set `OUT` to a directory to get the figures as JSON (`oom_gpu_<backend>.json`). How fast the recovery is
(its seconds against a goal) is benchmarks/oom_recovery.py's to measure; these tests check what it did.
"""

import json
import os
import time

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer

pytestmark = pytest.mark.gpu

WIDTH = 65536
INPUTS = 8
BATCH = 2**19
STEPS = 3
REAL_ATTEMPT_PHASES = {"protect", "run", "explain", "free", "restore"}  # an attempt run to the error


def check_recovery(reducer, split):
    """What the recovery did, not how long it took: its attempts lead to ``split``, its phases are its kind's."""
    first = [e for e in reducer.events if not e.regrow]  # the first batch's attempts, each split once
    assert [e.failed_split for e in first[1:]] == [e.next_split for e in first[:-1]], [e.line() for e in first]
    splits = [e.failed_split for e in first] + [first[-1].next_split]
    assert splits[-1] == split and splits == sorted(set(splits)), splits  # each split larger, the last one trains
    for e in reducer.events:
        if e.kind == "predicted":  # ruled out by the memory analysis or a real error's figures: never run
            assert not {"protect", "run", "free", "restore"} & set(e.phases), e.phases
        else:
            assert REAL_ATTEMPT_PHASES <= set(e.phases), e.phases
        # The phases are consecutive laps of the attempt's clock: they add up to at most its seconds.
        assert all(v >= 0 for v in e.phases.values()) and sum(e.phases.values()) <= e.seconds + 1e-5 * len(e.phases)
    assert reducer.recovery_seconds == pytest.approx(sum(e.seconds for e in reducer.events))


def make_model(accumulation=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((INPUTS,)), keras.layers.Dense(WIDTH, activation="relu"), keras.layers.Dense(1)]
    )
    opt = keras.optimizers.SGD(1e-3, momentum=0.9, gradient_accumulation_steps=accumulation)
    model.compile(opt, "mse")
    return model


def arrays(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, INPUTS), dtype="float32")
    return x, (x.sum(1, keepdims=True) * 0.1).astype("float32")


def card():
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name
    except Exception:
        return "unknown"


class EpochClock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times = getattr(self, "times", []) + [time.perf_counter() - self.t0]


def report(name, values):
    print(f"{name}: {json.dumps(values)}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(values, f, indent=2)


def test_a_batch_too_large_for_the_card_trains_to_the_end_and_matches_the_reference(backend):
    x, y = arrays(BATCH * STEPS)
    model = make_model()
    reducer = OOMBatchSizeReducer()
    clock = EpochClock()
    t0 = time.perf_counter()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[reducer, clock])
    wall = time.perf_counter() - t0
    k = reducer.micro_batches
    assert reducer.events and k > 1, "the batch fitted: the test needs a batch larger than the card"
    # JAX (probe="auto"): every split that cannot fit is predicted from XLA's memory analysis, none
    # runs; torch: the first OOM is real, the splits its figures rule out are not run either.
    assert reducer.events[0].kind == ("predicted" if backend == "jax" else backend)
    assert all(e.kind in (backend, "predicted") for e in reducer.events[1:])
    check_recovery(reducer, k)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2 * STEPS
    assert np.isfinite(history.history["loss"]).all()

    reference = make_model(accumulation=k)
    ref_clock = EpochClock()
    reference.fit(x, y, batch_size=BATCH // k, epochs=2, shuffle=False, verbose=0, callbacks=[ref_clock])
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-5)

    report(
        f"oom_gpu_{backend}",
        {
            "card": card(),
            "backend": backend,
            "keras": keras.__version__,
            "batch_size": BATCH,
            "split": k,
            "micro_batch_size": reducer.micro_batch_size,
            "events": [e.line() for e in reducer.events],
            "recovery_seconds_failed_attempts": round(reducer.recovery_seconds, 3),
            "recovery_phases": [e.phases for e in reducer.events],
            "first_epoch_seconds": round(clock.times[0], 3),
            "second_epoch_seconds": round(clock.times[1], 3),
            "samples_per_sec_after_recovery": round(BATCH * STEPS / clock.times[1], 1),
            "reference_first_epoch_seconds": round(ref_clock.times[0], 3),
            "reference_samples_per_sec": round(BATCH * STEPS / ref_clock.times[1], 1),
            "wall_seconds": round(wall, 3),
        },
    )


def test_always_too_large_ends_with_the_clear_error_and_memory_figures(backend):
    x, y = arrays(BATCH)
    model = make_model()
    with pytest.raises(Exception) as info:
        model.fit(
            x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[OOMBatchSizeReducer(min_batch_size=BATCH // 2)]
        )
    message = str(info.value)
    assert f"Batch sizes tried: {BATCH}, {BATCH} as 2 x {BATCH // 2}" in message
    assert "memory limit" in message and "mixed precision" in message
    assert not hasattr(model.train_function, "_keras_gpu_tools_step_hook")


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="torch's goal; on JAX the conv net's recovery is the dense case's prediction, but XLA's autotuning of "
    "the split's convolutions takes minutes (compilation, not recovery: benchmarks/oom_recovery.py --model conv)",
)
def test_a_conv_net_too_large_for_the_card_recovers_within_the_goal_by_default(backend):
    # Three Conv2D layers on 128x128x3 images: about 30 MiB of activations per sample in training,
    # so 8192 needs ~240 GiB; it trains as micro-batches that fit.
    keras.utils.set_random_seed(0)
    layers = [keras.Input((128, 128, 3))]
    layers += [keras.layers.Conv2D(f, 3, padding="same", activation="relu") for f in (32, 64, 64)]
    model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(1e-3), "mse")
    n = 8192
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, 128, 128, 3), dtype="float32"), rng.standard_normal((n, 10), dtype="float32")
    reducer = OOMBatchSizeReducer()
    model.fit(x, y, batch_size=n, epochs=1, verbose=0, callbacks=[reducer])
    assert reducer.events and reducer.micro_batches > 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1
    phases = [e.phases for e in reducer.events]
    report(
        f"oom_gpu_conv_{backend}",
        {"split": reducer.micro_batches, "recovery_seconds": reducer.recovery_seconds, "phases": phases},
    )
    check_recovery(reducer, reducer.micro_batches)
    assert reducer.events[0].kind == backend  # torch: the first out-of-memory error is real
