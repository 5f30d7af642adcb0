"""The memory verdict's rules: grows or stable, the cause and its fix, when memory runs out."""

import re

import pytest

from keras_gpu_tools.leaks import advice
from keras_gpu_tools.leaks.fits import FitGrowth
from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import Slope
from keras_gpu_tools.leaks.summary import summary_text
from keras_gpu_tools.leaks.track import EpochTrack, Growth
from keras_gpu_tools.leaks.verdict import GROWS, STABLE, UNKNOWN, Context, judge


def ctx(**kw):
    base = dict(threshold_mib=0.25, fit_threshold_mib=1.0, warmup_epochs=1, host_available=8 * 2**30)
    base.update(kw)
    return Context(**base)


def rising(x):
    return Slope(x, 1.0, 9, confidence=0.999)


def test_too_few_epochs_claim_nothing():
    v = judge(Growth(epochs=2), FitGrowth(fits=1), ctx())
    assert v.category == UNKNOWN and v.host_mib_per_epoch is None
    assert "3 needed" in v.message


def test_tensors_kept_grow_with_the_bytes_and_the_host_runs_out_at_that_rate():
    g = Growth(epochs=9, host=rising(24.0), tensors=rising(1.0), tensor_mib=rising(24.0))
    v = judge(g, FitGrowth(fits=1), ctx(seconds_per_epoch=60.0, epochs_left=10))
    assert v.category == GROWS and v.causes == [advice.TENSORS_KEPT]
    assert "24.0 MiB per epoch" in v.message and "about 341 epochs" in v.message
    assert any("240 MiB" in x for x in v.exhaustion)
    assert "float(x)" in v.advice[0]


def test_tensors_kept_are_named_by_their_bytes_when_freed_ones_hide_their_count():
    # Two heap counts: the tensors the fit freed between them offset the one kept each epoch.
    g = Growth(epochs=9, host=rising(24.0), tensors=Slope(0.0, 0.0, 2), tensor_mib=Slope(24.0, 1.0, 2))
    v = judge(g, FitGrowth(fits=1), ctx())
    assert v.causes == [advice.TENSORS_KEPT], v.evidence
    assert any("+0 tensors per epoch): 100% of the growth" in e for e in v.evidence)


def test_tensor_bytes_below_half_the_growth_are_not_its_cause():
    g = Growth(epochs=9, host=rising(24.0), tensors=rising(1.0), tensor_mib=rising(6.0))
    assert advice.TENSORS_KEPT not in judge(g, FitGrowth(fits=1), ctx()).causes


def test_a_flat_run_is_stable_with_no_cause():
    v = judge(Growth(epochs=9, host=Slope(0.3, 0.55, 9), device=Slope(0.0, 0.0, 9)), FitGrowth(fits=1), ctx())
    assert v.category == STABLE and v.causes == [] and "stable" in v.message


def test_a_retrace_per_epoch_is_named_when_compiled_functions_grow_with_memory():
    g = Growth(epochs=9, host=rising(10.0), compiled=rising(1.0))
    v = judge(g, FitGrowth(fits=1), ctx())
    assert advice.RETRACE in v.causes


def test_a_tf_data_cache_filling_is_named_when_no_tensor_explains_the_growth():
    v = judge(Growth(epochs=9, host=rising(50.0)), FitGrowth(fits=1), ctx(pipeline_cache=True))
    assert v.causes == [advice.DATA_CACHE]


def test_the_allocators_cache_is_not_a_leak():
    g = Growth(epochs=9, device=Slope(0.0, 0.4, 9), reserved=rising(64.0))
    v = judge(g, FitGrowth(fits=1), ctx(allocator_note="torch's caching allocator keeps freed blocks"))
    assert v.category == STABLE and v.causes == [advice.ALLOCATOR_CACHE]
    assert "not a leak" in v.message and any("torch's caching allocator" in e for e in v.evidence)


def test_device_exhaustion_per_device():
    last = Reading(9, 0.0, in_use={0: 1000 * MIB})
    g = Growth(epochs=9, device=rising(64.0), devices={0: rising(64.0)})
    v = judge(g, FitGrowth(fits=1), ctx(last=last, device_limits={0: 2000 * MIB}))
    assert any("device 0" in x and "about 16 epochs" in x for x in v.exhaustion)
    assert v.causes == [advice.UNKNOWN]


def test_growth_per_fit_with_new_models_and_no_clear_session():
    fg = FitGrowth(fits=10, host=rising(7.0), new_models=9, uncleared=9, named_per_fit=9)
    v = judge(Growth(epochs=1), fg, ctx())
    assert v.category == GROWS and v.causes == [advice.CLEAR_SESSION]
    assert "7.0 MiB per fit" in v.message and "clear_session()" in v.advice[0]
    text = summary_text(v, [], [])
    assert "Memory: grows" in text and "clear_session" in text


def test_growth_per_fit_with_the_session_cleared_is_not_blamed_on_clear_session():
    fg = FitGrowth(fits=10, host=rising(3.6), new_models=9, cleared=9)
    v = judge(Growth(epochs=1), fg, ctx())
    assert advice.CLEAR_SESSION not in v.causes and v.causes == [advice.FRAMEWORK_PER_FIT]


@pytest.mark.parametrize("per_fit", [0.2, 5.0])
def test_no_growth_per_fit_means_no_clear_session_cause(per_fit):
    fg = FitGrowth(fits=10, host=Slope(per_fit, 0.5, 10), new_models=9, uncleared=9)
    v = judge(Growth(epochs=1), fg, ctx())
    assert v.category == STABLE and advice.CLEAR_SESSION not in v.causes
    assert any("clear_session" in e for e in v.evidence)  # still said, as evidence


# Host RSS (MiB) at each epoch's end of real 30-epoch fits on the 2-core CPU (benchmarks/leak_verdict.py):
# the decision is tested on them here, the fits themselves measured there.
CLEAN_JAX = [798.781, 798.863, 798.863, 798.863, 799.062, 799.07, 799.07, 799.074, 799.078, 799.082, 799.086, 799.09, 799.172, 799.18, 799.211, 799.23, 799.242, 799.289, 799.297, 799.312, 799.316, 799.32, 799.328, 799.332, 799.352, 799.352, 799.352, 799.355, 799.359, 799.363]  # fmt: skip
TF_DATA_CACHE_JAX = [806.934, 807.156, 807.422, 807.699, 807.949, 807.969, 808.004, 808.043, 808.066, 808.098, 808.121, 808.168, 808.25, 808.262, 808.32, 808.332, 808.355, 808.375, 808.383, 808.465, 808.488, 808.504, 808.523, 808.543, 808.559, 808.574, 808.602, 808.633, 808.645, 808.66]  # fmt: skip
BOUNDED_CACHE_JAX = [798.441, 800.496, 802.578, 804.582, 806.785, 808.789, 810.797, 812.816, 812.816, 812.809, 812.816, 812.812, 812.875, 812.879, 812.902, 812.934, 812.938, 814.945, 814.945, 814.945, 814.945, 814.945, 814.957, 814.965, 814.965, 816.977, 816.98, 816.98, 816.984, 816.984]  # fmt: skip
BOUNDED_CACHE_TF = [702.359, 704.551, 706.59, 708.621, 710.832, 712.852, 714.871, 716.914, 716.914, 716.926, 716.93, 716.926, 717.008, 717.02, 717.039, 717.051, 717.055, 719.066, 719.066, 719.07, 719.078, 719.086, 719.094, 719.102, 719.105, 719.109, 719.117, 719.133, 719.145, 719.152]  # fmt: skip
LEAK_HALF_TF = [703.723, 704.418, 704.977, 705.527, 706.242, 706.777, 707.281, 707.812, 708.316, 708.816, 709.324, 709.824, 710.414, 710.926, 711.441, 711.965, 712.469, 712.973, 713.477, 713.977, 714.484, 714.996, 715.504, 716.023, 716.531, 717.031, 717.535, 718.055, 718.559, 719.066]  # fmt: skip
LEAK_ONE_JAX = [799.922, 801.008, 802.012, 803.012, 804.203, 805.207, 806.223, 807.223, 808.223, 809.227, 810.23, 811.23, 812.309, 813.312, 814.355, 815.359, 816.379, 817.449, 818.449, 819.453, 820.48, 821.488, 822.504, 823.531, 824.543, 825.547, 826.551, 827.551, 828.551, 829.555]  # fmt: skip


def _judged(rss, epochs=None, host_available=40 * 2**30):
    track = EpochTrack(1, Reading(-1, 0.0, host_rss=rss[0] * MIB))
    for e, mib in enumerate(rss[:epochs]):
        track.add(Reading(e, 10.0 * (e + 1), host_rss=mib * MIB))
    return judge(track.growth(), FitGrowth(fits=1), ctx(host_available=host_available))


@pytest.mark.parametrize("rss", [CLEAN_JAX, TF_DATA_CACHE_JAX, BOUNDED_CACHE_JAX, BOUNDED_CACHE_TF])
def test_a_clean_fit_a_cache_that_fills_and_holds_and_a_bounded_cache_are_stable(rss):
    v = _judged(rss)
    assert v.category == STABLE and v.grows == [], v.message


@pytest.mark.parametrize("rss, rate", [(LEAK_HALF_TF, 0.5), (LEAK_ONE_JAX, 1.0)])
def test_a_steady_leak_of_any_size_grows_at_its_rate_and_says_how_long_memory_lasts(rss, rate):
    v = _judged(rss)
    assert v.category == GROWS and v.host_mib_per_epoch == pytest.approx(rate, rel=0.2), v.message
    assert v.message.startswith(f"Host memory grows slowly: {rate:.2g}")
    lasts = float(re.search(r"host memory lasts ([\d,]+) epochs", v.message)[1].replace(",", ""))
    assert lasts == pytest.approx(40 * 1024 / v.host_mib_per_epoch, rel=0.01)  # 40 GiB available
    assert v.message.count("epochs at that rate") == 1 and "runs out" not in v.message  # said once
    assert any("certain and steady" in e for e in v.evidence)


def test_the_floor_leaves_out_a_certain_rise_under_it():
    assert _judged(LEAK_HALF_TF).category == GROWS
    track = EpochTrack(1, Reading(-1, 0.0, host_rss=700 * MIB))
    for e, mib in enumerate(LEAK_HALF_TF):
        track.add(Reading(e, 10.0 * (e + 1), host_rss=mib * MIB))
    v = judge(track.growth(), FitGrowth(fits=1), ctx(threshold_mib=1.0))
    assert v.category == STABLE and "under 1 MiB per epoch" in v.message


def test_three_epochs_after_the_warm_up_are_enough_for_a_steady_rise_two_are_not():
    assert _judged(LEAK_ONE_JAX, epochs=4).category == GROWS  # epochs 2-4 after the warm-up
    assert _judged(LEAK_ONE_JAX, epochs=3).category == UNKNOWN


def test_noise_is_not_certain():
    import random

    rng = random.Random(3)
    rss = [800 + rng.gauss(0, 2.0) for _ in range(30)]
    assert _judged(rss).category == STABLE


def test_a_leak_whose_first_epochs_rose_faster_still_grows_while_its_later_half_rises_well_over_the_floor():
    # 6 MiB an epoch, then 2.5: the later half at under half the earlier rate, but ten times the floor (0.25)
    rss = [700 + 6 * e for e in range(15)] + [784 + 2.5 * (e + 1) for e in range(15)]
    v = _judged(rss)
    assert v.category == GROWS and v.grows == ["host per epoch"], v.message
    # the same early rise, then a later half under four times the floor: a cache that filled, not a leak
    flat = [700 + 6 * e for e in range(15)] + [784 + 0.05 * (e + 1) for e in range(15)]
    assert _judged(flat).category == STABLE
