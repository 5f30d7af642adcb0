"""GPU/host sampling and aggregation against a fake NVML."""

import time
import warnings

import pytest

from keras_gpu_tools.errors import GPUMonitoringWarning
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry.aggregate import Aggregate
from keras_gpu_tools.telemetry.devices import visible_gpus
from keras_gpu_tools.telemetry.nvml import NVML
from keras_gpu_tools.telemetry.sampler import (
    GPUProbe,
    HostProbe,
    MetricSampler,
)
from tests.helpers.fake_nvml import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN, FakeGPU, FakeNVML
from tests.helpers.step_records import FakeClock


def probe_for(gpu, **kwargs):
    fake = FakeNVML([gpu])
    nvml = NVML(fake)
    info = visible_gpus(nvml, env={})[0]
    return fake, GPUProbe(nvml, 0, info, WarnOnce(), **kwargs)


def test_values_and_units():
    fake, probe = probe_for(FakeGPU())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = probe.read()
        second = probe.read()
    assert first["gpu/0/utilization_percent"] == 87.0
    assert first["gpu/0/memory_busy_percent"] == 40.0
    assert first["gpu/0/memory_used_mib"] == 1024.0
    assert first["gpu/0/memory_total_mib"] == 80 * 1024.0
    assert first["gpu/0/power_watts"] == 350.0
    assert first["gpu/0/power_limit_watts"] == 700.0
    assert first["gpu/0/temperature_celsius"] == 61.0
    assert first["gpu/0/sm_clock_mhz"] == 1980.0
    assert first["gpu/0/pcie_tx_mib_per_sec"] == 2.0
    assert first["gpu/0/pcie_rx_mib_per_sec"] == 4.0
    # GPM metrics are rates between two samples: none on the first read.
    assert "gpu/0/sm_activity_percent" not in first
    assert second["gpu/0/sm_activity_percent"] == 91.5
    assert second["gpu/0/sm_occupancy_percent"] == 45.25
    assert second["gpu/0/tensor_activity_percent"] == 60.0
    probe.close()
    assert fake.live_gpm_samples == 0  # every GPM sample freed


def test_pcie_can_be_switched_off():
    fake, probe = probe_for(FakeGPU(), pcie=False)
    values = probe.read()
    assert not any("pcie" in k for k in values)
    assert fake.count("nvmlDeviceGetPcieThroughput") == 0


def test_unsupported_field_left_out_warned_once_never_asked_again():
    fake, probe = probe_for(FakeGPU(unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates"}))
    with pytest.warns(GPUMonitoringWarning) as record:
        for _ in range(5):
            values = probe.read()
    assert "gpu/0/power_watts" not in values
    assert "gpu/0/utilization_percent" not in values and "gpu/0/memory_busy_percent" not in values
    assert "gpu/0/power_limit_watts" in values  # its neighbours still work
    assert fake.count("nvmlDeviceGetPowerUsage") == 1
    assert fake.count("nvmlDeviceGetUtilizationRates") == 1
    texts = [str(w.message) for w in record]
    assert sum("power_watts" in t for t in texts) == 1
    assert sum("utilization_percent" in t for t in texts) == 1


def test_gpm_unsupported_device_warns_once():
    fake, probe = probe_for(FakeGPU(name="Tesla V100-SXM2-16GB", gpm=False))
    with pytest.warns(GPUMonitoringWarning, match="SM activity"):
        for _ in range(3):
            values = probe.read()
    assert not any("sm_activity" in k for k in values)
    assert fake.count("nvmlGpmQueryDeviceSupport") == 1
    assert fake.count("nvmlGpmSampleGet") == 0


def test_transient_errors_tolerated_then_field_dropped():
    gpu = FakeGPU(failing={"nvmlDeviceGetTemperature": NVML_ERROR_UNKNOWN})
    fake, probe = probe_for(gpu)
    with pytest.warns(GPUMonitoringWarning, match="temperature"):
        for _ in range(5):
            values = probe.read()
    assert "gpu/0/temperature_celsius" not in values
    assert fake.count("nvmlDeviceGetTemperature") == 3
    assert values["gpu/0/power_watts"] == 350.0


def test_lost_gpu_stops_its_sampling():
    gpu = FakeGPU()
    fake, probe = probe_for(gpu)
    probe.read()
    gpu.failing["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_GPU_IS_LOST
    with pytest.warns(GPUMonitoringWarning, match="fell off the bus"):
        assert probe.read() == {}
    n = len(fake.calls)
    assert probe.read() == {} and len(fake.calls) == n


def test_mig_instance_reports_what_it_can():
    mig = FakeGPU(
        name="NVIDIA H100 MIG 3g.40gb",
        uuid="MIG-abc",
        memory_total=40 * 2**30,
        unsupported={
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetEnforcedPowerLimit",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetPcieThroughput",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            "nvmlDeviceGetMaxClockInfo",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTotalEccErrors",
        },
        gpm_values={2: 33.0, 3: 20.0, 5: 10.0},
    )
    parent = FakeGPU(mig=[mig])
    fake = FakeNVML([parent])
    nvml = NVML(fake)
    info = visible_gpus(nvml, env={"CUDA_VISIBLE_DEVICES": "MIG-abc"})[0]
    probe = GPUProbe(nvml, 0, info, WarnOnce())
    with pytest.warns(GPUMonitoringWarning):
        probe.read()
        values = probe.read()
    assert values["gpu/0/memory_total_mib"] == 40 * 1024.0
    assert values["gpu/0/sm_activity_percent"] == 33.0  # per-instance GPM
    assert set(k.split("/")[-1] for k in values) == {
        "memory_used_mib",
        "memory_total_mib",
        "sm_activity_percent",
        "sm_occupancy_percent",
        "tensor_activity_percent",
    }
    assert fake.count("nvmlGpmMigSampleGet") == 2
    # Every field it cannot report is recorded with its reason.
    assert probe.unsupported["energy_joules"] == "NVMLError: Not Supported"
    assert "GPM cannot report it" in probe.unsupported["dram_bandwidth_percent"]
    assert "MIG" in probe.unsupported["nvlink_rx_mib_per_sec"]


def test_allocator_and_host_figures():
    fake, probe = probe_for(FakeGPU())
    sampler = MetricSampler(
        [probe], HostProbe(WarnOnce()), allocator=lambda idx: {i: (3 * 2**20, 5 * 2**20) for i in idx}
    )
    time.sleep(HostProbe.MIN_CPU_SPAN + 0.02)
    values = sampler.sample()
    assert values["gpu/0/allocator_memory_mib"] == 3.0
    assert values["gpu/0/allocator_peak_memory_mib"] == 5.0
    assert values["host/rss_mib"] > 1.0
    assert 0.0 <= values["host/system_cpu_percent"] <= 100.0


def test_host_cpu_is_not_read_over_a_too_short_span(monkeypatch):
    clock = FakeClock()  # the spans are the clock's, not the wall's: exact under any load
    host = HostProbe(WarnOnce(), clock=clock)
    first = host.read()  # right after priming (a span under MIN_CPU_SPAN): no cpu figure, memory only
    assert "host/cpu_percent" not in first and first["host/rss_mib"] > 0
    clock.advance(2 * HostProbe.MIN_CPU_SPAN)
    second = host.read()
    assert 0 <= second["host/system_cpu_percent"] <= 100
    clock.advance(HostProbe.PERIOD / 2)
    assert host.read() == {}  # then at most one read a period (/proc costs CPU)
    clock.advance(HostProbe.PERIOD)
    assert host.read()["host/rss_mib"] > 0
    monkeypatch.setattr(HostProbe, "PERIOD", 0.0)
    assert host.read()["host/rss_mib"] > 0


def test_failing_allocator_warns_once_and_sampling_goes_on():
    def broken(indices):
        raise RuntimeError("allocator exploded")

    fake, probe = probe_for(FakeGPU())
    sampler = MetricSampler([probe], None, allocator=broken)
    with pytest.warns(GPUMonitoringWarning, match="allocator exploded"):
        values = sampler.sample()
    assert values["gpu/0/utilization_percent"] == 87.0
    assert sampler.sample()["gpu/0/utilization_percent"] == 87.0


def test_first_sample_has_every_key_and_fixes_the_epoch_keys(monkeypatch):
    monkeypatch.setattr(HostProbe, "PERIOD", 1e9)  # the second sample is "too soon" however late it comes
    fake, probe = probe_for(FakeGPU())
    sampler = MetricSampler([probe], HostProbe(WarnOnce()))
    t0 = time.monotonic()
    first = sampler.sample()  # primes GPM and waits out the CPU span once
    assert time.monotonic() - t0 >= HostProbe.MIN_CPU_SPAN - 0.01
    assert {"gpu/0/sm_activity_percent", "host/cpu_percent", "host/system_cpu_percent"} <= set(first)
    assert sampler.keys == tuple(first)
    second = sampler.sample()  # too soon for the host's figures (at most one read a second): left out
    assert not any(k.startswith("host/") for k in second)

    agg = Aggregate()
    agg.add(second)
    summary = sampler.epoch_summary(agg)  # CPU use carried from the first sample
    assert list(summary)[: len(first)] == list(first)
    assert summary["host/cpu_percent"] == first["host/cpu_percent"]
    assert summary["host/rss_mib_max"] == first["host/rss_mib"]
    empty = sampler.epoch_summary(Aggregate())  # an epoch without a sample: the latest values
    assert set(empty) == set(summary) and empty["gpu/0/utilization_percent"] == 87.0
    assert MetricSampler([], None).epoch_summary(Aggregate()) == {}


def test_slow_fields_are_read_at_most_once_a_period_and_the_others_every_tick(monkeypatch):
    # Utilization and power are averages over NVML's own window: read once a second; the energy
    # counter and PCIe (milliseconds of CPU a reading) every two; the clock-event reasons every tick.
    from keras_gpu_tools.telemetry import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "SLOW_PERIOD", 1.0)
    monkeypatch.setattr(sampler_module, "GPM_PERIOD", 0.5)
    fake, probe = probe_for(FakeGPU())
    now = [100.0]
    probe.clock = lambda: now[0]
    samples = []
    for _ in range(8):  # 8 ticks of 0.25 s: t = 100.0 ... 101.75
        samples.append(probe.read())
        now[0] += 0.25
    with_utilization = [i for i, s in enumerate(samples) if "gpu/0/utilization_percent" in s]
    assert with_utilization == [0, 4]
    assert [i for i, s in enumerate(samples) if "gpu/0/power_watts" in s] == [0, 4]
    assert all("gpu/0/throttle_power_percent" in s and "gpu/0/sm_clock_mhz" in s for s in samples)
    assert fake.count("nvmlDeviceGetUtilizationRates") == 2
    assert [i for i, s in enumerate(samples) if "gpu/0/pcie_tx_mib_per_sec" in s] == [0]
    # GPM's rates span the time between two of its samples: every other tick still covers every tick.
    assert [i for i, s in enumerate(samples) if "gpu/0/sm_activity_percent" in s] == [2, 4, 6]
    energy = [s.get("gpu/0/energy_joules") for s in samples]  # the first reading is the counter's baseline
    assert energy[1:] == [0.0] * 7  # not read in between: 0 joules there, none counted twice
    assert fake.count("nvmlDeviceGetTotalEnergyConsumption") == 1
    samples.append(probe.read())  # t = 102.0: two periods since the first reading
    assert "gpu/0/pcie_tx_mib_per_sec" in samples[-1] and samples[-1]["gpu/0/energy_joules"] > 0
