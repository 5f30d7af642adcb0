"""plan_batch_size(objective="throughput") on CPU: candidates timed with real fits, the knee, the model put back.

A CPU reports no memory capacity: the candidates are bounded by
`max_batch_size` / `global_batch_size` (or `memory_limit_mib`). Tiny models
and few steps keep each plan to seconds.
"""

import dataclasses
import math
import random
import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_gpu_tools import OOMBatchSizeReducer, plan_batch_size
from keras_gpu_tools import planner as planner_module
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import find_runs, read_run
from keras_gpu_tools.memory import throughput_run
from keras_gpu_tools.memory.throughput import Budget, knee
from tests.helpers.models import BACKEND
from tests.helpers.state import rng_states, values
from tests.helpers.step_records import FakeClock

pytestmark = pytest.mark.multibackend


def bn_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.BatchNormalization(),  # its moving statistics change in every training step
            keras.layers.Dropout(0.3),  # draws from its SeedGenerator in every training step
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def data(n=40):
    r = np.random.RandomState(0)
    return r.rand(n, 16).astype("float32"), r.rand(n, 1).astype("float32")


@pytest.mark.slow
def test_the_plan_is_the_knee_of_measured_candidates_and_the_model_is_exactly_as_before():
    model = bn_model()
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # a trained state, non-trainable statistics and metrics set
    keras.random.normal((2,))  # Keras's global seed generator exists and has advanced
    history = model.history
    before, metrics = values(model), {k: float(ops.convert_to_numpy(v)) for k, v in model.get_metrics_result().items()}
    state = (random.getstate(), np.random.get_state())
    expected_rng = rng_states()
    random.setstate(state[0])
    np.random.set_state(state[1])
    if BACKEND == "torch":
        import torch

        torch_state = torch.get_rng_state()
        expected_rng = rng_states()
        random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(torch_state)
    from keras.src.backend.common import global_state

    seeds = global_state.get_global_attribute("global_seed_generator")
    seed_value = np.array(ops.convert_to_numpy(seeds.state.value))

    plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=math.inf, max_batch_size=16)

    sizes = [c.batch_size for c in plan.candidates]
    assert sizes == [2, 4, 8, 16]  # powers of two, never an odd size
    assert all(c.measured and c.samples_per_sec > 0 and c.compile_seconds is not None for c in plan.candidates)
    # each figure with its uncertainty, timed until known or over the most windows (a CPU's pace)
    assert all(c.uncertainty is not None and c.windows >= 2 and c.stopped in ("known", "cap") for c in plan.candidates)
    assert all(c.steps >= 2 * c.windows for c in plan.candidates)
    assert all(c.step_seconds == pytest.approx(c.batch_size / c.samples_per_sec) for c in plan.candidates)
    chosen, why = knee(plan.candidates)
    assert plan.batch_size == chosen.batch_size and plan.why == why and plan.objective == "throughput"
    text = str(plan)
    assert text.startswith(f"batch size {plan.batch_size}, objective 'throughput'")
    assert "samples/s" in text and f"*{plan.batch_size}" in text and "compile" in text
    # 40 samples hold two batches of the largest candidate: timed on them, as a fit on them reads them
    assert "on your arrays" in plan.method and plan.method in text
    # exactly as before: weights, optimizer state, BatchNormalization's statistics, the dropout's seed,
    # the metrics, History, and the global random states
    for a, b in zip(values(model), before):
        np.testing.assert_array_equal(a, b)
    after = {k: float(ops.convert_to_numpy(v)) for k, v in model.get_metrics_result().items()}
    assert after == pytest.approx(metrics, rel=1e-6)
    assert model.history is history
    np.testing.assert_array_equal(ops.convert_to_numpy(seeds.state.value), seed_value)
    assert rng_states() == expected_rng


@pytest.mark.slow
def test_a_fixed_global_batch_gets_its_fastest_split_and_the_reducer_trains_with_it():
    model = bn_model()
    x, y = data(48)
    plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=math.inf, global_batch_size=24)
    assert [c.batch_size for c in plan.candidates] == [8, 24]  # its divisors that are multiples of 8
    assert 24 % plan.batch_size == 0 and plan.micro_batches == 24 // plan.batch_size
    assert plan.global_batch_size == 24 and "global batch of 24" in plan.why
    reducer = OOMBatchSizeReducer(plan=plan)
    model.fit(x, y, batch_size=24, epochs=1, shuffle=False, verbose=0, callbacks=[reducer])
    assert reducer.events == []
    assert reducer.micro_batches == plan.micro_batches  # the same updates, split as planned
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 2


def test_a_candidate_over_the_budget_is_reported_not_measured(monkeypatch):
    real = throughput_run.time_batch

    def slow(*args, **kwargs):  # each candidate's compile "takes" 100 s: the next one would not fit in the budget
        t = real(*args, **kwargs)
        return dataclasses.replace(t, compile_seconds=100.0, wall_seconds=100.0)

    monkeypatch.setattr(throughput_run, "time_batch", slow)
    # The budget's clock stands still: only the candidates' 100 s count against it, whatever the machine's pace.
    frozen = FakeClock()
    monkeypatch.setattr(planner_module, "Budget", lambda max_seconds: Budget(max_seconds, clock=frozen))
    model = bn_model()
    x, y = data(8)  # under two batches of the largest candidate: one batch repeated, which time_batch times
    plan = plan_batch_size(model, x, y, objective="throughput", max_batch_size=8, max_seconds=60)
    assert [c.batch_size for c in plan.candidates] == [2, 4, 8]
    assert [c.measured for c in plan.candidates] == [True, False, False]
    # its compile (100 s) and at least six steps of the size measured before it
    assert re.search(r"about 100\.\d s", plan.candidates[1].reason)
    assert "the 60.0 s left of max_seconds=60" in plan.candidates[1].reason
    # too little time for two candidates: the plan is the one measured, and it says so
    assert plan.batch_size == 2 and "max_seconds=60" in str(plan)
    assert "only batch 2 was measured" in plan.why and "not a knee" in plan.why


def test_under_a_budget_the_climb_stops_where_a_doubling_gains_nothing(monkeypatch):
    real = throughput_run.time_batch

    def flat(model, batch, *args, **kwargs):  # 1,000 samples/s from batch 4 on, known to ±0.1%
        t = real(model, batch, *args, **kwargs)
        b = len(batch[0])
        sps = 500.0 * b / 2 if b < 4 else 1000.0
        return dataclasses.replace(t, step_seconds=b / sps, uncertainty=0.001)

    monkeypatch.setattr(throughput_run, "time_batch", flat)
    x, y = data(8)  # one batch repeated: time_batch times every candidate
    plan = plan_batch_size(bn_model(), x, y, objective="throughput", max_batch_size=32, max_seconds=600)
    # 2 -> 4 doubled the speed; 4 -> 8 gained nothing: 16 and 32 are not timed, and say why
    assert [(c.batch_size, c.measured) for c in plan.candidates] == [
        (2, True),
        (4, True),
        (8, True),
        (16, False),
        (32, False),
    ]
    assert "batch 8 ran +0.0% (±0.1%) against 4" in plan.candidates[3].reason
    assert "device is saturated" in plan.candidates[4].reason and plan.batch_size == 4
    # without a budget every candidate is timed
    unbounded = plan_batch_size(bn_model(), x, y, objective="throughput", max_seconds=math.inf, max_batch_size=32)
    assert all(c.measured for c in unbounded.candidates) and unbounded.batch_size == 4


def test_a_candidate_whose_steps_alone_would_outlast_the_budget_is_not_measured(monkeypatch):
    real = throughput_run.time_batch

    def slow_steps(model, batch, *args, **kwargs):  # no compile, and a step of a second per sample
        t = real(model, batch, *args, **kwargs)
        # ±5%: a flat curve not known to be flat, so the budget alone decides
        return dataclasses.replace(
            t, compile_seconds=0.0, step_seconds=float(len(batch[0])), wall_seconds=0.0, uncertainty=0.05
        )

    monkeypatch.setattr(throughput_run, "time_batch", slow_steps)
    frozen = FakeClock()
    monkeypatch.setattr(planner_module, "Budget", lambda max_seconds: Budget(max_seconds, clock=frozen))
    plan = plan_batch_size(bn_model(), *data(16), objective="throughput", max_batch_size=16, max_seconds=60)
    # A timing runs at least 6 steps: at 8 they took 6 x 8 s = 48 s, so 16 would take about 96 s.
    assert [(c.batch_size, c.measured) for c in plan.candidates] == [(2, True), (4, True), (8, True), (16, False)]
    assert "about 96.0 s" in plan.candidates[-1].reason


def test_candidates_are_timed_on_the_users_arrays_where_they_hold_two_batches_of_the_largest(monkeypatch):
    real = throughput_run.time_fit
    seen = []

    def spy(model, inputs, *args, **kwargs):
        kw = inputs.kwargs()
        seen.append((kw["batch_size"], len(kw["x"]), len(kw["y"]), inputs.batches))
        return real(model, inputs, *args, **kwargs)

    monkeypatch.setattr(throughput_run, "time_fit", spy)
    x, y = data(20)
    plan = plan_batch_size(bn_model(), x, y, objective="throughput", max_seconds=math.inf, max_batch_size=8)
    # whole batches of the arrays only (a last, smaller batch would compile anew), an even number of them
    assert seen[:3] == [(2, 20, 20, 10), (4, 16, 16, 4), (8, 16, 16, 2)]
    assert "timed with model.fit on your arrays" in plan.method
    seen.clear()
    few = plan_batch_size(bn_model(), *data(12), objective="throughput", max_seconds=math.inf, max_batch_size=8)
    assert seen == []  # 12 samples are not two batches of 8: every candidate on one batch repeated, alike
    assert "on one batch repeated" in few.method and "without your input pipeline's" in few.method


def test_a_dataset_is_planned_on_one_batch_repeated_not_timed_through(monkeypatch):
    monkeypatch.setattr(throughput_run, "time_fit", lambda *a, **k: pytest.fail("timed through the dataset"))
    x, y = data(64)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8]

    plan = plan_batch_size(bn_model(), Batches(), objective="throughput", max_seconds=math.inf, max_batch_size=4)
    assert "on one batch repeated" in plan.method


def test_after_a_candidate_runs_out_of_memory_a_finer_size_below_it_is_still_measured(monkeypatch):
    real = throughput_run.time_batch

    class OutOfMemory(Exception):
        pass

    def timed(model, batch, *args, **kwargs):  # the step takes 10 ms at every size: the curve rises to the last
        if len(batch[0]) >= 64:
            raise OutOfMemory(f"batch {len(batch[0])}")
        return dataclasses.replace(real(model, batch, *args, **kwargs), step_seconds=0.01, uncertainty=0.001)

    monkeypatch.setattr(throughput_run, "time_batch", timed)
    from keras_gpu_tools.backends import get as get_backend

    backend = type(get_backend())
    is_oom = backend.is_oom
    monkeypatch.setattr(backend, "is_oom", lambda self, e: isinstance(e, OutOfMemory) or is_oom(self, e))
    plan = plan_batch_size(bn_model(), *data(), objective="throughput", max_seconds=math.inf, max_batch_size=128)
    rows = {c.batch_size: c for c in plan.candidates}
    assert not rows[64].measured and "ran out of memory when trained" in rows[64].reason
    assert "batch 64 ran out of memory" in rows[128].reason  # none as large is tried
    assert plan.batch_size == 32 and rows[24].measured  # the finer step below the knee, under the size that ran out


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow's CPU allocator keeps no statistics by default")
def test_a_memory_search_over_its_share_of_the_budget_stops_with_what_fits_and_says_so(monkeypatch):
    # No time for the memory search: it stops after its first trial, and the plan is made from what it found.
    monkeypatch.setattr(planner_module, "MEMORY_SEARCH_SHARE", 0.0)
    plan = plan_batch_size(bn_model(), *data(), objective="throughput", memory_limit_mib=1024, max_seconds=60)
    assert [t.batch_size for t in plan.trials] == [1]
    assert plan.batch_size == 1 and [c.batch_size for c in plan.candidates] == [1]
    assert "the memory search stopped at per-device batch 1: a trial at 2 would take about" in plan.why
    assert "larger batches were not tried" in str(plan)


def test_by_throughput_planning_has_a_budget_of_two_minutes_unless_given(monkeypatch):
    budgets = []

    def spy(max_seconds):
        budgets.append(max_seconds)
        return Budget(max_seconds)

    monkeypatch.setattr(planner_module, "Budget", spy)
    x, y = data(8)
    for given in ({}, {"max_seconds": 30}, {"max_seconds": math.inf}):
        plan_batch_size(bn_model(), x, y, objective="throughput", max_batch_size=2, **given)
    assert budgets == [120.0, 30.0, None]  # math.inf: no budget, every candidate timed
    with pytest.raises(ValueError, match=r"Received: max_seconds=inf with objective='memory'"):
        plan_batch_size(bn_model(), x, y, max_batch_size=2, max_seconds=math.inf)


def test_a_budget_too_small_for_one_candidate_is_refused():
    model = bn_model()
    x, y = data()
    with pytest.raises(ValueError, match=r"Received: max_seconds=1e-06, too small to measure one candidate"):
        plan_batch_size(model, x, y, objective="throughput", max_batch_size=4, max_seconds=1e-6)


@pytest.mark.slow
def test_the_plan_is_written_to_a_log_dir_and_tensorboard_reads_its_figure(tmp_path):
    pytest.importorskip("matplotlib")
    model = bn_model()
    x, y = data()
    plan = plan_batch_size(
        model, x, y, objective="throughput", max_seconds=math.inf, max_batch_size=4, log_dir=str(tmp_path)
    )
    runs = {name: (d, files) for name, d, files in find_runs(str(tmp_path))}
    directory, files = runs[schema.PLAN_RUN]
    values_ = read_run(schema.PLAN_RUN, directory, files, [])
    assert str(plan).splitlines()[0] in values_.texts[schema.PLAN_SUMMARY][-1].text
    import json

    written = json.loads(values_.texts[schema.PLAN_SUMMARY_DATA][-1].text)
    assert written["batch_size"] == plan.batch_size and len(written["candidates"]) == 2
    assert all(c["uncertainty"] is not None for c in written["candidates"])
    sps = values_.scalars[schema.PLAN_SAMPLES_PER_SEC]
    assert list(sps.steps) == [2, 4]  # plotted against the batch size
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(directory, size_guidance={"images": 4})
    acc.Reload()
    (image,) = acc.Images(schema.PLAN_FIGURE)
    assert image.encoded_image_string.startswith(b"\x89PNG") and image.width > 100


def test_bad_arguments_and_inputs_are_refused_with_the_reason():
    model = bn_model()
    x, y = data()
    with pytest.raises(ValueError, match=r"Invalid value for argument `objective`.*'speed'"):
        plan_batch_size(model, x, y, objective="speed", memory_limit_mib=64)
    with pytest.raises(ValueError, match=r"`global_batch_size`.*objective='memory'"):
        plan_batch_size(model, x, y, global_batch_size=8, memory_limit_mib=64)
    with pytest.raises(ValueError, match=r"max_batch_size= / global_batch_size="):
        plan_batch_size(
            model, x, y, objective="throughput", max_seconds=math.inf
        )  # a CPU: nothing bounds the candidates
    with pytest.raises(ValueError, match=r"`x`.*generator"):
        plan_batch_size(
            model, ((x, y) for _ in range(3)), objective="throughput", max_seconds=math.inf, max_batch_size=4
        )
    with pytest.raises(ValueError, match=r"at least one sample"):
        plan_batch_size(model, x[:0], y[:0], objective="throughput", max_seconds=math.inf, max_batch_size=4)
    with pytest.raises(ValueError, match="needs a compiled model"):
        plan_batch_size(
            keras.Sequential([keras.Input((16,)), keras.layers.Dense(1)]),
            x,
            y,
            max_batch_size=4,
            objective="throughput",
            max_seconds=math.inf,
        )
    assert not model.optimizer.built  # nothing was built or trained


@pytest.mark.slow
def test_a_py_dataset_and_dict_inputs_are_planned_from_one_batch():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return data(8)

    model = bn_model()
    plan = plan_batch_size(model, Batches(), objective="throughput", max_seconds=math.inf, max_batch_size=4)
    assert plan.batch_size in (2, 4)
    keras.utils.set_random_seed(0)
    a, b = keras.Input((16,), name="a"), keras.Input((4,), name="b")
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([a, b]))
    dict_model = keras.Model({"a": a, "b": b}, out)
    dict_model.compile("sgd", "mse")
    x, y = data(8)
    plan = plan_batch_size(
        dict_model, {"a": x, "b": x[:, :4]}, y, objective="throughput", max_seconds=math.inf, max_batch_size=4
    )
    assert [c.batch_size for c in plan.candidates] == [2, 4]


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.data is TensorFlow's")
def test_a_tf_data_dataset_is_planned_from_one_batch():
    import tensorflow as tf

    x, y = data(16)
    model = bn_model()
    plan = plan_batch_size(
        model,
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
        objective="throughput",
        max_seconds=math.inf,
        max_batch_size=4,
    )
    assert [c.batch_size for c in plan.candidates] == [2, 4]
    with pytest.raises(ValueError, match=r"`y`.*Expected None: the dataset yields the targets"):
        plan_batch_size(
            model, tf.data.Dataset.from_tensor_slices(x).batch(8), y, objective="throughput", max_seconds=math.inf
        )


def test_an_unbatched_tf_data_dataset_is_batched_for_the_trials_or_refused_before_any():
    tf = pytest.importorskip("tensorflow")  # tf.data feeds JAX and torch models too
    r = np.random.RandomState(0)
    x, y = r.rand(16, 16).astype("float32"), r.rand(16, 1).astype("float32")
    model = bn_model()
    before = values(model)
    # single samples, as from_tensor_slices yields them: planned from a batch of its first samples
    plan = plan_batch_size(
        model,
        tf.data.Dataset.from_tensor_slices((x, y)),
        objective="throughput",
        max_seconds=math.inf,
        max_batch_size=4,
    )
    assert [c.batch_size for c in plan.candidates] == [2, 4] and all(c.measured for c in plan.candidates)
    for a, b in zip(values(model), before):
        np.testing.assert_array_equal(a, b)
    # scalar labels: every leaf's first dimension differs from a batch's
    labels = tf.data.Dataset.from_tensor_slices((x, r.randint(0, 2, 16).astype("float32")))
    plan = plan_batch_size(bn_model(), labels, objective="throughput", max_seconds=math.inf, max_batch_size=4)
    assert plan.batch_size in (2, 4)
    # a batch of one size (drop_remainder) is still a batch: the model's inputs have the same rank
    even = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    assert plan_batch_size(model, even, objective="throughput", max_seconds=math.inf, max_batch_size=4).batch_size in (
        2,
        4,
    )
    # samples that do not stack: refused naming `x`, its kind and what is expected, before any trial is built
    ragged = tf.data.Dataset.from_generator(
        lambda: ((np.ones(n, "float32"), np.float32(0)) for n in (16, 12)),
        output_signature=(tf.TensorSpec((None,), tf.float32), tf.TensorSpec((), tf.float32)),
    )
    fresh = bn_model()
    with pytest.raises(
        ValueError, match=r"argument `x`\. Received: x of type \w+ that yields single samples.*Expected a"
    ):
        plan_batch_size(fresh, ragged, objective="throughput", max_seconds=math.inf, max_batch_size=4)
    assert not fresh.optimizer.built


def test_each_candidates_mfu_is_its_hand_counted_flops_over_the_peak(monkeypatch):
    # No GPU here, so no table peak: the planner is given one. The FLOPs are the backend's own count.
    from keras_gpu_tools import planner
    from tests.helpers.models import mlp_model, mlp_step_flops

    monkeypatch.setattr(planner, "table_peak", lambda *args: 1e12)
    model = mlp_model(widths=(128, 128))
    x, y = np.random.RandomState(0).rand(64, 16).astype("float32"), np.zeros((64, 1), "float32")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    before = values(model)
    plan = plan_batch_size(model, x, y, objective="throughput", max_seconds=math.inf, max_batch_size=32)
    assert all(c.mfu is not None and c.mfu > 0 for c in plan.candidates)
    # From 16 samples on: below, XLA's count on JAX (every op) is ruled by the update's elementwise work.
    for c in (c for c in plan.candidates if c.batch_size >= 16):
        hand = mlp_step_flops(c.batch_size, widths=(128, 128)) / c.step_seconds / 1e12
        assert c.mfu == pytest.approx(hand, rel=0.10), (c.batch_size, c.mfu, hand)
    for a, b in zip(values(model), before):  # counting changed nothing the model holds
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile's cache of Keras's one train_step")
def test_a_compiled_torch_model_leaves_no_trial_graphs_in_dynamos_cache(monkeypatch):
    """Each trial batch compiles Keras's train_step again: left in, the graphs use up dynamo's recompile limit."""
    import functools

    import torch
    from keras.src.backend.torch.trainer import TorchTrainer
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    # torch.compile's graph capture as in a user's fit, without inductor's C++ build (minutes on a CPU)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", jit_compile=True)
    x, y = data(64)
    before = values(model)
    plan = plan_batch_size(model, x, y, objective="throughput", max_batch_size=2, max_seconds=30)
    assert plan.batch_size == 2 and plan.candidates[0].measured
    assert _debug_get_cache_entry_list(TorchTrainer.train_step.__code__) == []
    for a, b in zip(values(model), before):
        np.testing.assert_array_equal(a, b)
