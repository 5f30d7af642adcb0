"""The batch-size search, with a made-up memory model: exponential, then binary, like Lightning's binsearch."""

import numpy as np

from keras_gpu_tools.memory.search import ArraySpec, BatchPlan, Trial, TrialClock, sample_batch, search_batch_size

MiB = 2**20


def linear(per_sample_mib, fixed_mib=10, oom_above=None):
    calls = []

    def measure(b):
        calls.append(b)
        if oom_above is not None and b > oom_above:
            return None  # the trial itself ran out of memory
        return [(fixed_mib + per_sample_mib * b) * MiB]

    return measure, calls


def test_doubles_then_halves_to_the_largest_size_that_fits():
    measure, calls = linear(1.0)
    best, trials = search_batch_size(measure, [100 * MiB], tolerance=0.0)
    assert best == 90  # 10 + 90 = 100 MiB
    assert calls[:8] == [1, 2, 4, 8, 16, 32, 64, 128]  # exponential until 128 does not fit
    assert all(64 < b < 128 for b in calls[8:])  # then binary between 64 and 128
    assert [t.fits for t in trials][:8] == [True] * 7 + [False]


def test_an_out_of_memory_trial_does_not_fit_and_the_maximum_is_respected():
    measure, _ = linear(1.0, oom_above=40)
    best, trials = search_batch_size(measure, [1000 * MiB], tolerance=0.0)
    assert best == 40 and any(t.peak_bytes is None and not t.fits for t in trials)
    measure, calls = linear(0.001)
    best, _ = search_batch_size(measure, [100 * MiB], maximum=300)
    assert best == 300 and calls == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]


def test_every_device_must_fit_and_nothing_fitting_gives_zero():
    def measure(b):
        return [b * MiB, 2 * b * MiB]  # the second device holds twice as much

    best, _ = search_batch_size(measure, [100 * MiB, 100 * MiB], tolerance=0.0)
    assert best == 50
    best, trials = search_batch_size(lambda b: [10 * MiB], [1 * MiB])
    assert best == 0 and trials == [Trial(1, [10.0 * MiB], False)]


def test_the_plan_in_words():
    plan = BatchPlan(4096, 1024, 4, [70.8 * 1024] * 4, [79.1 * 1024] * 4, 0.1, "XLA", [])
    assert str(plan).startswith("batch size 4096 (1024 per device on 4 devices): predicted peak 70.8 GiB of 79.1 GiB")
    assert not BatchPlan(0, 0, 1, [], [100.0], 0.1, "trial steps").fits


def test_trial_batches_repeat_the_samples_and_shapes_only_gives_their_shapes_and_dtypes():
    r = np.random.RandomState(0)
    x = {"a": r.rand(3, 4), "b": r.randint(0, 9, (3, 2)).astype("int32")}  # float64: trained on as float32
    y = [r.rand(3, 1).astype("float32"), np.arange(3)]
    bx, by = sample_batch(x, y, 7, 3)
    assert bx["a"].dtype == np.float32 and bx["a"].shape == (7, 4)
    np.testing.assert_array_equal(bx["b"], x["b"][[0, 1, 2, 0, 1, 2, 0]])
    assert isinstance(by, list) and by[1].tolist() == [0, 1, 2, 0, 1, 2, 0]
    sx, sy = sample_batch(x, y, 10**9, 3, shapes_only=True)  # 4 GB of float32 were it built
    assert sx == {"a": ArraySpec((10**9, 4), np.dtype("float32")), "b": ArraySpec((10**9, 2), np.dtype("int32"))}
    assert sy == [ArraySpec((10**9, 1), np.dtype("float32")), ArraySpec((10**9,), by[1].dtype)]
    assert sample_batch((x["a"],), None, 5, 3, shapes_only=True) == ((ArraySpec((5, 4), np.dtype("float32")),), None)


class StepClock:
    """A clock that a trial advances by ``per_sample`` seconds per sample (a step's time grows with its batch)."""

    def __init__(self, per_sample):
        self.now, self.per_sample = 0.0, per_sample

    def __call__(self):
        return self.now


def test_a_trial_clock_stops_the_search_before_a_trial_that_would_overrun_its_share():
    clock = StepClock(0.001)
    measure, calls = linear(0.001)

    def timed(b):
        clock.now += clock.per_sample * b
        return measure(b)

    trial_clock = TrialClock(timed, 1.0, clock)
    best, trials = search_batch_size(trial_clock, [1000 * MiB], refuses=trial_clock.refuses)
    # 1 + 2 + ... + 256 samples take 0.511 s; a trial at 512 would take 0.512 s more, past the 1 s share
    assert calls == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert best == 256 and all(t.fits for t in trials)
    assert "stopped at per-device batch 256: a trial at 512 would take about 0.5 s" in trial_clock.stopped
    assert "larger batches were not tried" in trial_clock.stopped


def test_a_trial_clock_with_room_lets_the_search_finish_and_says_nothing():
    clock = StepClock(0.0)
    measure, calls = linear(1.0)
    trial_clock = TrialClock(measure, 1.0, clock)
    best, _ = search_batch_size(trial_clock, [100 * MiB], tolerance=0.0, refuses=trial_clock.refuses)
    assert best == 90 and trial_clock.stopped == ""


def test_a_search_stopped_during_the_binary_part_keeps_the_largest_size_known_to_fit():
    measure, calls = linear(1.0)
    asked = []

    def refuses(b):
        asked.append(b)
        return "spent" if len(calls) >= 9 else None

    best, trials = search_batch_size(measure, [100 * MiB], tolerance=0.0, refuses=refuses)
    assert calls[:8] == [1, 2, 4, 8, 16, 32, 64, 128] and len(calls) == 9
    assert best == max(t.batch_size for t in trials if t.fits) and 64 <= best < 100
