"""The batch-size row on the user's own input: each kind rebuilt at the planned batch, or refused with the reason."""

import keras
import numpy as np
import pytest

from keras_gpu_tools import find_speedups
from keras_gpu_tools.speedups import inputs, rebatch
from keras_gpu_tools.speedups import rows as R
from tests.helpers.models import BACKEND
from tests.helpers.speedups import against_baseline, data, mlp

pytestmark = pytest.mark.multibackend


class Counted(keras.utils.PyDataset):
    """Batches of 8 from 64 samples; counts the batches it was asked for."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = data(64)
        self.asked: list[int] = []

    def __len__(self):
        return 8

    def __getitem__(self, i):
        self.asked.append(i)
        return self.x[8 * i : 8 * i + 8], self.y[8 * i : 8 * i + 8]


def test_a_py_dataset_at_a_multiple_of_its_batch_joins_consecutive_batches():
    dataset = Counted(workers=3)
    described = inputs.describe(dataset, None, None)
    assert described.rebatch_refused(32) is None
    assert "4 of your batches joined" in described.rebatch_method(32)
    fit = described.fit_input(batch_size=32)
    joined = fit.kwargs()["x"]
    assert fit.batches == joined.num_batches == 2 and fit.whole_passes
    assert (joined.workers, joined.use_multiprocessing) == (3, False)  # the dataset's own workers
    dataset.asked.clear()
    bx, by = joined[1]
    assert dataset.asked == [4, 5, 6, 7]
    np.testing.assert_array_equal(bx, dataset.x[32:64])
    np.testing.assert_array_equal(by, dataset.y[32:64])
    assert np.shares_memory(bx, dataset.x)  # adjacent slices: one view, no copy


def test_batches_that_are_not_adjacent_slices_of_one_array_are_joined_by_a_copy():
    class Fresh(Counted):
        def __getitem__(self, i):
            x, y = super().__getitem__(7 - i)  # adjacent slices, in reverse order
            return x.copy() if i % 2 else x, y

    dataset = Fresh()
    joined = inputs.describe(dataset, None, None).fit_input(batch_size=16).kwargs()["x"]
    bx, by = joined[0]
    np.testing.assert_array_equal(bx, np.concatenate([dataset.x[56:64], dataset.x[48:56]]))
    np.testing.assert_array_equal(by, np.concatenate([dataset.y[56:64], dataset.y[48:56]]))
    assert not np.shares_memory(bx, dataset.x) and not np.shares_memory(by, dataset.y)


def test_a_batch_that_is_not_a_multiple_of_the_py_dataset_s_is_refused_with_the_reason():
    reason = inputs.describe(Counted(), None, None).rebatch_refused(12)
    assert reason == "batch 12 is not a multiple of your PyDataset's 8: its batches cannot be joined into it"


def test_a_planned_batch_moves_to_the_nearest_multiple_of_the_py_dataset_s_that_the_data_fills_twice():
    described = inputs.describe(Counted(), None, None)  # batches of 8, 64 samples: a batch of 32 at most
    assert [described.timeable_batch(b) for b in (12, 20, 27, 32, 60)] == [16, 24, 24, 32, 32]
    assert described.timeable_batch(27, most=30) == 24  # the plan measured nothing above 30
    assert rebatch.nearest(rebatch.PY_DATASET, 8, 12, most=15) == 12  # no multiple past 8 fits: left to be refused
    x, y = data(64)
    assert inputs.describe(x, y, 8).timeable_batch(12) == 12  # arrays are timed at any batch


def test_arrays_are_always_timed_at_the_batch():
    x, y = data(64)
    described = inputs.describe(x, y, 8)
    assert described.rebatch_refused(12) is None
    assert described.fit_input(batch_size=12).kwargs()["batch_size"] == 12
    # A pass of 64 samples at 12 is 6 steps, the last of 4: 10.67 samples a step, not 12 (a whole-pass window
    # would read 12% too fast); at 8 and 32 every step is whole.
    assert described.samples_per_step(12) == pytest.approx(64 / 6)
    assert described.samples_per_step() == 8 and described.samples_per_step(32) == 32
    dataset = keras.utils.PyDataset()  # (another input: its batches counted whole)
    assert inputs.TrainingInput(inputs.PY_DATASET, dataset, None, 16, (x, y), 4).samples_per_step(48) == 48


def test_a_tf_data_dataset_is_rebatched_as_the_row_s_code_says():
    import tensorflow as tf

    x, y = data(64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    described = inputs.describe(dataset, None, None)
    assert described.rebatch_refused(24) is None and described.rebatch_method(24) == "dataset.rebatch(24)"
    fit = described.fit_input(batch_size=24)
    batches = fit.kwargs()["x"].take(4).as_numpy_iterator()
    sizes = [len(bx) for bx, _ in batches]
    assert sizes == [24, 24, 24, 24] and fit.batches is None  # repeated: every step a whole batch, no pass end


@pytest.mark.skipif(BACKEND != "torch", reason="a torch DataLoader: tested in the torch session")
def test_a_data_loader_is_rebuilt_at_the_batch_with_its_sampler_and_workers_and_a_custom_sampler_refused():
    import torch

    x, y = data(64)
    dataset = torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y))
    sampler = torch.utils.data.SequentialSampler(dataset)
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler, drop_last=True, generator=generator)
    described = inputs.describe(loader, None, None)
    fit = described.fit_input(batch_size=24)
    rebuilt = fit.kwargs()["x"]
    assert rebuilt.batch_size == 24 and rebuilt.sampler is sampler and rebuilt.drop_last
    assert rebuilt.generator is generator and rebuilt.num_workers == 0  # the loader's own settings kept
    assert [len(bx) for bx, _ in rebuilt] == [24, 24] and fit.batches == 2  # whole batches: 16 samples left out
    custom = torch.utils.data.DataLoader(dataset, batch_sampler=[[0, 1], [2, 3]])
    reason = rebatch.why_not(inputs.DATA_LOADER, custom, 2, 4)
    assert reason is not None and "batch_sampler" in reason

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(zip(torch.tensor(x), torch.tensor(y)))

    stream = torch.utils.data.DataLoader(Stream(), batch_size=8)
    assert "IterableDataset" in rebatch.why_not(inputs.DATA_LOADER, stream, 8, 16)


def test_joined_batches_keep_none_and_each_framework_s_tensors_and_pass_the_epoch_hooks_on():
    x, y = data(64)

    class Weighted(Counted):
        def __init__(self):
            super().__init__()
            self.epochs = []

        def __getitem__(self, i):
            bx, by = super().__getitem__(i)
            return keras.ops.convert_to_tensor(bx.copy()), by, None

        def on_epoch_begin(self):
            self.epochs.append("begin")

        def on_epoch_end(self):
            self.epochs.append("end")

    dataset = Weighted()
    joined = inputs.describe(dataset, None, None).fit_input(batch_size=16).kwargs()["x"]
    bx, by, weights = joined[1]
    assert weights is None and type(bx) is type(keras.ops.convert_to_tensor(x[:1]))  # the backend's own tensor
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(bx), dataset.x[16:32])
    np.testing.assert_array_equal(by, dataset.y[16:32])
    joined.on_epoch_begin()
    joined.on_epoch_end()
    assert dataset.epochs == ["begin", "end"]


@pytest.mark.slow
def test_the_batch_row_on_a_py_dataset_is_timed_on_its_joined_batches_against_the_baseline(monkeypatch):
    from keras_gpu_tools import planner

    def plan(model, *args, **kwargs):  # the planner's choice, fixed: the row's own timing is under test
        return _Plan(32)

    monkeypatch.setattr(planner, "plan_batch_size", plan)
    dataset = Counted()
    report = find_speedups(mlp(), dataset, max_seconds=45, changes=["batch_size"])  # ample under load, under a minute
    row = report.row("batch_size")
    base = report.rows[0]
    assert row.change == "batch size 32" and "4 of your batches joined" in row.cost
    assert against_baseline(row, base)  # against the fit as given, not against one batch repeated
    assert row.before != report.row(R.CEILING).after
    assert row.after is not None and row.status in (R.PAID, R.NO_GAIN)
    assert set(dataset.asked) == set(range(8))  # the timed fit read the user's own batches, joined


def test_a_plan_off_the_py_dataset_s_multiples_is_timed_at_the_nearest_one_on_its_batches(monkeypatch):
    from keras_gpu_tools import planner

    monkeypatch.setattr(planner, "plan_batch_size", lambda model, *a, **k: _Plan(28, 56))  # 56 measured: it fits
    dataset = Counted()
    report = find_speedups(mlp(), dataset, max_seconds=45, changes=["batch_size"])
    row = report.row("batch_size")
    assert row.change == "batch size 32" and row.settings == {"batch_size": 32} and "batch_size=32" in row.code
    assert "4 of your batches joined" in row.cost and "the plan's 28" in row.cost
    assert against_baseline(row, report.rows[0])  # on the user's input, not one batch repeated
    assert row.before != report.row(R.CEILING).after
    assert row.after is not None and set(dataset.asked) == set(range(8))
    # Nothing above 28 measured (it may not fit): the multiple below it.
    monkeypatch.setattr(planner, "plan_batch_size", lambda model, *a, **k: _Plan(28))
    row = find_speedups(mlp(), Counted(), max_seconds=45, changes=["batch_size"]).row("batch_size")
    assert row.change == "batch size 24" and "3 of your batches joined" in row.cost


class _Candidate:
    def __init__(self, batch_size):
        self.batch_size, self.measured, self.step_seconds = batch_size, True, 0.01
        self.samples_per_sec, self.uncertainty = batch_size / 0.01, 0.01


class _Plan:
    def __init__(self, batch_size, *larger):
        self.batch_size = batch_size
        self.candidates = [_Candidate(b) for b in (batch_size, *larger)]


def test_one_batch_at_another_size_is_the_user_s_samples():
    """The numerical check's batch at a trial's batch size: the arrays' first samples, a dataset's first batch's
    samples repeated (its only samples at hand)."""
    x, y = data(64)
    arrays = inputs.describe(x, y, 8)
    bx, by = arrays.batch_of(24)
    np.testing.assert_array_equal(bx, x[:24])
    np.testing.assert_array_equal(by, y[:24])
    dataset = inputs.describe(Counted(), None, None)
    bx, by = dataset.batch_of(20)
    index = np.arange(20) % 8
    np.testing.assert_array_equal(bx, x[:8][index])
    np.testing.assert_array_equal(by, y[:8][index])
    assert bx.dtype == x.dtype and dataset.batch_of(8) is dataset.batch
