"""The growth rates: Theil-Sen, the warm-up left out, no rate before three epochs, the process's fits."""

import gc
import random
import statistics

import pytest

from keras_gpu_tools.leaks import fits as fits_module
from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import MAX_POINTS, evenly, theil_sen
from keras_gpu_tools.leaks.track import MIN_EPOCHS, EpochTrack
from keras_gpu_tools.logdir import schema


def test_theil_sen_ignores_an_outlier_that_moves_least_squares():
    xs = list(range(10))
    ys = [2.0 * x for x in xs]
    ys[5] += 500  # a garbage collection's spike
    s = theil_sen(xs, ys)
    assert s.per_unit == pytest.approx(2.0)
    assert s.rising > 0.8


def test_noise_around_a_flat_line_is_not_a_rise():
    ys = [100, 101, 99, 100.5, 99.5, 100, 101, 99]
    s = theil_sen(range(len(ys)), ys)
    assert abs(s.per_unit) < 0.5 and s.rising < 0.7


def test_theil_sen_gives_the_figures_of_the_pairwise_loop_exactly():
    """Median and share of rising slopes over every pair, as a loop over the pairs and statistics.median give them."""
    rng = random.Random(0)
    for _ in range(2000):
        n = rng.randint(0, MAX_POINTS)  # (more are thinned first)
        xs = [float(rng.choice([rng.randint(0, 20), rng.random() * 50])) for _ in range(n)]
        ys = [rng.choice([rng.random() * 2**33, rng.randint(-3, 3), 0.0, -0.0]) for _ in range(n)]
        slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] != xs[i]]
        s = theil_sen(xs, ys)
        if not slopes:
            assert s is None
            continue
        assert s is not None
        expected = (statistics.median(slopes), sum(v > 0 for v in slopes) / len(slopes), n)
        assert (repr(s.per_unit), repr(s.rising), s.points) == tuple(map(repr, expected[:2])) + (n,)


def test_long_series_are_thinned_to_a_bounded_cost_with_both_ends_kept():
    idx = evenly(3000)
    assert len(idx) <= MAX_POINTS and idx[0] == 0 and idx[-1] == 2999
    assert theil_sen(range(3000), [3.0 * x for x in range(3000)]).per_unit == pytest.approx(3.0)


def _reading(epoch, host_mib, device_mib=None, tensors=None):
    r = Reading(epoch, 100.0 + epoch, host_rss=host_mib * MIB)
    if device_mib is not None:
        r.in_use = {0: device_mib * MIB}
    r.tensors = tensors
    return r


def test_the_warm_up_is_left_out_and_no_rate_is_claimed_before_three_epochs_after_it():
    track = EpochTrack(1, _reading(-1, 100))
    track.add(_reading(0, 400))  # epoch 1: compiled programs and caches, +300 MiB
    for e in range(1, MIN_EPOCHS):
        track.add(_reading(e, 400 + 24 * e))
        assert track.growth().host is None  # fewer than three epochs after the warm-up
    track.add(_reading(MIN_EPOCHS, 400 + 24 * MIN_EPOCHS))
    g = track.growth()
    assert g.host.per_unit == pytest.approx(24.0)
    assert g.warmup_host_mib == pytest.approx(300.0)
    assert g.device is None  # never read: absent, not zero
    fig = track.readings[-1].figures()
    assert schema.MEMORY_DEVICE_IN_USE_MIB not in fig and fig[schema.MEMORY_HOST_RSS_MIB] == pytest.approx(472.0)


def test_device_rates_per_device_and_tensor_rates_from_two_heap_counts():
    from keras_gpu_tools.leaks.track import Census

    track = EpochTrack(0, _reading(-1, 100, device_mib=0))
    for e in range(5):
        track.add(_reading(e, 100, device_mib=64 * (e + 1)))
    track.censuses += [Census(1, 10, 2 * 64 * MIB), Census(4, 13, 5 * 64 * MIB)]
    g = track.growth()
    assert g.device.per_unit == pytest.approx(64.0) and g.devices[0].per_unit == pytest.approx(64.0)
    assert g.tensors.per_unit == pytest.approx(1.0) and g.tensor_mib.per_unit == pytest.approx(64.0)


class _Model:
    def __init__(self, name):
        self.name = name


def _fits(store, models, named, host_mib):
    for m, n, h in zip(models, named, host_mib):
        rec = store.begin(m, n)
        rec.end = _reading(0, h)
        rec.epochs = 2


def test_models_built_without_clear_session_are_told_from_the_name_counters():
    store = fits_module.FitStore()
    models = [_Model(f"m{i}") for i in range(6)]
    _fits(store, models, [10 * (i + 1) for i in range(6)], [500 + 7 * i for i in range(6)])
    g = store.growth()
    assert g.fits == 6 and g.new_models == 5 and g.uncleared == 5 and g.named_per_fit == 10
    assert g.host.per_unit == pytest.approx(7.0)


def test_a_cleared_session_and_the_same_model_refit_are_not_uncleared():
    store = fits_module.FitStore()
    cleared = [_Model(f"m{i}") for i in range(5)]
    _fits(store, cleared, [10] * 5, [500] * 5)  # clear_session() before each: the counters start over
    g = store.growth()
    assert g.uncleared == 0 and g.cleared == 4
    same = _Model("same")
    store.clear()
    _fits(store, [same] * 5, [10, 12, 14, 16, 18], [500] * 5)
    assert store.growth().new_models == 0


def test_the_store_keeps_no_model_alive():
    store = fits_module.FitStore()
    m = _Model("m")
    store.begin(m, 1)
    del m
    gc.collect()
    assert store.records[0].model() is None
