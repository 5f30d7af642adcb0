"""The step breakdown from step records: compile calls, exact retraces, parts that add up, bounded memory."""

import sys

import pytest

from keras_gpu_tools.input import breakdown as bd
from keras_gpu_tools.input.breakdown import StepBreakdown, allreduce_seconds, traces_added
from keras_gpu_tools.input.breakdown_advice import fit_breakdown, steps_per_execution_for
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.step_record import StepRecord


def _sig(n):
    return (((n, 8), "float32"), ((n, 1), "float32"))


def _call(index, seconds, sampled=False, warmup=False, sig=None, interval=None, covers=0, dispatch=None):
    r = StepRecord(index=index, sampled=sampled, warmup=warmup, start=0.0, end=seconds, fetch=0.0)
    r.signature, r.interval, r.covers, r.dispatch = sig, interval, covers, dispatch
    return r


def _steady(step=0.010, wait=0.002, compute=0.007, other=0.001, steps=100):
    return Measurement(steps=steps, step=step, wait=wait, compute=compute, other=other)


def test_trace_counts_give_first_compilations_and_retraces_apart():
    assert traces_added(None, {1: 1}) == (1, 0)  # the first trace compiles: no retrace
    assert traces_added({}, {1: 3, 2: 1}) == (4, 2)
    assert traces_added({1: 3}, {1: 5}) == (2, 2)
    assert traces_added({1: 3}, {1: 3}) == (0, 0)
    assert traces_added({1: 3}, None) is None


def test_compile_seconds_are_the_compile_calls_beyond_a_normal_step():
    b = StepBreakdown(traces={})
    b.add(_call(0, 0.507, warmup=True))  # first call: 0.5 s of compilation in a 7 ms step
    b.add(_call(1, 0.007, sampled=True))
    b.add(_call(9, 0.207, sampled=True, warmup=True, sig=_sig(4)))  # the smaller last batch: a retrace
    e = b.end_epoch(_steady(), traces={7: 2})
    assert e.retraces == 1
    assert e.compile_seconds == pytest.approx(0.7, abs=1e-9)
    assert b.first_call_seconds == pytest.approx(0.5)
    e2 = b.end_epoch(_steady(), traces={7: 2})  # nothing new
    assert (e2.retraces, e2.compile_seconds) == (0, 0.0)


def test_retraces_on_untimed_calls_are_counted_and_their_time_found_in_the_intervals():
    b = StepBreakdown(traces={7: 1})
    for i in range(50):  # untimed calls covering 10 steps each; three of them hold a 0.3 s compilation
        lump = 0.3 if i in (5, 17, 40) else 0.0
        b.add(_call(i, 0.01, interval=10 * 0.010 + lump, covers=9))
    e = b.end_epoch(_steady(), traces={7: 4})
    assert e.retraces == 3
    assert e.compile_seconds == pytest.approx(0.9, rel=1e-6)


def test_eager_steps_compile_nothing():
    b = StepBreakdown(compiles=False)
    b.add(_call(0, 0.05, warmup=True))
    e = b.end_epoch(_steady(), traces=None)
    assert (e.compile_seconds, e.retraces) == (0.0, 0)


def test_parts_add_up_to_the_step_and_dispatch_is_carved_out_of_other():
    b = StepBreakdown()
    b.add(_call(2, 0.01, sampled=True, dispatch=0.0006))
    e = b.end_epoch(_steady(), traces=None)
    assert e.dispatch == pytest.approx(0.0006)
    assert e.other == pytest.approx(0.0004)
    assert sum(e.parts().values()) == pytest.approx(e.step, rel=0.05)
    logs = e.logs()
    parts = [schema.STEP_INPUT_MS, schema.STEP_DISPATCH_MS, schema.STEP_COMPUTE_MS, schema.STEP_OTHER_MS]
    assert sum(logs[k] for k in parts) == pytest.approx(logs[schema.STEP_STEP_MS], rel=0.05)
    assert schema.STEP_COLLECTIVE_MS not in logs and e.collective_reason is None  # one device: nothing left out


def test_collectives_are_estimated_only_with_a_known_bandwidth():
    unknown = StepBreakdown(devices=2, allreduce_bytes=100 * 2**20).end_epoch(_steady(), traces=None)
    assert unknown.collective is None and "bandwidth is unknown" in unknown.collective_reason
    assert "100.0 MiB" in unknown.collective_reason
    known = StepBreakdown(devices=4, allreduce_bytes=1e8, bandwidth=1e11).end_epoch(_steady(), traces=None)
    assert known.collective == pytest.approx(allreduce_seconds(1e8, 4, 1e11)) == pytest.approx(1.5e-3)
    assert known.compute == pytest.approx(0.007 - 1.5e-3)
    assert sum(known.parts().values()) == pytest.approx(known.step)


def test_a_retrace_storm_keeps_the_count_exact_and_memory_bounded():
    b = StepBreakdown(traces={})
    for i in range(10_000):  # every call a new shape, timed
        b.add(_call(i, 0.05, sampled=True, warmup=True, sig=_sig(i + 1)))
        b.add(_call(i, 0.01, interval=0.02 + (i % 7) * 1e-3, covers=1))
    kept = sys.getsizeof(b._calls) + sys.getsizeof(b._intervals) + sys.getsizeof(b._seen) + sys.getsizeof(b.shapes)
    assert len(b.shapes) == bd.MAX_SHAPES and len(b._seen) <= bd.MAX_SHAPES + 1
    assert len(b._calls) == bd.MAX_CALLS and len(b._intervals) == bd.MAX_INTERVALS
    assert kept < 64 * 1024
    assert b.signatures_seen == 10_000
    e = b.end_epoch(_steady(), traces={1: 10_000})
    assert e.retraces == 9_999
    assert e.compile_seconds == pytest.approx(10_000 * (0.05 - 0.007), rel=1e-6)  # the dropped ones scaled in


def test_the_largest_part_and_its_advice():
    b = StepBreakdown(traces={})
    b.compile_line = 'jax.config.update("jax_compilation_cache_dir", "...")'
    b.add(_call(0, 30.0, warmup=True))
    b.end_epoch(_steady(), traces={1: 1})
    fb = fit_breakdown(b)
    assert fb.largest == "compile" and "jax_compilation_cache_dir" in fb.advice[0]

    storm = StepBreakdown(traces={})
    storm.add(_call(0, 1.0, warmup=True, sig=_sig(32)))
    for n in range(1, 20):
        storm.add(_call(n, 1.0, sampled=True, warmup=True, sig=_sig(n)))
    storm.end_epoch(_steady(), traces={1: 20})
    fb = fit_breakdown(storm)
    assert fb.largest == "retraces" and fb.retraces == 19
    assert "(32, 8) (32, 1)" in fb.advice[0] and "drop_remainder=True" in fb.advice[0]

    host = StepBreakdown()
    host.end_epoch(_steady(step=0.010, wait=0.0, compute=0.002, other=0.008), traces=None)
    fb = fit_breakdown(host, jit_compile=False)
    assert fb.largest == "other"
    assert "steps_per_execution=40" in fb.advice[0] and "jit_compile=True" in fb.advice[1]
    assert "Step breakdown" in fb.section()[0]


def test_steps_per_execution_puts_the_host_under_a_tenth_of_compute():
    assert steps_per_execution_for(host=0.008, compute=0.002) == 40
    assert steps_per_execution_for(host=0.0001, compute=0.01) == 2
    assert steps_per_execution_for(host=1.0, compute=0.0) == 1024


def test_the_fits_parts_add_up_when_an_epoch_lacks_one():
    b = StepBreakdown()
    b.end_epoch(_steady(), traces=None)
    b.end_epoch(Measurement(steps=100, step=0.010, wait=0.002, compute=None, other=None), traces=None)
    fb = fit_breakdown(b)
    assert sum(fb.parts.values()) == pytest.approx(fb.step)
    # The second epoch is not split: what its known parts leave is `unmeasured`, not `other`.
    assert fb.parts["compute"] == pytest.approx(0.0035)


def test_a_host_bound_torch_step_is_advised_a_larger_batch():
    b = StepBreakdown(compiles=False)
    b.end_epoch(_steady(step=0.010, wait=0.0, compute=0.002, other=0.008), traces=None)
    fb = fit_breakdown(b, jit_compile=False, several_steps_per_call=False)
    assert "steps_per_execution" not in fb.advice[0] and "a batch 40 times larger" in fb.advice[0]


def test_mixed_precision_is_advised_only_where_a_gpu_has_tensor_cores():
    from keras_gpu_tools.input.breakdown_run import tensor_cores

    def compute_bound(cores):
        b = StepBreakdown()
        b.tensor_cores = cores
        b.end_epoch(_steady(step=0.010, wait=0.0, compute=0.009, other=0.001), traces=None)
        fb = fit_breakdown(b)
        assert fb.largest == "compute" and "ProfilerWindow" in fb.advice[0]
        return " ".join(fb.advice)

    for cores in (True, None):  # a GPU with them, or one whose compute capability is not known
        assert "mixed precision" in compute_bound(cores) and "tensor cores" in compute_bound(cores)
    cpu = compute_bound(False)
    assert "mixed precision" not in cpu and "tensor cores" not in cpu

    class CPUBackend:  # the framework sees no GPU: the step runs on the CPU
        def gpu_devices(self):
            return []

    assert tensor_cores(CPUBackend()) is False


def test_the_parts_cover_the_verdicts_epochs_and_compilation_the_whole_fit():
    b = StepBreakdown()
    b.add(_call(0, 2.0, warmup=True))
    b.end_epoch(_steady(step=0.050, wait=0.040, compute=0.009, other=0.001), traces={1: 1})  # a cache filling
    b.end_epoch(_steady(), traces={1: 1})
    b.end_epoch(_steady(), traces={1: 1})
    whole, steady = fit_breakdown(b), fit_breakdown(b, steady=[False, True, True])
    assert steady.step == pytest.approx(0.010) and steady.parts["input"] == pytest.approx(0.002)
    assert whole.step == pytest.approx(0.070 / 3)  # the warm-up epoch counted: what the verdict leaves out
    assert steady.compile_seconds == whole.compile_seconds
    # Flags that are not one per epoch (a one-epoch fit's windows) leave every epoch in.
    assert fit_breakdown(b, steady=[True]).step == pytest.approx(whole.step)


def test_a_step_waiting_for_input_is_never_called_compute_bound():
    def advice(wait):
        b = StepBreakdown()
        b.tensor_cores = False
        b.end_epoch(_steady(step=0.010, wait=wait, compute=0.0095 - wait, other=0.0005), traces=None)
        fb = fit_breakdown(b)
        assert fb.largest == "compute"
        return fb.advice[0]

    assert "compute-bound" in advice(0.0002)
    said = advice(0.004)  # 40% of the step waits for input, compute 55%: the input verdict says input-bound
    assert "compute-bound" not in said and "the wait for input is 40.0% of the step too" in said


def _storm_records(b, calls, compile_s, step_s, every=7, steady_sample=False):
    """A fit whose every call compiles a new shape, as the step hook records it: every ``every``-th call sampled
    (timed in full; with ``steady_sample`` a shape seen before instead, compiling nothing), the call after it on
    the full path with an interval over the fast calls up to the next sampled one. Returns (its Measurement,
    the compile seconds put in)."""
    put, untimed, steps = 0.0, 0.0, 0
    for i in range(0, calls, every):
        if steady_sample and i:
            b.add(_call(i, step_s, sampled=True, sig=_sig(1), interval=step_s))
            untimed, steps = untimed + step_s, steps + 1
        else:
            b.add(_call(i, compile_s + step_s, sampled=True, warmup=True, sig=_sig(1 if i == 0 else 1000 + i)))
            put += compile_s
        fast = min(every - 1, calls - i - 1)
        if fast:
            interval = fast * (compile_s + step_s)
            b.add(_call(i + 1, compile_s + step_s, interval=interval, covers=fast - 1))
            put, untimed, steps = put + fast * compile_s, untimed + interval, steps + fast
    # The detector's step: the non-warmup intervals over their steps, compilation on the fast path included.
    return Measurement(steps=steps, step=untimed / steps, wait=0.0, compute=step_s if steady_sample else None), put


@pytest.mark.parametrize("steady_sample", [False, True])
def test_a_storm_of_untimed_retraces_is_compile_time_named_with_shapes_and_no_steps_per_execution(steady_sample):
    b = StepBreakdown(traces={})
    m, put = _storm_records(b, 300, compile_s=0.8, step_s=0.004, steady_sample=steady_sample)
    e = b.end_epoch(m, traces={1: 300 - (42 if steady_sample else 0)})
    assert e.compile_seconds == pytest.approx(put, rel=0.1)
    assert e.step < m.step / 10  # the steady step, compilation taken out of the detector's
    fb = fit_breakdown(b)
    assert fb.largest == "retraces"
    text = " ".join(fb.advice)
    assert "drop_remainder=True" in text and "bucket" in text and "(1, 8) (1, 1)" in text
    assert "steps_per_execution" not in text


def test_untimed_retraces_are_measured_against_the_intervals_that_hold_none():
    b = StepBreakdown(traces={7: 1})
    lumps = {5: 0.3, 17: 0.3, 40: 0.3}
    for i in range(50):
        b.add(_call(i, 0.01, interval=10 * 0.010 + lumps.get(i, 0.0), covers=9))
    # The detector's step holds the three compilations: the steady step is the other intervals'.
    e = b.end_epoch(_steady(step=(50 * 0.1 + 0.9) / 500, steps=500), traces={7: 4})
    assert e.compile_seconds == pytest.approx(0.9, rel=1e-6)
    assert e.step == pytest.approx(0.010, rel=1e-6)


def test_compile_calls_past_max_calls_count_the_mean_retrace_not_the_first_call():
    b = StepBreakdown(traces={})
    b.add(_call(0, 2.007, sampled=True, warmup=True, sig=_sig(0)))
    for i in range(1, 600):
        b.add(_call(i, 0.507, sampled=True, warmup=True, sig=_sig(i)))
    e = b.end_epoch(_steady(), traces={1: 600})
    assert e.compile_seconds == pytest.approx(2.0 + 599 * 0.5, rel=1e-6)
    assert b.first_call_seconds == pytest.approx(2.0)


def test_a_step_whose_compute_is_unknown_is_not_booked_as_other():
    b = StepBreakdown()
    e = b.end_epoch(Measurement(steps=2000, step=0.010, wait=0.001, compute=None), traces=None)
    assert e.other is None and e.compute is None and e.input == pytest.approx(0.001)
    fb = fit_breakdown(b)
    assert "other" not in fb.parts and fb.parts["unmeasured"] == pytest.approx(0.009)
    assert sum(fb.parts.values()) == pytest.approx(fb.step)
    assert fb.largest is None
    text = " ".join(fb.advice)
    assert "steps_per_execution" not in text and "not measured" in text
    assert any("not split" in line for line in fb.section())
