"""find_speedups with real fits on CPU: the model exactly as before, bad input refused first, the rows, apply().

No test asserts a duration or a speed-up: the machine is shared. The decisions
are tested on fixed figures in test_rows.py; here the trials run for real,
with small models, few changes and a small `max_seconds`.
"""

import dataclasses
import random
import time
from types import SimpleNamespace

import keras
import numpy as np
import pytest
from keras import ops

from keras_gpu_tools import find_speedups
from keras_gpu_tools.memory import timed_fit
from keras_gpu_tools.speedups import finder, inputs, trials
from keras_gpu_tools.speedups import rows as R
from keras_gpu_tools.speedups.report import SpeedupReport
from keras_gpu_tools.speedups.rows import SpeedupRow
from tests.helpers.models import BACKEND
from tests.helpers.speedups import against_baseline, data, mlp
from tests.helpers.state import rng_states, values

pytestmark = pytest.mark.multibackend

# Under a minute (the CPU's short timing windows, Pace.for_device) yet ample for the few trials a test asks for,
# however slowly a loaded machine compiles: a trial the budget refuses is "not measured", not what a test reads.
BUDGET = 45


def random_states():
    states = [random.getstate(), np.random.get_state()]
    if BACKEND == "torch":
        import torch

        states.append(torch.get_rng_state())
    return states


def set_random_states(states):
    random.setstate(states[0])
    np.random.set_state(states[1])
    if BACKEND == "torch":
        import torch

        torch.set_rng_state(states[2])


@pytest.mark.slow
def test_the_rows_are_measured_on_clones_and_the_model_is_exactly_as_before():
    model = mlp()
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # a trained state, metrics set
    keras.random.normal((2,))  # Keras's global seed generator exists and has advanced
    history = model.history
    before = values(model)
    metrics = {k: float(ops.convert_to_numpy(v)) for k, v in model.get_metrics_result().items()}
    states = random_states()
    expected = rng_states()
    set_random_states(states)

    report = find_speedups(
        model, x, y, batch_size=16, max_seconds=BUDGET, changes=["batch_size", "steps_per_execution"]
    )

    kinds = [r.kind for r in report.rows]
    assert kinds == [R.BASELINE, R.CEILING, "batch_size", "steps_per_execution", R.COMBINED]
    base = report.rows[0]
    assert base.after > 0 and base.status == R.BASELINE and "compile" in base.cost
    for row in report.rows:
        assert row.status in R.STATUSES and row.change
        if row.after is not None and row.kind != R.BASELINE:
            assert against_baseline(row, base) and row.speedup == pytest.approx(row.after / row.before)
        if row.status in (R.NOT_APPLICABLE, R.NOT_MEASURED):
            assert row.reason and row.after is None
    spe = report.row("steps_per_execution")
    if BACKEND == "torch":
        assert spe.status == R.NOT_APPLICABLE and "steps_per_execution must be 1" in spe.reason
    elif spe.after is not None:
        n = spe.compile_args["steps_per_execution"]
        assert spe.code == f"model.compile(..., steps_per_execution={n})" and 256 // 16 % n == 0
    batch = report.row("batch_size")
    if batch.status in (R.PAID, R.NO_GAIN) and batch.reason == "":
        assert "learning rate" in batch.cost and "batch_size=" in batch.code
    assert str(report).startswith(f"find_speedups ({BACKEND}, cpu, ")
    # exactly as before: weights, optimizer state, the dropout's seed, the metrics, History, the random states
    for a, b in zip(values(model), before):
        np.testing.assert_array_equal(a, b)
    after = {k: float(ops.convert_to_numpy(v)) for k, v in model.get_metrics_result().items()}
    assert after == pytest.approx(metrics, rel=1e-6)
    assert model.history is history and model.steps_per_execution == 1
    assert rng_states() == expected


def test_bad_arguments_are_refused_before_any_trial(monkeypatch):
    def no_trial(*args, **kwargs):
        raise AssertionError("a trial ran")

    monkeypatch.setattr(finder, "time_fit", no_trial)
    monkeypatch.setattr(finder, "time_batch", no_trial)
    model = mlp()
    x, y = data(32)
    with pytest.raises(ValueError, match=r"argument `max_seconds`. Received: max_seconds=0"):
        find_speedups(model, x, y, max_seconds=0)
    with pytest.raises(ValueError, match=r"argument `max_seconds`"):
        find_speedups(model, x, y, max_seconds=float("nan"))
    with pytest.raises(ValueError, match=r"argument `changes`.*'xla' is not one of them"):
        find_speedups(model, x, y, changes=["xla"])
    with pytest.raises(ValueError, match=r"argument `batch_size`. Received: batch_size=0"):
        find_speedups(model, x, y, batch_size=0)
    raw = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"argument `model`.*not compiled"):
        find_speedups(raw, x, y)
    with pytest.raises(ValueError, match=r"argument `x`.*no samples"):
        find_speedups(model, x[:0], y[:0])
    with pytest.raises(ValueError, match=r"argument `y`. Received: y=None"):
        find_speedups(model, x)
    with pytest.raises(ValueError, match=r"argument `x`.*generator"):
        find_speedups(model, (b for b in [(x, y)]))

    class Empty(keras.utils.PyDataset):
        def __len__(self):
            return 0

        def __getitem__(self, i):
            raise IndexError(i)

    with pytest.raises(ValueError, match=r"argument `x`. Received: an empty Empty"):
        find_speedups(model, Empty())


def test_a_change_that_diverges_is_unsafe_never_a_speed_up(monkeypatch):
    # Inputs of 1e5 overflow float16 (largest 65504) in the first Dense: the loss is inf or NaN under
    # mixed_float16, as on a GPU with tensor cores (the machine is told it has them; the math is real).
    monkeypatch.setattr(trials, "gpu_capabilities", lambda on_gpu: [(7, 5)])
    model = mlp(scale=1e5)
    x, y = data(64)
    report = find_speedups(model, x, y, batch_size=16, max_seconds=BUDGET, changes=["mixed_precision"])
    row = report.row("mixed_precision")
    assert row.change == "mixed precision (mixed_float16)"
    assert row.status == R.UNSAFE and row.after is None and row.speedup is None
    assert "diverged" in row.check and row.check.startswith(f"loss after {R.LOSS_STEPS} steps")
    assert report.paid == [] and report.combined.status == R.NO_GAIN


def test_mixed_precision_is_not_measured_without_tensor_cores():
    model = mlp()
    x, y = data(64)
    report = find_speedups(model, x, y, batch_size=16, max_seconds=10, changes=["mixed_precision"])
    row = report.row("mixed_precision")
    assert row.status == R.NOT_MEASURED and row.reason == "no tensor cores: not measured"


@pytest.mark.skipif(BACKEND == "torch", reason="torch.compile on a CPU needs a C++ toolchain and minutes")
def test_a_change_that_raises_is_not_applicable_with_its_first_line():
    if BACKEND == "jax":  # JAX compiles the step already: not applicable, with the reason
        model = mlp()
        x, y = data(64)
        report = find_speedups(model, x, y, batch_size=16, max_seconds=BUDGET, changes=["jit_compile"])
        row = report.row("jit_compile")
        assert row.status == R.NOT_APPLICABLE and row.reason.startswith("already on")
        return
    import tensorflow as tf

    class HostOp(keras.layers.Layer):  # a NumPy function in the step: XLA cannot compile it
        def call(self, x):
            y = tf.numpy_function(lambda a: a * 2.0, [x], tf.float32)
            return tf.reshape(y, tf.shape(x))

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    model = keras.Model(inputs, keras.layers.Dense(1)(HostOp()(inputs)))
    model.compile("sgd", "mse")
    x, y = data(64)
    report = find_speedups(model, x, y, batch_size=16, max_seconds=BUDGET, changes=["jit_compile"])
    row = report.row("jit_compile")
    assert row.status == R.NOT_APPLICABLE and row.after is None
    assert row.reason.split(":")[0].endswith("Error") and "\n" not in row.reason


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile: jit_compile on torch")
def test_torch_compile_is_measured_on_a_clone_with_its_loss_checked(monkeypatch):
    import functools

    import torch

    # torch.compile's graph capture as in a user's fit, without inductor's C++ build (minutes on a CPU)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    # One Dense layer and a Dropout (its seed state): dynamo traces each layer's frames, a few seconds each
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    x, y = data()
    before = values(model)
    report = find_speedups(model, x, y, batch_size=16, max_seconds=BUDGET, changes=["jit_compile"])
    row = report.row("jit_compile")
    # Its loss check starts from the same random states as the baseline's: not a flake's "unsafe"
    assert row.status in (R.PAID, R.NO_GAIN), (row.reason, row.check)
    assert row.after is not None and row.after > 0 and "torch.compile" in row.cost
    assert row.check and "loss after" in row.check  # against the float32 baseline's
    assert row.compile_args == {"jit_compile": True} and row.code == "model.compile(..., jit_compile=True)"
    assert not getattr(model, "jit_compile", False)  # the user's model is not compiled by looking
    for a, b in zip(values(model), before):
        np.testing.assert_array_equal(a, b)
    # The clones' graphs are dropped: left in, they use up the recompile limit of Keras's one train_step
    from keras.src.backend.torch.trainer import TorchTrainer
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    assert _debug_get_cache_entry_list(TorchTrainer.train_step.__code__) == []


@pytest.mark.skipif(BACKEND != "torch", reason="torch's dropout draws from torch's global generator")
def test_each_loss_check_starts_from_the_random_state_at_the_call(monkeypatch):
    import torch

    # jit_compile=True with torch.compile made a no-op: the change's steps are the baseline's, draw for draw,
    # however many draws the timed fits between the two checks made from torch's global generator.
    monkeypatch.setattr(torch, "compile", lambda fn, *args, **kwargs: fn)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dropout(0.5), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    x, y = data()
    state = torch.get_rng_state()
    report = find_speedups(model, x, y, batch_size=16, max_seconds=BUDGET, changes=["jit_compile"])
    row = report.row("jit_compile")
    assert row.check, row.reason
    changed, base = (float(v) for v in row.check.split(" steps ")[1].split(" (")[0].split(" vs "))
    assert changed == base and "+0.0%" in row.check
    assert torch.equal(torch.get_rng_state(), state)  # put back after the checks


class Slow(keras.utils.PyDataset):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = data(64)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.003)  # a decode that waits: threads overlap it
        return self.x[8 * i : 8 * i + 8], self.y[8 * i : 8 * i + 8]


def test_a_py_dataset_is_offered_threads_then_processes():
    rows = inputs.describe(Slow(), None, None).changes(on_gpu=False)
    n = inputs.workers()
    assert [c.code.split("  #")[0] for c in rows] == [
        f"super().__init__(workers={n})",
        f"super().__init__(workers={n}, use_multiprocessing=True)",
    ]
    threads, processes = rows[0].data(), rows[1].data()
    assert (threads.workers, threads.use_multiprocessing) == (n, False)
    assert (processes.workers, processes.use_multiprocessing) == (n, True)


def test_a_py_dataset_gets_its_workers_measured_and_no_fork_where_forking_is_unsafe(monkeypatch):
    from keras_gpu_tools import backends

    # As on JAX (whose runtime threads make a fork unsafe): the processes are not measured, and never forked.
    monkeypatch.setattr(type(backends.get()), "forks_safely", False)
    model = mlp()
    dataset = Slow()
    report = find_speedups(model, dataset, max_seconds=BUDGET, changes=["input"])
    threads, processes = [r for r in report.rows if r.kind == "input"]
    assert threads.change == f"input: PyDataset workers={inputs.workers()}"
    assert threads.after is not None and threads.status in (R.PAID, R.NO_GAIN)
    assert processes.status == R.NOT_MEASURED and "may deadlock" in processes.reason and processes.after is None
    assert dataset.workers == 1 and not dataset.use_multiprocessing  # the user's dataset is untouched


def test_apply_recompiles_with_the_compile_time_changes_and_keeps_the_optimizer_state():
    if BACKEND == "torch":
        args, kind = {"jit_compile": False}, "jit_compile"  # (torch runs one step per call)
    else:
        args, kind = {"steps_per_execution": 4}, "steps_per_execution"
    model = mlp()
    x, y = data(64)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    optimizer, iterations = model.optimizer, int(ops.convert_to_numpy(model.optimizer.iterations))
    slots = [np.array(ops.convert_to_numpy(v.value)) for v in optimizer.variables]
    report = SpeedupReport(
        [
            SpeedupRow("a", kind, status=R.PAID, before=1.0, after=2.0, compile_args=args),
            SpeedupRow("b", "batch_size", status=R.PAID, before=1.0, after=2.0, code="model.fit(x, y, batch_size=64)"),
        ]
    )
    assert report.apply(model) == args
    assert model.optimizer is optimizer and getattr(model, kind) == next(iter(args.values()))
    for a, b in zip(optimizer.variables, slots):
        np.testing.assert_array_equal(ops.convert_to_numpy(a.value), b)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # trains on, from where it was
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == iterations + 4
    assert SpeedupReport([]).apply(model) == {}
    with pytest.raises(ValueError, match="argument `model`"):
        report.apply(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))


def test_a_trial_that_would_outlast_the_budget_is_not_measured(monkeypatch):
    clock = [0.0]
    real = timed_fit.time_fit

    def slow(*args, **kwargs):
        clock[0] += 1000.0  # each timed fit takes 1000 s of the finder's clock
        return real(*args, **kwargs)

    monkeypatch.setattr(finder, "time_fit", slow)
    monkeypatch.setattr(finder, "Budget", lambda s: _Budget(s, clock))
    model = mlp()
    x, y = data(64)
    report = find_speedups(model, x, y, batch_size=16, max_seconds=500, changes=["batch_size"])
    row = report.row("batch_size")
    assert row.status == R.NOT_MEASURED and row.reason.startswith("not measured: the budget of 500 s was spent")
    assert report.rows[0].after is not None  # the baseline was measured: the only trial that ran


def test_the_batch_is_planned_only_up_to_half_of_the_data(monkeypatch):
    """A batch over the data is never trained (Keras runs the data as one smaller batch): none is planned."""
    import keras_gpu_tools.planner as planner

    bounds = []

    def plan(*args, max_batch_size=None, **kwargs):
        bounds.append(max_batch_size)
        raise RuntimeError("recorded")

    monkeypatch.setattr(planner, "plan_batch_size", plan)
    x, y = data(64)
    row = find_speedups(mlp(), x, y, batch_size=16, max_seconds=BUDGET, changes=["batch_size"]).row("batch_size")
    assert bounds == [32] and row.status == R.NOT_APPLICABLE and row.reason == "RuntimeError: recorded"
    row = find_speedups(mlp(), x, y, batch_size=32, max_seconds=BUDGET, changes=["batch_size"]).row("batch_size")
    assert bounds == [32] and row.status == R.NOT_APPLICABLE  # no plan: no batch over 32 fills the data twice
    assert row.reason == "your data holds 64 samples: a batch over 32 leaves under two steps an epoch"


def test_a_plan_that_timed_no_larger_batch_is_no_verdict_on_one(monkeypatch):
    """A plan whose share ran out after the batch given chose that batch without having timed a larger one: the row
    says "not measured" and why, never that a larger batch trains no faster."""
    import keras_gpu_tools.planner as planner
    from keras_gpu_tools.memory.throughput import Candidate

    def planned(largest_measured, reason=""):
        rows = [Candidate(b, b, True, measured=b <= largest_measured, step_seconds=b / 1e4) for b in (8, 16, 32)]
        rows[2] = dataclasses.replace(rows[2], reason="" if rows[2].measured else reason)
        monkeypatch.setattr(planner, "plan_batch_size", lambda *a, **k: SimpleNamespace(batch_size=16, candidates=rows))
        x, y = data(256)
        return find_speedups(mlp(), x, y, batch_size=16, max_seconds=BUDGET, changes=["batch_size"]).row("batch_size")

    row = planned(16, "the budget of 3 s was spent")
    assert row.status == R.NOT_MEASURED and row.speedup is None
    assert row.reason == "not measured: no batch over 16 timed (the budget of 3 s was spent)"
    assert planned(16).reason == "not measured: no batch over 16 timed (none was timed)"
    row = planned(32)  # 32 timed, and no faster a sample: the knee at the batch given
    assert row.status == R.NO_GAIN and row.reason.startswith("the plan, 16, is not larger than your batch of 16")


def test_the_samples_of_a_pass_bound_the_batch_where_they_are_known():
    x, y = data(100)
    assert inputs.describe(x, y, 16).largest_batch() == 50

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return x[i * 10 : (i + 1) * 10], y[i * 10 : (i + 1) * 10]

    described = inputs.describe(Batches(), None, None)
    assert described.samples == 50 and described.largest_batch() == 25


class _Budget(finder.Budget):
    def __init__(self, max_seconds, clock):
        super().__init__(max_seconds, clock=lambda: clock[0])


def test_a_tf_data_dataset_gets_its_options_and_a_prefetch_measured():
    import tensorflow as tf

    x, y = data(128)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2.0, b)).batch(16)
    report = find_speedups(mlp(), dataset, max_seconds=BUDGET, changes=["input"])
    (row,) = [r for r in report.rows if r.kind == "input"]
    assert row.change == "input: tf.data options and prefetch" and row.settings["prefetch"] == "AUTOTUNE"
    assert "dataset.with_options(options).prefetch(tf.data.AUTOTUNE)" in row.code
    assert row.after is not None and row.status in (R.PAID, R.NO_GAIN)


@pytest.mark.skipif(BACKEND != "torch", reason="a torch DataLoader: tested in the torch session")
def test_a_data_loader_gets_workers_and_persistent_workers_measured():
    import torch

    x, y = data(128)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=16
    )
    report = find_speedups(mlp(), loader, max_seconds=BUDGET, changes=["input"])
    (row,) = [r for r in report.rows if r.kind == "input"]
    n = inputs.workers()
    assert row.settings == {"num_workers": n, "pin_memory": False, "persistent_workers": True}
    assert row.code == f"DataLoader(dataset, ..., num_workers={n}, pin_memory=False, persistent_workers=True)"
    assert row.status in (R.PAID, R.NO_GAIN, R.NOT_MEASURED) and loader.num_workers == 0


def several_steps_per_call():
    from keras_gpu_tools import backends

    if not backends.get().several_steps_per_call:
        pytest.skip("this backend's Keras trainer runs one step per call")


def test_the_numerical_check_trains_each_model_the_same_steps_whole_calls_of_each():
    from keras_gpu_tools.speedups.trials import check_steps, loss_after, trial_model

    several_steps_per_call()
    base = mlp()
    several = trial_model(base, {"steps_per_execution": 12})
    assert check_steps(R.LOSS_STEPS, base, trial_model(base, {"steps_per_execution": 4})) == 8
    steps = check_steps(R.LOSS_STEPS, base, several)
    assert steps == 12  # not 8: a call of 12 steps cannot stop at 8
    x, y = data(16)
    loss_after(several, (x, y), steps)
    assert int(several.optimizer.iterations) == 12
    with pytest.raises(ValueError, match=r"steps=8: expected a positive multiple of the model's steps_per_execution"):
        loss_after(trial_model(base, {"steps_per_execution": 12}), (x, y), 8)


def a_finder(model, max_seconds=60.0, clock=None):
    from keras_gpu_tools import backends

    x, y = data(64)
    budget = finder.Budget(max_seconds) if clock is None else _Budget(max_seconds, clock)
    return finder._Finder(model, inputs.describe(x, y, 16), budget, backends.get(), ("jit_compile",))


def test_a_timing_on_the_user_s_arrays_counts_the_pass_s_smaller_last_batch():
    from keras_gpu_tools import backends

    x, y = data(64)  # at batch 12: 6 steps a pass, the last of 4 samples
    f = finder._Finder(mlp(), inputs.describe(x, y, 12), finder.Budget(60.0), backends.get(), ("jit_compile",))
    t = timed_fit.Timing(compile_seconds=0.0, step_seconds=0.5, steps=6, wall_seconds=3.0)
    assert f._sps(t) == pytest.approx(64 / 6 / 0.5)  # the user's input: 10.67 samples a step
    assert f._sps(t, repeated=True) == 24.0  # one batch repeated: every step whole
    assert f._sps(t, 32) == 64.0  # at 32 the pass is 2 whole steps


def test_a_checked_change_and_its_baseline_train_the_same_whole_calls():
    from keras_gpu_tools.speedups.trials import trial_model

    several_steps_per_call()
    model = mlp()
    f = a_finder(model)
    b = f.data.batch_size
    row, seconds = f._check(SpeedupRow("x", "combined"), trial_model(model, {"steps_per_execution": 12}))
    assert row.check.startswith("loss after 12 steps") and set(f.base_loss) == {(12, b)} and seconds > 0.0
    row, _ = f._check(SpeedupRow("y", "jit_compile"), trial_model(model, {}))
    assert row.check.startswith(f"loss after {R.LOSS_STEPS} steps")
    assert set(f.base_loss) == {(12, b), (R.LOSS_STEPS, b)}


def test_a_check_at_a_combination_s_batch_trains_on_a_batch_of_that_size(monkeypatch):
    """So that the step it compiles is the one the combination's timed fit runs."""
    from keras_gpu_tools.speedups import trials

    model = mlp()
    f = a_finder(model)
    sizes = []
    real = trials.loss_after

    def loss_after(m, batch, steps, **kwargs):
        sizes.append(len(batch[0]))
        return real(m, batch, steps, **kwargs)

    monkeypatch.setattr(finder, "loss_after", loss_after)
    b = 2 * f.data.batch_size
    row, _ = f._check(SpeedupRow("x", "combined"), trials.trial_model(model, {}), batch=b)
    assert sizes == [b, b] and set(f.base_loss) == {(R.LOSS_STEPS, b)} and row.check


def test_a_trial_counts_its_check_s_compile_and_a_combination_its_parts_longest(monkeypatch):
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile = 10.0, 2.0  # the baseline: 2 s of compile, 8 s of steady windows
    # Until a timed fit has shown that it finds the step its check compiled, the check's compile is counted as
    # one more: 10 + 28 + (2 + 28), and the baseline's own check at that batch (2 s).
    assert f._expected(28.0, check=True) == 70.0
    # The check's fit compiled the step (30 s): the timed fit found it compiled (0.01 s).
    monkeypatch.setattr(finder._Finder, "_check", lambda self, row, model, batch=None: (row, 30.0))
    quick = timed_fit.Timing(compile_seconds=0.01, step_seconds=0.01, steps=10, wall_seconds=1.0, windows=2)
    monkeypatch.setattr(finder._Finder, "_time", lambda self, model, inputs, shares=1: quick)
    f._trial(SpeedupRow("jit_compile=True", "jit_compile"), lambda: (None, None), check=True)
    assert f.compiles == {"jit_compile=True": 28.0} and f.check_reused
    # A checked combination with it: its windows once, one compile of 2 + 28 s, the baseline's check: 40 s.
    clock[0] = 59.0  # 41 s left: it starts
    assert f._refused(extra=28.0, check=True) is None
    clock[0] = 61.0  # 39 s left: it would overrun
    assert "about 40.0 s" in f._refused(extra=28.0, check=True)
    # At 3 steps a call the check trains 9 steps: the baseline's loss after 9 is not known, one more compile.
    f.base_loss[8, f.data.batch_size] = (1.0, 2.0)
    assert f._expected(28.0, check=True) == 38.0 and f._expected(28.0, check=True, per_call=3) == 40.0
    # A timed fit that compiled the step again after its check: later checks count that compile again.
    slow = dataclasses.replace(quick, compile_seconds=30.0)
    monkeypatch.setattr(finder._Finder, "_time", lambda self, model, inputs, shares=1: slow)
    f._trial(SpeedupRow("mixed precision", "mixed_precision"), lambda: (None, None), check=True)
    assert not f.check_reused and f._expected(28.0, check=True) == 68.0


KINDS = [R.CEILING, "batch_size", "steps_per_execution", "jit_compile", "mixed_precision", R.COMBINED]


def fake_trials(monkeypatch, timing: timed_fit.Timing) -> list[str]:
    """Every trial replaced by one that lists its kind (returned, in the order run) and adds a row; each timing
    gives ``timing``."""
    ran: list[str] = []

    def trial(kind):
        def run(self, *args):
            ran.append(kind)
            self.rows.append(SpeedupRow(kind, kind))

        return run

    for kind in KINDS:
        method = {R.CEILING: "_ceiling", R.COMBINED: "_combined"}.get(kind, f"_{kind}")
        monkeypatch.setattr(finder._Finder, method, trial(kind))
    monkeypatch.setattr(finder._Finder, "_again", lambda self, model: None)
    monkeypatch.setattr(finder._Finder, "_time", lambda self, model, inputs, shares=1: timing)
    return ran


def test_the_trials_that_compile_anew_run_first_and_the_rows_follow_the_guides_order(monkeypatch):
    """jit_compile and mixed precision first, so that the combination's longest compile is known early."""
    from keras_gpu_tools import backends

    ran = fake_trials(
        monkeypatch, timed_fit.Timing(compile_seconds=0.0, step_seconds=0.01, steps=10, wall_seconds=1.0, windows=2)
    )
    x, y = data(64)
    wanted = ("batch_size", "steps_per_execution", "jit_compile", "mixed_precision")
    rows = finder._Finder(mlp(), inputs.describe(x, y, 16), finder.Budget(60.0), backends.get(), wanted).run()
    assert ran == [R.CEILING, "jit_compile", "mixed_precision", "batch_size", "steps_per_execution", R.COMBINED]
    assert [r.kind for r in rows] == [R.BASELINE, *KINDS]


def test_a_trial_is_expected_to_take_windows_as_long_as_the_baseline_s_even_under_the_pace_s_length(monkeypatch):
    """Windows capped at a short pass (0.1 s of a 1 s GPU pace): the trials are expected to take the warm-up and
    the fewest windows at 0.1 s each, not at the pace's length."""
    from keras_gpu_tools import backends

    short = timed_fit.Timing(compile_seconds=2.0, step_seconds=0.001, steps=200, wall_seconds=3.0, windows=2)
    fake_trials(monkeypatch, short)
    x, y = data(64)
    f = finder._Finder(mlp(), inputs.describe(x, y, 16), finder.Budget(60.0), _OnDevice(backends.get(), ["gpu:0"]), ())
    f.run()
    least = (f.pace.min_windows + 1) * 0.1
    assert f.pace.epoch_seconds == finder.GPU_WINDOW
    assert f.expected == pytest.approx(finder.expected_seconds([(2.0, 2.0 + least)]))


def test_the_combination_s_seconds_are_kept_from_the_other_trials_shares():
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile, f.left, f.window = 10.0, 2.0, 5, 1.5  # four trials and the combination left
    f.compiles = {"jit_compile=True": 28.0}
    assert f._kept() == 0.0 and f._share() == 100.0 / 5  # a search of one change: no combination to keep for
    f.keeping = True
    # Its expected seconds and one of the baseline's windows: the trial before it ends up to a window past its share.
    assert f._kept() == 38.0 + 1.5 and f._share() == (100.0 - 39.5) / 4
    f.rows.append(SpeedupRow("jit_compile=True", "jit_compile", check="loss after 8 steps"))
    assert f._kept() == 38.0 + 2.0 + 30.0 + 1.5  # its check: the baseline's loss, and a compile not yet shown reused
    f.keeping = False  # the combination's own turn: all that is left
    f.left = 1
    assert f._share() == 100.0


def searched(f, rows, policy=None):
    """``f`` as after the single changes: the baseline (100 samples/s ±2%) and ``rows`` (change, kind, after, u)."""
    f.base = SpeedupRow(
        "baseline: the fit as given", R.BASELINE, status=R.BASELINE, after=100.0, after_uncertainty=0.02
    )
    f.rows = [f.base]
    for change, kind, after, u, settings in rows:
        row = dataclasses.replace(f._row(change, kind), settings=settings)
        f.rows.append(R.decide(row, after, u) if after is not None else row)
    f.policy = policy
    return f.rows


def timed_again(monkeypatch, samples_per_sec, uncertainty, at=None):
    """The baseline's second timing faked: ``samples_per_sec``, its windows' middle ``at`` (where given)."""
    again = timed_fit.Timing(
        compile_seconds=0.0, step_seconds=16 / samples_per_sec, steps=10, wall_seconds=1.0, uncertainty=uncertainty
    )

    def timed(self, model, inputs, shares=1):
        if at is not None:
            self.last_at = at
        return again

    monkeypatch.setattr(finder._Finder, "_time", timed)


def test_a_timing_is_placed_at_the_middle_of_its_steady_windows(monkeypatch):
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=600.0, clock=clock)
    t = timed_fit.Timing(compile_seconds=3.0, step_seconds=0.5, steps=10, wall_seconds=9.0, uncertainty=0.01)

    def fit(*args, **kwargs):
        clock[0] = 30.0  # it ends at 30 s: its 5 s of steady windows ran from 25 s
        return t

    monkeypatch.setattr(finder, "time_fit", fit)
    assert f._time(None, f.data.fit_input(1)) is t and f.last_at == pytest.approx(27.5)


def test_each_row_is_read_against_the_baseline_as_at_its_own_time(monkeypatch):
    """A host whose pace drifts over the search: each row's "before" is the baseline on the line between its two
    timings at that row's time; the combination, timed after the second, is read against that one."""
    f = a_finder(mlp(), max_seconds=600.0)
    searched(
        f,
        [
            ("jit_compile=True", "jit_compile", 108.0, 0.005, {}),  # against the mean (110) it reads 0.98x
            ("mixed precision (mixed_bfloat16)", "mixed_precision", 150.0, 0.01, {"dtype_policy": "mixed_bfloat16"}),
            ("input: workers=2", "input", 112.0, 0.01, {"workers": 2}),  # its time not known
        ],
    )
    f.base_at, f.at = 10.0, {"jit_compile=True": 20.0, "mixed precision (mixed_bfloat16)": 50.0}
    timed_again(monkeypatch, 120.0, 0.01, at=60.0)  # 100 samples/s at 10 s, 120 at 60 s
    f._again(None)
    base, jit, bf16, workers = f.rows
    assert base.after == pytest.approx(110.0) and base.after_uncertainty == pytest.approx(10 / 110)
    assert jit.before == pytest.approx(104.0) and jit.speedup == pytest.approx(108 / 104)
    assert bf16.before == pytest.approx(116.0) and bf16.before_uncertainty == base.after_uncertainty
    assert workers.before == pytest.approx(110.0)  # where its time is not known: the mean
    assert jit.status == R.NO_GAIN and bf16.paid  # decided again, within and beyond the baseline's ±9%
    combined = f._row("combined: mixed precision (mixed_bfloat16)", R.COMBINED)
    assert combined.before == pytest.approx(120.0)


def test_the_baseline_timed_again_reads_rows_of_no_known_time_against_the_mean_and_decides_them_again(monkeypatch):
    f = a_finder(mlp(), max_seconds=600.0)
    searched(
        f,
        [
            ("ceiling", R.CEILING, 150.0, 0.01, {}),
            ("jit_compile=True", "jit_compile", 107.0, 0.01, {}),  # paid against 100 alone
            ("mixed precision (mixed_bfloat16)", "mixed_precision", 130.0, 0.01, {"dtype_policy": "mixed_bfloat16"}),
            ("steps_per_execution", "steps_per_execution", None, None, {}),
        ],
        policy="mixed_bfloat16",
    )
    f.rows[1] = dataclasses.replace(f.rows[1], status=R.CEILING)
    # A batch row compared with the ceiling (step against step), whatever its figure: never re-read.
    against = dataclasses.replace(R.decide(f._row("batch size 64", "batch_size"), 180.0, 0.01), before=100.0)
    f.rows.append(against)
    f.against_ceiling.add(against.change)
    f.rows[4] = dataclasses.replace(f.rows[4], status=R.NOT_APPLICABLE)
    assert f.rows[2].paid and f.rows[3].paid
    timed_again(monkeypatch, 110.0, 0.01)  # the host's pace moved: 110 samples/s the second time
    f._again(None)
    base, ceiling, jit, bf16, skipped, batch = f.rows
    assert base.after == pytest.approx(105.0) and base.after_uncertainty == pytest.approx(5 / 105)
    assert "timed before and after the other trials: 100 then 110 samples/s" in base.cost
    for row in (ceiling, jit, bf16, skipped):
        assert row.before == base.after and row.before_uncertainty == base.after_uncertainty
    assert batch == against
    assert ceiling.status == R.CEILING and "holds back 30% of the step" in ceiling.cost
    assert jit.status == R.NO_GAIN and jit.speedup == pytest.approx(107 / 105)  # within the baseline's own spread
    assert bf16.paid and f.policy == "mixed_bfloat16"  # 1.24x: beyond it
    assert skipped.status == R.NOT_APPLICABLE


def test_two_timings_that_agree_narrow_the_baseline_and_what_then_pays_goes_into_the_combination(monkeypatch):
    f = a_finder(mlp(), max_seconds=600.0)
    rows = searched(
        f,
        [
            ("input: workers=2", "input", 104.0, 0.01, {"workers": 2}),
            ("batch size 64", "batch_size", 104.0, 0.01, {"batch_size": 64}),
            ("mixed precision (mixed_bfloat16)", "mixed_precision", 104.0, 0.01, {"dtype_policy": "mixed_bfloat16"}),
        ],
    )
    f.input_data["input: workers=2"] = data
    assert not any(r.paid for r in rows)  # +4% is within twice the noise of 100 ±2% and 104 ±1%
    timed_again(monkeypatch, 100.0, 0.02)  # the same again: the mean is known to ±1.4%
    f._again(None)
    assert f.base.after == pytest.approx(100.0) and f.base.after_uncertainty == pytest.approx(0.02 / 2**0.5)
    assert all(r.paid for r in f.rows[1:])
    assert f.input_x is data and f.batch == 64 and f.policy == "mixed_bfloat16"


def test_a_baseline_that_cannot_be_timed_again_stands_and_says_why(monkeypatch):
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile = 10.0, 2.0
    rows = searched(f, [("jit_compile=True", "jit_compile", 107.0, 0.01, {})])
    clock[0] = 95.0  # 5 s left: the 8 s of steady windows would overrun
    f._again(None)
    assert f.rows[1:] == rows[1:] and f.base.after == 100.0
    assert "not timed again after the other trials: its compile and measurement would take about 8.0 s" in f.base.cost


TWO_PAID = [
    ("jit_compile=True", "jit_compile", 150.0, 0.01, {}),
    ("steps_per_execution=8", "steps_per_execution", 140.0, 0.01, {"steps_per_execution": 8}),
]


def test_the_combination_s_seconds_refuse_a_trial_only_once_two_changes_paid():
    """Until two changes paid, a trial refused for the combination's seconds is what the combination would need:
    refused, it leaves a combination of one change, which takes no seconds. It runs; its own figure is known."""
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile, f.window, f.left = 10.0, 2.0, 1.0, 6
    f.again_kept, f.keeping, f.compiles = True, True, {"jit_compile=True": 28.0}
    searched(f, TWO_PAID[:1])
    clock[0] = 45.0  # 55 s left: a trial's 10 s fit beside the second timing's 9 s, not beside the 48 s
    assert f._kept() == pytest.approx(9.0 + 39.0) and f._refuses(10.0) is None
    assert f._share() == pytest.approx((55.0 - 48.0) / 4)  # the shares still keep them
    searched(f, TWO_PAID)
    assert (
        f._refuses(10.0)
        == "the 55.0 s left are kept for the baseline's second timing and the combination (48.0 s expected)"
    )


def test_a_combination_slower_than_one_of_its_parts_alone_is_not_paid_and_names_it(monkeypatch):
    f = a_finder(mlp(), max_seconds=600.0)
    rows = searched(
        f,
        [
            ("input: workers=2", "input", 300.0, 0.01, {"workers": 2}),
            ("steps_per_execution=8", "steps_per_execution", 125.0, 0.01, {"steps_per_execution": 8}),
        ],
    )
    f.input_data["input: workers=2"], f.input_x = data, data
    assert all(r.paid for r in rows[1:])
    timed_again(monkeypatch, 220.0, 0.01)  # the combination: 2.2x the baseline, under workers=2 alone
    f._combined()
    combined = f.rows[-1]
    assert combined.kind == R.COMBINED and combined.speedup == pytest.approx(2.2)
    assert combined.status == R.NO_GAIN
    assert combined.reason.startswith("slower than input: workers=2 alone (300 samples/s)")
    timed_again(monkeypatch, 310.0, 0.01)  # within noise of workers=2 alone: it stands
    f.rows.pop()
    f._combined()
    assert f.rows[-1].paid and f.rows[-1].reason == ""


def test_the_baseline_is_not_timed_again_in_the_seconds_kept_for_the_combination(monkeypatch):
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile, f.window, f.keeping = 10.0, 2.0, 1.0, True
    f.compiles = {"jit_compile=True": 28.0}  # the combination is expected to take 10 + 28 s, and a window
    searched(f, TWO_PAID)
    timed_again(monkeypatch, 110.0, 0.01)
    clock[0] = 55.0  # 45 s left: the 8 s of steady windows fit, but not beside the 39 s kept
    f._again(None)
    assert f.base.after == 100.0
    assert "not timed again after the other trials: the 45.0 s left are kept for the combination (39.0 s" in f.base.cost
    clock[0] = 50.0  # 50 s left: both fit
    f._again(None)
    assert f.base.after == pytest.approx(105.0)


def test_the_trials_before_the_baseline_s_second_timing_leave_it_its_seconds(monkeypatch):
    """Once the baseline is timed, the seconds of its second timing (the search's A/A) are kept until its turn, as
    the combination's are: the trials before it share what is left without them, and at its turn they are its."""
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile, f.window, f.left = 10.0, 2.0, 1.0, 5
    assert f._kept() == 0.0 and f._share() == pytest.approx(100.0 / 5)  # nothing kept before the baseline is timed
    f.again_kept = True  # as run() sets it once the baseline is timed
    assert f._kept() == pytest.approx(8.0 + 1.0)  # its steady windows and one window more
    assert f._share() == pytest.approx((100.0 - 9.0) / 4)  # shared among the other four
    f.keeping, f.compiles = True, {"jit_compile=True": 28.0}
    assert f._kept() == pytest.approx(9.0 + (10.0 + 28.0) + 1.0)  # and the combination's, a window more
    assert f._share() == pytest.approx((100.0 - 48.0) / 3)
    searched(f, [("jit_compile=True", "jit_compile", 150.0, 0.01, {})])
    timed_again(monkeypatch, 110.0, 0.01)
    clock[0] = 53.0  # 47 s left: the trial before it ran a window past its share
    f._again(None)
    assert not f.again_kept and f.base.after == pytest.approx(105.0)  # timed: its own seconds were not kept from it


def test_a_trial_that_would_eat_the_seconds_kept_for_the_end_is_not_measured_and_says_why(monkeypatch):
    """A timing cannot stop short of its warm-up and first windows: a trial run with next to no share overruns it,
    into the seconds kept for the baseline's second timing and the combination. It is refused first, as a trial that
    would outlast the budget is; the plan is never asked for a budget of nothing."""
    from keras_gpu_tools import planner

    def never(*args, **kwargs):
        raise AssertionError("a refused trial ran")

    monkeypatch.setattr(finder._Finder, "_time", never)
    monkeypatch.setattr(planner, "plan_batch_size", never)
    clock = [0.0]
    f = a_finder(mlp(), max_seconds=100.0, clock=clock)
    f.expected, f.base_compile, f.window, f.left = 10.0, 2.0, 1.0, 6
    f.again_kept, f.keeping, f.compiles = True, True, {"jit_compile=True": 28.0}
    searched(f, TWO_PAID)
    assert f._kept() == pytest.approx(9.0 + 39.0)  # the second timing's 8 s and the combination's 38 s, a window each
    clock[0] = 45.0  # 55 s left: a trial's 10 s do not fit beside the 48 s kept
    kept = "the 55.0 s left are kept for the baseline's second timing and the combination (48.0 s expected)"
    row = f._trial(f._row("input: workers=8", "input"), lambda: (f.model, f.data.fit_input()))
    assert row.status == R.NOT_MEASURED and row.after is None and row.reason == f"not measured: {kept}"
    f._batch_size(finder.trial_model(f.model))
    assert f.rows[-1].status == R.NOT_MEASURED and f.rows[-1].reason == f"not measured: {kept}"
    f.again_kept = False  # the second timing's turn: the combination's seconds alone are kept from it
    assert f._refuses(20.0) == "the 55.0 s left are kept for the combination (39.0 s expected)"
    assert f._refuses(16.0) is None
    clock[0] = 40.0  # 60 s left: a trial's 10 s fit beside the 48 s, but not the plan's and its batch's timing
    f.again_kept = True
    assert f._refused() is None
    f._batch_size(finder.trial_model(f.model))
    assert f.rows[-1].reason == f"not measured: {kept.replace('55.0', '60.0')}"


class _OnDevice:
    """The backend as on a machine with ``gpus``: only its device list differs."""

    def __init__(self, real, gpus):
        self.real, self.gpus = real, gpus

    def gpu_devices(self):
        return self.gpus

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_on_a_gpu_the_finder_times_windows_long_enough_that_the_queue_s_fill_does_not_show():
    """A window fills and drains the device's queue once: the finder's GPU windows are longer than the planner's."""
    from keras_gpu_tools import backends

    x, y = data(64)
    for gpus, pace in (([], timed_fit.Pace.for_device(False, 60.0)), (["gpu:0"], None)):
        f = finder._Finder(mlp(), inputs.describe(x, y, 16), finder.Budget(60.0), _OnDevice(backends.get(), gpus), ())
        if pace is None:
            assert f.pace.epoch_seconds == finder.GPU_WINDOW > timed_fit.Pace.for_device(True).epoch_seconds
        else:
            assert f.pace == pace


def test_the_batch_plan_inside_the_finder_times_its_candidates_at_the_finder_s_pace(monkeypatch):
    """The plan's candidates are read against the finder's ceiling (the batch row, the per-call host time): the
    same windows on both sides, and the planner's own pace again afterwards."""
    from keras_gpu_tools import planner

    seen = []

    def plan(*args, **kwargs):
        seen.append(timed_fit.current_pace(False))
        raise ValueError("max_seconds: spent")

    monkeypatch.setattr(planner, "plan_batch_size", plan)
    f = a_finder(mlp())
    f.left = 3
    f._batch_size(finder.trial_model(f.model))
    assert seen == [f.pace] and f.pace != timed_fit.Pace.for_device(False)
    assert timed_fit.current_pace(False) == timed_fit.Pace.for_device(False)
    assert f.rows[-1].status == R.NOT_MEASURED
