"""Step timing, verdicts and advice, with records built from a fake clock."""

import pytest

from keras_gpu_tools.input import advice, categories, measure, summary, verdict
from keras_gpu_tools.input.steady import span_label, steady_start, warmup_reason
from keras_gpu_tools.input.timing import StepStats
from keras_gpu_tools.runtime.step_record import StepRecord
from tests.helpers.step_records import FakeClock, run_steps


def test_serial_steps_split_exactly():
    clock, stats = FakeClock(), StepStats()
    run_steps(stats, clock, 11, fetch=0.006, compute=0.003, rest=0.001)
    m = stats.measurement()
    assert m.steps == 11 and m.sampled_steps == 11
    assert m.fetch == pytest.approx(0.006)
    assert m.compute == pytest.approx(0.003)
    assert m.other == pytest.approx(0.001)
    assert m.step == pytest.approx(0.010)
    assert m.wait_fraction == pytest.approx(0.6)
    assert m.steps_per_sec == pytest.approx(100.0)
    assert m.samples_per_sec == pytest.approx(3200.0)
    logs = m.logs()
    assert logs["input/wait_ms"] == pytest.approx(6.0)
    assert logs["input/step_ms"] == pytest.approx(10.0)
    assert "throughput/mfu" not in logs  # unknown: left out, never 0


def test_warmup_steps_are_left_out():
    clock, stats = FakeClock(), StepStats()
    stats.add(StepRecord(index=0, warmup=True, start=0.0, end=5.0, fetch=1.0, compute=4.0, gap=0.0, interval=5.0))
    run_steps(stats, clock, 5, fetch=0.002, compute=0.008, rest=0.0, first_index=1)
    m = stats.measurement()
    assert m.steps == 6
    assert m.wait_fraction == pytest.approx(0.2)
    assert m.step == pytest.approx(0.010)


def test_overlap_with_device_hides_the_fetch():
    # Unsampled steps run at the device rate (10 ms) although the host
    # fetch takes 4 ms: the fetch overlaps compute, so there is no wait.
    stats = StepStats()
    for i in range(1, 21):
        sampled = i % 5 == 0
        r = StepRecord(
            index=i, sampled=sampled, fetch=0.004, start=0.0, end=0.0, interval=0.010 if not sampled else 0.0145
        )
        if sampled:
            r.compute = 0.010
            r.gap = 0.0005
        stats.add(r)
    m = stats.measurement()
    assert m.step == pytest.approx(0.010)
    assert m.overlapped
    assert m.wait == pytest.approx(0.0)
    assert m.wait_fraction == pytest.approx(0.0)
    assert categories.classify(m.wait_fraction) == categories.NOT


def test_overlap_partial_wait_is_the_excess():
    # Fetch 15 ms, compute 10 ms, overlapped: steps take 15 ms, 5 ms of wait.
    stats = StepStats()
    for i in range(1, 11):
        r = StepRecord(index=i, sampled=i == 5, fetch=0.015, start=0.0, end=0.0, interval=0.015)
        if i == 5:
            r.compute, r.gap, r.interval = 0.010, 0.0, 0.025
        stats.add(r)
    m = stats.measurement()
    assert m.step == pytest.approx(0.015)
    assert m.wait == pytest.approx(0.005)
    assert m.wait_fraction == pytest.approx(1 / 3)


def test_split_adds_up_when_a_synced_step_outlasts_the_real_one():
    # Synced steps compute in 12 ms, unsynced ones run every 9 ms (dispatch overlaps
    # compute): the device part of the real step is at most 9 ms less the wait.
    stats = StepStats()
    for i in range(1, 21):
        sampled = i % 5 == 0
        r = StepRecord(
            index=i, sampled=sampled, fetch=0.001, start=0.0, end=0.0, interval=0.009 if not sampled else 0.014
        )
        if sampled:
            r.compute, r.gap = 0.012, 0.0
        stats.add(r)
    m = stats.measurement()
    assert m.step == pytest.approx(0.009) and m.wait == pytest.approx(0.0)
    assert m.compute == pytest.approx(0.009)
    assert m.wait + m.compute + m.other == pytest.approx(m.step)


def test_a_slowed_unsynced_interval_counts_in_the_step():
    # One unsampled interval slowed (a recompilation the hook did not time): the step is the
    # unsynced calls' wall time, so step, steps/s and samples/s stay one figure over the same
    # seconds; the step breakdown takes out compile time the framework counts (test_breakdown).
    clock, stats = FakeClock(), StepStats()
    run_steps(stats, clock, 9, fetch=0.005, compute=0.005, rest=0.0, sampled=lambda i: i % 2 == 0)
    stats.add(StepRecord(index=99, fetch=0.005, start=0, end=0, interval=2.0, samples=32))
    m = stats.measurement()
    step = (4 * 0.010 + 2.0) / 5  # calls 1, 3, 5, 7 and the slowed one
    assert m.step == pytest.approx(step) and m.steps_per_sec == pytest.approx(1 / step)
    assert m.samples_per_sec == pytest.approx(32 / step)
    assert m.wait_fraction == pytest.approx(0.005 / step)
    assert m.compute == pytest.approx(0.005)


def test_compute_is_the_low_end_of_the_samples():
    # What slows a synced sample (warm-up, a recompilation, a busy host) only adds time.
    stats = StepStats()
    for c in (0.013, 0.010, 0.5):  # an early step, a steady one, a recompiled one
        stats.add(StepRecord(index=1, sampled=True, fetch=0.0, compute=c, gap=0.0, start=0, end=0))
    assert stats.measurement().compute == pytest.approx(0.010)
    for c in (0.011, 0.012, 0.010, 0.014, 0.6, 0.7):  # with more samples: the lower quartile
        stats.add(StepRecord(index=2, sampled=True, fetch=0.0, compute=c, gap=0.0, start=0, end=0))
    assert stats.measurement().compute == pytest.approx(0.0105)


def test_no_sampled_step_yet_uses_rate_and_fetch():
    stats = StepStats()
    for i in range(1, 5):
        stats.add(StepRecord(index=i, fetch=0.003, start=0, end=0, interval=0.010))
    m = stats.measurement()
    assert m.compute is None
    assert m.wait_fraction == pytest.approx(0.3)


def test_nothing_measured():
    m = StepStats().measurement()
    assert m.wait_fraction is None and m.logs() == {}
    v = verdict.verdict_for(m)
    assert v.category == categories.UNKNOWN and not v.input_bound


def test_steps_per_execution_counts_steps():
    stats = StepStats()
    stats.add(
        StepRecord(
            index=1,
            steps=4,
            sampled=True,
            fetch=0.008,
            compute=0.008,
            gap=0.004,
            start=0,
            end=0,
            interval=0.020,
            samples=128,
        )
    )
    stats.add(StepRecord(index=2, steps=4, fetch=None, start=0, end=0, interval=0.020))
    m = stats.measurement()
    assert m.steps == 8
    assert m.fetch == pytest.approx(0.002)
    assert m.compute == pytest.approx(0.002)
    assert m.step == pytest.approx(0.005)
    assert m.steps_per_sec == pytest.approx(200.0)
    assert m.samples_per_sec == pytest.approx(6400.0)  # batch size learnt from the sampled call


def test_flops_and_mfu_only_when_known():
    clock, stats = FakeClock(), StepStats()
    run_steps(stats, clock, 5, fetch=0.0, compute=0.010, rest=0.0)
    assert stats.measurement(flops_per_step=1e9).flops_per_sec == pytest.approx(1e11)
    assert stats.measurement(flops_per_step=1e9).mfu is None
    assert stats.measurement(flops_per_step=1e9, peak_flops=1e12).mfu == pytest.approx(0.1)
    assert stats.measurement(peak_flops=1e12).mfu is None


def test_mfu_over_the_devices_of_the_step():
    # The issue's case: a step over 2 GPUs counts the whole mesh's FLOPs; against one
    # GPU's peak MFU read 1.105. Against the peaks of both, it is the per-GPU figure.
    clock, stats = FakeClock(), StepStats()
    run_steps(stats, clock, 5, fetch=0.0, compute=0.010, rest=0.0)  # 100 steps/s
    peak = 1e12  # one device's
    one = stats.measurement(flops_per_step=5e9, peak_flops=peak, devices=1)
    two = stats.measurement(flops_per_step=2 * 5e9, peak_flops=2 * peak, devices=2)  # twice the work, same rate
    assert one.mfu == pytest.approx(0.5) and two.mfu == pytest.approx(one.mfu)
    assert two.flops_per_sec == pytest.approx(1e12)  # the job's: the whole step
    assert two.flops_per_sec_per_device == pytest.approx(one.flops_per_sec_per_device) == pytest.approx(5e11)
    logs = two.logs()
    assert logs["throughput/flops_per_sec_per_device"] == pytest.approx(5e11)
    assert logs["throughput/mfu"] == pytest.approx(0.5)
    # Aggregates carry the same arithmetic.
    m = measure.aggregate([two, two], flops_per_step=1e10, peak_flops=4e12, devices=4)
    assert m.flops_per_sec == pytest.approx(1e12) and m.flops_per_sec_per_device == pytest.approx(2.5e11)
    assert m.mfu == pytest.approx(0.25)
    assert measure.aggregate([two], flops_per_step=1e10, devices=2).mfu is None  # no peak: left out
    assert "throughput/flops_per_sec_per_device" not in stats.measurement().logs()


@pytest.mark.parametrize(
    "fraction, expected",
    [
        (0.0, categories.NOT),
        (0.049, categories.NOT),
        (0.05, categories.MODERATE),
        (0.199, categories.MODERATE),
        (0.2, categories.HIGH),
        (1.0, categories.HIGH),
        (None, categories.UNKNOWN),
    ],
)
def test_classify_uses_xprof_thresholds(fraction, expected):
    assert categories.classify(fraction) == expected


def test_custom_thresholds():
    assert categories.classify(0.15, moderate=0.1, high=0.3) == categories.MODERATE
    assert categories.classify(0.35, moderate=0.1, high=0.3) == categories.HIGH


@pytest.mark.parametrize("moderate, high", [(0.2, 0.05), (0.1, 0.1), (0.0, 0.2), (0.05, 1.0), ("a", 0.2), (True, 0.2)])
def test_bad_thresholds(moderate, high):
    with pytest.raises(ValueError, match="Invalid value for argument"):
        verdict.validate_thresholds(moderate, high)


def _input_bound_measurement():
    return measure.Measurement(
        steps=10, sampled_steps=5, fetch=0.008, compute=0.002, other=0.0, step=0.010, wait=0.008, wait_fraction=0.8
    )


def test_verdict_message_and_gpu_evidence():
    v = verdict.verdict_for(
        _input_bound_measurement(), gpu_means={"gpu/0/utilization_percent": 15.0, "gpu/0/memory_used_mib": 100.0}
    )
    assert v.category == categories.HIGH and v.input_bound
    assert "HIGHLY input-bound because 80.0%" in v.message
    assert any("Confirmed by the GPU" in e and "15%" in e for e in v.evidence)
    busy = verdict.verdict_for(_input_bound_measurement(), gpu_means={"gpu/0/utilization_percent": 97.0})
    assert not any("Confirmed" in e for e in busy.evidence)


def test_advice_for_tf_data_reads_the_pipeline():
    m = _input_bound_measurement()
    bare = advice.advise(
        categories.HIGH,
        m,
        {"kind": "tf.data", "ends_with_prefetch": False, "sequential_map": True, "parallel_map": False, "cache": False},
        {},
    )
    text = "\n".join(bare)
    assert "prefetch(tf.data.AUTOTUNE)" in text and "num_parallel_calls" in text and ".cache()" in text
    assert all("Addresses" in tip for tip in bare)  # each tip says which part of the wait it removes
    assert "up to 2.0 ms of the 8.0 ms wait per step (at most 1.25x faster)" in text  # prefetch hides <= compute
    tuned = advice.advise(
        categories.HIGH,
        m,
        {"kind": "tf.data", "ends_with_prefetch": True, "sequential_map": False, "parallel_map": True, "cache": True},
        {},
    )
    text = "\n".join(tuned)
    assert "prefetch(tf.data.AUTOTUNE)`, so" not in text and "num_parallel_calls=tf.data.AUTOTUNE` to" not in text
    assert "already prefetches, maps in parallel and caches" in text and "interleave" not in text


CACHED = {
    "kind": "tf.data",
    "ops": ["prefetch", "batch", "parallel_map", "cache", "parallel_map", "from_tensor_slices"],
    "ends_with_prefetch": True,
    "sequential_map": False,
    "parallel_map": True,
    "cache": True,
    "after_cache": ["prefetch", "batch", "parallel_map"],
    "interleave": False,
}


def test_advice_for_a_pipeline_served_from_its_cache_names_the_work_after_it():
    m = _input_bound_measurement()
    tips = advice.advise(categories.HIGH, m, CACHED, {}, {"cache_serves": True, "scope": "epochs 2-3", "gpu": True})
    text = "\n".join(tips)
    assert "interleave" not in text and "source is the limit" not in text  # nothing is read once the cache serves
    assert "Over epochs 2-3 every batch comes from the cache" in text and "(.map (parallel), .batch)" in text
    assert "Addresses all of the 8.0 ms wait" in text
    assert "Move random augmentation into the model" in text  # a map runs after the cache, on a GPU machine
    cpu_only = advice.advise(categories.HIGH, m, CACHED, {}, {"cache_serves": True, "gpu": False})
    assert not any("into the model" in t and "on the GPU" in t for t in cpu_only)


def test_advice_to_interleave_only_where_files_are_read_in_the_measured_span():
    m = _input_bound_measurement()
    records = {
        "kind": "tf.data",
        "ops": ["prefetch", "batch", "parallel_map", "tfrecord", "from_tensor_slices"],
        "ends_with_prefetch": True,
        "parallel_map": True,
        "sequential_map": False,
        "cache": False,
        "interleave": False,
    }
    assert any("interleave(" in t for t in advice.advise(categories.HIGH, m, records, {}))
    assert not any("interleave(" in t for t in advice.advise(categories.HIGH, m, dict(records, interleave=True), {}))
    cached_records = dict(records, cache=True, ops=["prefetch", "batch", "cache", "tfrecord"], after_cache=["batch"])
    assert not any(
        "interleave(" in t for t in advice.advise(categories.HIGH, m, cached_records, {}, {"cache_serves": True})
    )


def test_sequential_map_before_a_serving_cache_is_not_advised():
    m = _input_bound_measurement()
    pipe = dict(
        CACHED, sequential_map=True, ops=["prefetch", "batch", "cache", "map"], after_cache=["prefetch", "batch"]
    )
    served = advice.advise(categories.HIGH, m, pipe, {}, {"cache_serves": True})
    assert not any("num_parallel_calls" in t for t in served)  # that map does not run once the cache is full
    filling = advice.advise(categories.HIGH, m, pipe, {}, {"cache_serves": False})
    assert any("num_parallel_calls" in t for t in filling)


def test_cache_advice_says_one_epoch_never_reads_it():
    m = _input_bound_measurement()
    bare = {"kind": "tf.data", "ends_with_prefetch": True, "parallel_map": True, "cache": False}
    (tip,) = [t for t in advice.advise(categories.HIGH, m, bare, {}, {"epochs": 1}) if ".cache()" in t]
    assert "one epoch" in tip


def test_workers_needed_keeps_up_with_the_device():
    m = measure.Measurement(step=0.060, compute=0.020)
    # 1 worker delivers a batch every 60 ms; 20 ms of compute: 3 keep up, a quarter more absorb uneven loads.
    assert advice.workers_needed(1, m, cores=2) == 4
    assert advice.workers_needed(0, m, cores=2) == 4  # loading in the training loop counts as one
    assert advice.workers_needed(4, measure.Measurement(step=0.021, compute=0.020), cores=2) == 6  # at least one more
    assert advice.workers_needed(1, measure.Measurement(), cores=8) == 8  # unknown compute: the cores
    assert advice.workers_needed(1, measure.Measurement(step=10.0, compute=0.001), cores=2) == 32


def test_advice_per_pipeline_kind_and_cpu():
    m = _input_bound_measurement()
    (tip,) = advice.advise(categories.HIGH, m, {"kind": "PyDataset", "workers": 1, "use_multiprocessing": False}, {})
    assert "Raise `workers` to 7 (now workers=1" in tip and "use_multiprocessing=True" in tip
    assert "steps_per_execution" in advice.advise(categories.MODERATE, m, {"kind": "arrays"}, {})[0]
    loader = advice.advise(
        categories.HIGH, m, {"kind": "torch DataLoader", "num_workers": 0}, {}, {"epochs": 3, "gpu": True}
    )
    assert "Raise `num_workers` to 7 (now 0)" in loader[0] and "persistent_workers=True" in loader[0]
    assert any("pin_memory=True" in t for t in loader)
    cpu_only = advice.advise(
        categories.HIGH, m, {"kind": "torch DataLoader", "num_workers": 0}, {}, {"epochs": 1, "gpu": False}
    )
    assert not any("pin_memory" in t or "persistent_workers" in t for t in cpu_only)
    assert "PyDataset" in advice.advise(categories.HIGH, m, {"kind": "generator"}, {})[0]
    for pipeline in ({"kind": "PyDataset", "workers": 1}, {"kind": "generator"}, {"kind": "arrays"}, {"kind": "?"}):
        assert all("Addresses" in t for t in advice.advise(categories.HIGH, m, pipeline, {}, {"epochs": 2})), pipeline
    # This process keeps the CPU busy: more workers will not help.
    cpu = advice.advise(
        categories.HIGH, m, {"kind": "PyDataset", "workers": 8}, {"process_cpu_percent": 97.0, "cpu_count": 8}
    )
    assert cpu[0].startswith("The host CPU is the limit: this process kept 97% of the 8 cores busy")
    # Other processes keep it busy: not this pipeline's limit, and said so as evidence.
    busy = {"system_cpu_percent": 99.0, "process_cpu_percent": 20.0, "cpu_count": 2}
    assert not advice.advise(categories.HIGH, m, {"kind": "PyDataset", "workers": 1}, busy)[0].startswith(
        "The host CPU"
    )
    assert (
        "Other processes kept the host CPU busy (99% in all, 20% for this one)"
        in verdict.verdict_for(m, host=busy).evidence[0]
    )
    assert advice.advise(categories.NOT, m, {"kind": "arrays"}, {}) == []


def test_summary_text_is_a_table():
    m = _input_bound_measurement()
    v = verdict.verdict_for(m, pipeline={"kind": "generator"})
    text = summary.summary_text("Run", m, v, notes=["a note"])
    assert text.startswith("Run: highly input-bound")
    assert "| wait for input / step | 80.0% |" in text and "What to change:" in text and "a note" in text


def test_dispatch_counts_as_other():
    stats = StepStats()
    stats.add(
        StepRecord(index=1, sampled=True, fetch=0.001, compute=0.002, dispatch=0.0005, gap=0.0005, start=0, end=0)
    )
    m = stats.measurement()
    assert m.other == pytest.approx(0.001)
    assert m.step == pytest.approx(0.004)


# -- GPU peaks and FLOP counting ----------------------------------------------------------
from keras_gpu_tools.telemetry import peaks as gpu_peaks  # noqa: E402


@pytest.mark.parametrize(
    "name, dtype, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA H100 NVL", "fp8", 1670.5),
        ("NVIDIA H200", "float32", 67.0),
        ("NVIDIA H200 NVL", "bfloat16", 835.5),
        ("NVIDIA A100-SXM4-80GB", "float16", 312.0),
        ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
        ("NVIDIA L40S", "fp8", 733.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA A10", "fp16", 125.0),
        ("Tesla V100-SXM2-32GB", "fp16", 125.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA RTX 6000 Ada Generation", "bf16", 364.2),
        ("NVIDIA RTX A6000", "tf32", 77.4),
    ],
)
def test_peak_table(name, dtype, tflops):
    assert gpu_peaks.peak_flops(name, dtype) == pytest.approx(tflops * 1e12)


def test_unknown_peaks_are_none_never_guessed():
    assert gpu_peaks.peak_flops("NVIDIA GeForce GTX 1080", "fp32") is None
    assert gpu_peaks.peak_flops("NVIDIA A100-SXM4-40GB", "fp8") is None  # Ampere has no FP8
    assert gpu_peaks.peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert gpu_peaks.peak_flops("NVIDIA H100 PCIe", "int4") is None
    assert gpu_peaks.lookup("") is None


def test_matmul_dtype_half_precision_is_kept():
    assert gpu_peaks.matmul_dtype("bfloat16", tf32=True) == "bf16"
    assert gpu_peaks.matmul_dtype("float16", tf32=False) == "fp16"
    assert gpu_peaks.matmul_dtype("float32", tf32=False) == "fp32"
    assert gpu_peaks.matmul_dtype("float32", tf32=True) == "tf32"


def test_jaxpr_flops_counts_matmuls_convs_and_scans():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    S = jax.ShapeDtypeStruct

    def f(a, b, k):
        c = a @ b
        y = jax.lax.conv_general_dilated(k, jnp.ones((8, 3, 3, 3)), (1, 1), "SAME")

        def body(carry, _):
            return carry @ b @ b.T, None

        z, _ = jax.lax.scan(body, a, None, length=3)
        return c.sum() + y.sum() + z.sum()

    jaxpr = jax.make_jaxpr(jax.jit(f))(S((4, 16), "float32"), S((16, 32), "float32"), S((2, 3, 10, 10), "float32"))
    matmul = 2 * 4 * 32 * 16
    conv = 2 * (2 * 8 * 10 * 10) * 3 * 9
    assert gpu_peaks.jaxpr_flops(jaxpr) == matmul + conv + 3 * 2 * matmul
    grad = jax.make_jaxpr(jax.grad(lambda a, b: (a @ b).sum()))(S((4, 16), "float32"), S((16, 32), "float32"))
    assert gpu_peaks.jaxpr_flops(grad) == 2 * matmul  # forward and the gradient of `a`


# -- one set of figures: spans are time-weighted sums of their parts ---------------------------------
def _epoch(wait_fraction, step, steps=48, compute=None):
    wait = wait_fraction * step
    compute = step - wait if compute is None else compute
    return measure.Measurement(
        steps=steps,
        sampled_steps=2,
        fetch=wait,
        compute=compute,
        other=step - wait - compute,
        step=step,
        wait=wait,
        wait_fraction=wait_fraction,
        steps_per_sec=1.0 / step,
        samples_per_sec=32.0 / step,
    )


def test_aggregate_is_time_weighted_over_the_steps_covered():
    parts = [_epoch(0.305, 0.040), _epoch(0.069, 0.020), _epoch(0.145, 0.022, steps=24)]
    m = measure.aggregate(parts, flops_per_step=1e9, peak_flops=1e12)
    seconds = [p.steps * p.step for p in parts]
    assert m.steps == 120 and m.sampled_steps == 6
    # wait share = sum(steps x wait) / sum(steps x step): each part counts by the time it took
    assert m.wait_fraction == pytest.approx(sum(p.wait_fraction * t for p, t in zip(parts, seconds)) / sum(seconds))
    assert m.wait_fraction == pytest.approx(m.wait / m.step)  # per-step means of the same steps
    assert m.step == pytest.approx(sum(seconds) / 120)
    assert m.steps_per_sec == pytest.approx(120 / sum(seconds))  # counts over seconds
    assert m.samples_per_sec == pytest.approx(32 * 120 / sum(seconds))
    assert m.flops_per_sec == pytest.approx(1e9 * m.steps_per_sec) and m.mfu == pytest.approx(m.flops_per_sec / 1e12)
    assert m.speedup_bound == pytest.approx(1 / (1 - m.wait_fraction))
    # Aggregating is associative: epochs of windows give the same fit as the windows.
    windows = [_epoch(0.5, 0.030, steps=10), _epoch(0.1, 0.010, steps=30), _epoch(0.2, 0.020, steps=20)]
    by_epoch = measure.aggregate([measure.aggregate(windows[:2]), measure.aggregate(windows[2:])])
    assert by_epoch.wait_fraction == pytest.approx(measure.aggregate(windows).wait_fraction)
    assert by_epoch.step == pytest.approx(measure.aggregate(windows).step)


def test_aggregate_leaves_unknown_figures_out_never_zero():
    unknown = measure.Measurement(steps=10, steps_per_sec=50.0, step=0.02)  # a window with no synced step
    m = measure.aggregate([_epoch(0.5, 0.040, steps=10), unknown])
    assert m.wait_fraction == pytest.approx(0.5) and m.compute == pytest.approx(0.020)
    assert m.step == pytest.approx(0.030) and m.steps == 20
    assert measure.aggregate([]).wait_fraction is None and measure.aggregate([unknown]).wait is None


def test_logs_carry_the_steps_that_weigh_them():
    logs = _epoch(0.25, 0.040, steps=12).logs()
    assert logs["input/steps"] == 12 and logs["input/wait_ms"] == pytest.approx(10.0)
    assert "input/steps" not in measure.Measurement().logs()


# -- the steady state ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "steps, first",
    [
        ([0.040, 0.020, 0.022], 1),  # a slow first epoch (cache filling): left out
        ([0.090, 0.040, 0.020, 0.021], 2),  # two warm-up epochs
        ([(0.035, 0.305), (0.020, 0.069), (0.022, 0.145)], 1),  # the issue's: 1.7x slower, 20 points more waiting
        ([0.028, 0.020, 0.021], 0),  # noise under 50%: nothing left out
        ([(0.00123, 0.199), (0.00077, 0.124)], 0),  # 60% slower, a similar wait share: noise of 1 ms steps
        ([(0.0030, 0.130), (0.0010, 0.129)], 1),  # three times slower: warm-up (compilation), whatever the wait
        ([(0.00112, 0.816), (0.00059, 0.715)], 0),  # 1.9x and 10 points, but 0.5 ms: a busy host's noise (seen in CI)
        ([0.0006, 0.0002, 0.0002], 0),  # three times slower by 0.4 ms: not worth leaving out
        ([0.020, 0.040], 0),  # slower at the end: the recent part is kept, never cut
        ([0.040], 0),
        ([None, 0.020, 0.020], 0),  # unknown step time: not a reason to leave it out
    ],
)
def test_steady_start(steps, first):
    parts = [
        measure.Measurement(steps=10, step=s[0], wait=s[0] * s[1], wait_fraction=s[1])
        if isinstance(s, tuple)
        else measure.Measurement(steps=10, step=s)
        for s in steps
    ]
    assert steady_start(parts) == first


def test_warmup_reasons_follow_the_pipeline():
    assert warmup_reason(0, True, {"kind": "tf.data", "cache": True}) == "while the cache filled"
    assert warmup_reason(0, True, {"kind": "PyDataset", "workers": 4}) == "while the workers started"
    assert warmup_reason(0, True, {"kind": "torch DataLoader", "num_workers": 2}) == "while the workers started"
    assert warmup_reason(0, True, {"kind": "arrays"}).startswith("during warm-up")
    assert warmup_reason(1, True, {"kind": "tf.data", "cache": True}).startswith("during warm-up")


def test_span_labels():
    assert span_label(["epoch 2", "epoch 3"]) == "epochs 2-3"
    assert span_label(["epoch 3"]) == "epoch 3"
    assert span_label(["steps 1-100", "steps 101-200"]) == "steps 1-200"


def test_the_issue_example_verdict_is_the_steady_state_and_adds_up():
    """After the advice: epoch 1 waits 30.5% while the cache fills, then 6.9% and 14.5%."""
    epochs = [_epoch(0.305, 0.035, steps=48), _epoch(0.069, 0.020, steps=48), _epoch(0.145, 0.022, steps=48)]
    k = steady_start(epochs)
    assert k == 1
    steady, fit = measure.aggregate(epochs[k:]), measure.aggregate(epochs)
    reason = warmup_reason(0, True, CACHED)
    phases = [
        verdict.Phase(f"epoch {i + 1}", e.steps, e.wait_fraction, e.step, i >= k, None if i >= k else reason)
        for i, e in enumerate(epochs)
    ]
    v = verdict.verdict_for(
        steady, scope="epochs 2-3", phases=phases, fit=fit, pipeline=CACHED, context={"cache_serves": True}
    )
    assert v.category == categories.MODERATE and v.scope == "epochs 2-3"
    assert v.wait_fraction == pytest.approx((0.069 * 0.020 + 0.145 * 0.022) / (0.020 + 0.022))  # ~10.9%
    assert (
        "MODERATELY input-bound because 10.9% of the step time" in v.message
        and "over steady state, epochs 2-3" in v.message
    )
    assert "Left out: epoch 1, which waited 30.5% while the cache filled; since then 6.9-14.5% per epoch." in v.message
    assert "Without the wait, training would be at most 1.12x faster" in v.message
    assert v.speedup_bound == pytest.approx(1 / (1 - v.wait_fraction))
    assert v.fit_wait_fraction == pytest.approx(fit.wait_fraction) and v.fit_wait_fraction > v.wait_fraction
    assert [p.label for p in v.left_out] == ["epoch 1"]
    advice = "\n".join(v.advice)
    assert "interleave" not in advice and "comes from the cache" in advice
    text = summary.summary_text("InputBoundDetector", steady, v, fit=fit)
    assert text.startswith("InputBoundDetector: moderately input-bound (steady state, epochs 2-3)")
    assert (
        "| figure | steady state, epochs 2-3 | whole fit |" in text
        and "| wait for input / step | 10.9% | 19.8% |" in text
    )
    assert "| epoch 1 | 48 | 30.5% | 35.00 ms | no: while the cache filled |" in text
    assert "| epoch 2 | 48 | 6.9% | 20.00 ms | yes |" in text
    assert "sum(steps x wait) / sum(steps x step)" in text


def test_verdict_of_a_span_without_phases_has_no_left_out_text():
    v = verdict.verdict_for(_input_bound_measurement(), scope="epoch 2")
    assert v.message.endswith(
        "of a 10.00 ms step), over epoch 2. Without the wait, training would be at most 5.00x faster (2.00 ms per step instead of 10.00 ms)."
    )
    assert "Left out" not in v.message and v.phases == [] and v.fit_wait_fraction == pytest.approx(0.8)
    none = verdict.verdict_for(measure.Measurement())
    assert none.category == categories.UNKNOWN and none.speedup_bound is None
