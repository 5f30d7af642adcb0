"""The memory verdict's rules: grows or stable, the cause and its fix, when memory runs out."""

import pytest

from keras_gpu_tools.leaks import advice
from keras_gpu_tools.leaks.fits import FitGrowth
from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import Slope
from keras_gpu_tools.leaks.summary import summary_text
from keras_gpu_tools.leaks.track import Growth
from keras_gpu_tools.leaks.verdict import GROWS, STABLE, UNKNOWN, Context, judge


def ctx(**kw):
    base = dict(threshold_mib=4.0, fit_threshold_mib=1.0, warmup_epochs=1, host_available=8 * 2**30)
    base.update(kw)
    return Context(**base)


def rising(x):
    return Slope(x, 1.0, 9)


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
