"""Step timing, verdicts and advice, with records built from a fake clock."""

import pytest

from keras_gpu_tools._core import step_timing as st
from keras_gpu_tools._core.step_timing import StepRecord, StepStats


class FakeClock:
    """A clock the test moves by hand; records are built from its readings."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds


def run_steps(stats, clock, n, fetch, compute, rest, sampled=lambda i: True, first_index=0, samples=32):
    """Simulates n serial steps: fetch, compute, rest (seconds), fed to ``stats``."""
    prev = None
    for i in range(first_index, first_index + n):
        start = clock()
        if prev is not None:
            prev.interval = start - prev.start
            prev.gap = start - prev.end
            stats.add(prev)
        rec = StepRecord(index=i, sampled=sampled(i), start=start, samples=samples)
        clock.advance(fetch)
        rec.fetch = fetch
        fetched = clock()
        clock.advance(compute)
        rec.end = clock()
        if rec.sampled:
            rec.compute = rec.end - fetched
        clock.advance(rest)
        prev = rec
    stats.add(prev)  # the last call: no gap (epoch end)


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
    assert st.classify(m.wait_fraction) == st.NOT


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


def test_recompile_outlier_does_not_dilute_the_fraction():
    # One unsampled interval slowed by a recompilation: the serialized
    # figures are used, not the inflated mean rate.
    clock, stats = FakeClock(), StepStats()
    run_steps(stats, clock, 9, fetch=0.005, compute=0.005, rest=0.0, sampled=lambda i: i % 2 == 0)
    stats.add(StepRecord(index=99, fetch=0.005, start=0, end=0, interval=2.0))
    m = stats.measurement()
    assert m.wait_fraction == pytest.approx(0.5)
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
    v = st.verdict_for(m)
    assert v.category == st.UNKNOWN and not v.input_bound


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


@pytest.mark.parametrize(
    "fraction, expected",
    [
        (0.0, st.NOT),
        (0.049, st.NOT),
        (0.05, st.MODERATE),
        (0.199, st.MODERATE),
        (0.2, st.HIGH),
        (1.0, st.HIGH),
        (None, st.UNKNOWN),
    ],
)
def test_classify_uses_xprof_thresholds(fraction, expected):
    assert st.classify(fraction) == expected


def test_custom_thresholds():
    assert st.classify(0.15, moderate=0.1, high=0.3) == st.MODERATE
    assert st.classify(0.35, moderate=0.1, high=0.3) == st.HIGH


@pytest.mark.parametrize("moderate, high", [(0.2, 0.05), (0.1, 0.1), (0.0, 0.2), (0.05, 1.0), ("a", 0.2), (True, 0.2)])
def test_bad_thresholds(moderate, high):
    with pytest.raises(ValueError, match="Invalid value for argument"):
        st.validate_thresholds(moderate, high)


def _input_bound_measurement():
    return st.Measurement(
        steps=10, sampled_steps=5, fetch=0.008, compute=0.002, other=0.0, step=0.010, wait=0.008, wait_fraction=0.8
    )


def test_verdict_message_and_gpu_evidence():
    v = st.verdict_for(
        _input_bound_measurement(), gpu_means={"gpu/0/utilization_percent": 15.0, "gpu/0/memory_used_mib": 100.0}
    )
    assert v.category == st.HIGH and v.input_bound
    assert "HIGHLY input-bound because 80.0%" in v.message
    assert any("Confirmed by the GPU" in e and "15%" in e for e in v.evidence)
    busy = st.verdict_for(_input_bound_measurement(), gpu_means={"gpu/0/utilization_percent": 97.0})
    assert not any("Confirmed" in e for e in busy.evidence)


def test_advice_for_tf_data_reads_the_pipeline():
    m = _input_bound_measurement()
    bare = st.advise(
        st.HIGH,
        m,
        {"kind": "tf.data", "ends_with_prefetch": False, "sequential_map": True, "parallel_map": False, "cache": False},
        {},
    )
    text = "\n".join(bare)
    assert "prefetch(tf.data.AUTOTUNE)" in text and "num_parallel_calls" in text and ".cache()" in text
    tuned = st.advise(
        st.HIGH,
        m,
        {"kind": "tf.data", "ends_with_prefetch": True, "sequential_map": False, "parallel_map": True, "cache": True},
        {},
    )
    text = "\n".join(tuned)
    assert "prefetch(tf.data.AUTOTUNE)` so" not in text and "num_parallel_calls=tf.data.AUTOTUNE` to `.map" not in text
    assert "source is the limit" in text


def test_advice_per_pipeline_kind_and_cpu():
    m = _input_bound_measurement()
    assert (
        "workers=1" in st.advise(st.HIGH, m, {"kind": "PyDataset", "workers": 1, "use_multiprocessing": False}, {})[0]
    )
    assert "steps_per_execution" in st.advise(st.MODERATE, m, {"kind": "arrays"}, {})[0]
    assert "num_workers=0" in st.advise(st.HIGH, m, {"kind": "torch DataLoader", "num_workers": 0}, {})[0]
    assert "PyDataset" in st.advise(st.HIGH, m, {"kind": "generator"}, {})[0]
    cpu = st.advise(st.HIGH, m, {"kind": "PyDataset", "workers": 8}, {"system_cpu_percent": 97.0, "cpu_count": 8})
    assert cpu[0].startswith("The host CPU is the limit (97% of 8 cores")
    assert st.advise(st.NOT, m, {"kind": "arrays"}, {}) == []


def test_summary_text_is_a_table():
    m = _input_bound_measurement()
    v = st.verdict_for(m, pipeline={"kind": "generator"})
    text = st.summary_text("Run", m, v, notes=["a note"])
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
from keras_gpu_tools._core import gpu_peaks  # noqa: E402


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
