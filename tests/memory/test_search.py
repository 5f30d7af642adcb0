"""The batch-size search, with a made-up memory model: exponential, then binary, like Lightning's binsearch."""

from keras_gpu_tools.memory.search import BatchPlan, Trial, search_batch_size

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
