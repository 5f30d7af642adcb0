"""GPU health fields against a fake NVML: throttle shares, clocks, energy per epoch, ECC, GPM, XID events."""

import pytest

from keras_gpu_tools.errors import GPUMonitoringWarning
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry.aggregate import Aggregate
from keras_gpu_tools.telemetry.devices import visible_gpus
from keras_gpu_tools.telemetry.health import HealthRecord, XidWatcher, energy_increment
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS, THROTTLE_REASONS
from keras_gpu_tools.telemetry.nvml import NVML
from keras_gpu_tools.telemetry.sampler import GPUProbe, MetricSampler
from tests.helpers.fake_nvml import NVML_ERROR_UNKNOWN, FakeGPU, FakeNVML
from tests.helpers.step_records import FakeClock

FUNCTION_NOT_FOUND = 13


def sampler_for(*gpus, missing=(), pcie=False, xid=True):
    fake = FakeNVML(list(gpus), missing=missing)
    nvml = NVML(fake)
    warn = WarnOnce()
    probes = [GPUProbe(nvml, i, g, warn, pcie=pcie) for i, g in enumerate(visible_gpus(nvml, env={}))]
    events = XidWatcher(nvml, probes, warn) if xid else None
    return fake, MetricSampler(probes, None, None, warn, events), warn


def test_throttle_reasons_are_the_share_of_samples_each_was_active():
    gpu = FakeGPU()
    fake, sampler, _ = sampler_for(gpu)
    # 10 samples: power cap in 3, hardware thermal slowdown in 5 (2 of them with the power brake too).
    pattern = [0x4, 0x4, 0x4, 0x40, 0x40, 0x40, 0x40 | 0x80, 0x40 | 0x80, 0x1, 0x0]
    agg = Aggregate()
    for bits in pattern:
        gpu.clock_reasons = bits
        agg.add(sampler.sample())
    got = {k: v for k, v in sampler.epoch_summary(agg).items() if "throttle" in k}
    assert got == {
        "gpu/0/throttle_power_percent": 30.0,
        "gpu/0/throttle_thermal_percent": 50.0,
        "gpu/0/throttle_hw_slowdown_percent": 20.0,
        "gpu/0/throttle_sync_boost_percent": 0.0,  # reported and inactive: a true 0
        "gpu/0/throttle_app_clocks_percent": 0.0,
    }
    assert set(THROTTLE_REASONS) <= set(HEALTH_FIELDS)
    sampler.close()


@pytest.mark.parametrize(
    "missing, failing",
    [
        ({"nvmlDeviceGetCurrentClocksEventReasons"}, {}),  # nvidia-ml-py older than the new name
        ((), {"nvmlDeviceGetCurrentClocksEventReasons": FUNCTION_NOT_FOUND}),  # a driver older than the bindings
    ],
)
def test_throttle_reasons_fall_back_to_the_former_name(missing, failing):
    gpu = FakeGPU(clock_reasons=0x4, failing=dict(failing))
    fake, sampler, warn = sampler_for(gpu, missing=missing)
    for _ in range(3):
        values = sampler.sample()
    assert values["gpu/0/throttle_power_percent"] == 100.0
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 3
    assert not warn.messages and "throttle_power_percent" not in sampler.unsupported()["0"]


def test_clocks_and_their_maxima_read_once():
    fake, sampler, _ = sampler_for(FakeGPU(sm_clock=1755, mem_clock=2619, sm_clock_max=1980, mem_clock_max=2619))
    for _ in range(4):
        values = sampler.sample()
    assert values["gpu/0/sm_clock_mhz"] == 1755.0
    assert values["gpu/0/sm_clock_max_mhz"] == 1980.0
    assert values["gpu/0/memory_clock_mhz"] == 2619.0
    assert values["gpu/0/memory_clock_max_mhz"] == 2619.0
    assert fake.count("nvmlDeviceGetMaxClockInfo") == 2  # SM and memory, once each


def test_energy_is_the_epochs_difference_of_the_counter_across_a_reset():
    gpu = FakeGPU(energy_mj=1_000_000)
    fake, sampler, _ = sampler_for(gpu)

    def epoch(readings):
        agg = Aggregate()
        for mj in readings:
            gpu.energy_mj = mj
            agg.add(sampler.sample())
        return sampler.epoch_summary(agg)["gpu/0/energy_joules"]

    # The first sample's share starts at the fit's first reading (its prime, just before), not at 0.
    assert epoch([1_000_000, 1_002_000, 1_005_000]) == pytest.approx(5.0)
    # Epoch 2 starts where epoch 1's last sample ended; the driver reloads (the counter restarts at 0).
    assert epoch([1_009_000, 700, 1_700]) == pytest.approx(4.0 + 0.7 + 1.0)
    # An epoch with no sample: its energy is in the next sample's share, so 0, never the last value.
    assert sampler.epoch_summary(Aggregate())["gpu/0/energy_joules"] == 0.0
    assert epoch([2_700]) == pytest.approx(1.0)


def test_energy_increment_handles_wrap_and_reset():
    top = (1 << 64) - 500
    assert energy_increment(1_000, 4_000) == 3_000
    assert energy_increment(top, 1_500) == 2_000  # the 64-bit counter wrapped
    assert energy_increment(9_000_000, 2_000) == 2_000  # a reset: what was used since it restarted


def test_energy_follows_the_power_drawn():
    clock = FakeClock()  # the counter's time, moved by hand: the joules are exact whatever the load
    gpu = FakeGPU(power_mw=300_000, clock=clock)  # the counter advances 300 J a second
    fake, sampler, _ = sampler_for(gpu)
    agg = Aggregate()
    agg.add(sampler.sample())  # the prime reads the counter first
    clock.advance(0.2)
    agg.add(sampler.sample())
    assert sampler.epoch_summary(agg)["gpu/0/energy_joules"] == pytest.approx(60.0)
    clock.advance(0.5)
    assert sampler.sample()["gpu/0/energy_joules"] == pytest.approx(150.0)  # each reading: the joules since the last


def test_ecc_totals_are_the_epochs_last_and_an_unsupported_one_is_absent_with_its_reason():
    gpu = FakeGPU(ecc_corrected=3, unsupported={"nvmlDeviceGetTotalEccErrors:1"})
    fake, sampler, warn = sampler_for(gpu)
    agg = Aggregate()
    with pytest.warns(GPUMonitoringWarning, match="ecc_uncorrected_errors"):
        agg.add(sampler.sample())
        gpu.ecc_corrected = 5
        agg.add(sampler.sample())
    out = sampler.epoch_summary(agg)
    assert out["gpu/0/ecc_corrected_errors"] == 5.0
    assert "gpu/0/ecc_uncorrected_errors" not in out
    assert sampler.unsupported()["0"] == {"ecc_uncorrected_errors": "NVMLError: Not Supported"}


def test_unsupported_fields_are_absent_never_zero_warned_once_with_their_reason():
    gpu = FakeGPU(
        name="NVIDIA GeForce RTX 3090",
        gpm=False,
        nvlink_links=0,
        unsupported={
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        },
    )
    fake, sampler, warn = sampler_for(gpu)
    with pytest.warns(GPUMonitoringWarning):
        for _ in range(4):
            values = sampler.sample()
    fields = {k.split("/")[-1] for k in values}
    missing = {
        *THROTTLE_REASONS,
        "energy_joules",
        "ecc_corrected_errors",
        "ecc_uncorrected_errors",
        "dram_bandwidth_percent",
        "nvlink_rx_mib_per_sec",
        "nvlink_tx_mib_per_sec",
    }
    assert not fields & missing
    assert {"memory_clock_mhz", "sm_clock_max_mhz", "xid_events"} <= fields
    reasons = sampler.unsupported()["0"]
    assert set(reasons) == missing | {"sm_activity_percent", "sm_occupancy_percent", "tensor_activity_percent"}
    assert reasons["energy_joules"] == "NVMLError: Not Supported"
    assert "Hopper" in reasons["dram_bandwidth_percent"]
    assert fake.count("nvmlDeviceGetTotalEnergyConsumption") <= 2  # the prime and one read, never again
    assert sum("energy_joules" in m for m in warn.messages) == 1


def test_dram_bandwidth_and_nvlink_from_gpm_only_where_the_gpu_has_links():
    linked, alone = FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b", nvlink_links=0)
    fake, sampler, warn = sampler_for(linked, alone)
    with pytest.warns(GPUMonitoringWarning, match="nvlink"):
        values = sampler.sample()
    assert values["gpu/0/dram_bandwidth_percent"] == 35.5
    assert values["gpu/0/nvlink_rx_mib_per_sec"] == 1024.0
    assert values["gpu/0/nvlink_tx_mib_per_sec"] == 2048.0
    assert values["gpu/1/dram_bandwidth_percent"] == 35.5
    assert "gpu/1/nvlink_rx_mib_per_sec" not in values
    assert sampler.unsupported()["1"]["nvlink_tx_mib_per_sec"].startswith("this GPU has no NVLink")
    assert "nvlink_rx_mib_per_sec" not in sampler.unsupported()["0"]


def test_a_gpm_metric_the_gpu_cannot_report_is_dropped_with_its_reason():
    gpu = FakeGPU(gpm_values={2: 90.0, 3: 40.0, 5: 50.0, 60: 1.0, 61: 2.0})  # no DRAM bandwidth
    fake, sampler, warn = sampler_for(gpu)
    with pytest.warns(GPUMonitoringWarning, match="dram_bandwidth_percent"):
        for _ in range(3):
            values = sampler.sample()
    assert "gpu/0/dram_bandwidth_percent" not in values and values["gpu/0/sm_activity_percent"] == 90.0
    assert "GPM cannot report it" in sampler.unsupported()["0"]["dram_bandwidth_percent"]


def test_xid_event_counted_and_warned_once_naming_the_gpu_then_the_event_set_freed():
    gpu = FakeGPU(uuid="GPU-1234")
    fake, sampler, warn = sampler_for(gpu)
    agg = Aggregate()
    agg.add(sampler.sample())
    assert fake.live_event_sets == 1
    gpu.xid_pending += [79]
    with pytest.warns(GPUMonitoringWarning) as record:
        agg.add(sampler.sample())
    assert len(record) == 1
    text = str(record[0].message)
    assert "GPU 0" in text and "GPU-1234" in text and "XID 79" in text
    gpu.xid_pending += [79, 79]  # the same error again: counted, not warned about again
    agg.add(sampler.sample())
    assert len(warn.messages) == 1
    assert sampler.epoch_summary(agg)["gpu/0/xid_events"] == 3.0
    assert sampler.epoch_summary(Aggregate())["gpu/0/xid_events"] == 0.0
    sampler.close()
    assert fake.live_event_sets == 0
    sampler.close()  # twice: harmless
    assert fake.count("nvmlEventSetFree") == 1


def test_xid_events_not_registrable_is_a_reason_and_no_event_set_stays():
    gpu = FakeGPU(unsupported={"nvmlDeviceRegisterEvents"})
    fake, sampler, warn = sampler_for(gpu)
    with pytest.warns(GPUMonitoringWarning, match="xid_events"):
        values = sampler.sample()
    assert "gpu/0/xid_events" not in values
    assert "XID events cannot be registered" in sampler.unsupported()["0"]["xid_events"]
    assert fake.live_event_sets == 0


def test_a_failing_event_wait_drops_xid_events_and_frees_the_set():
    gpu = FakeGPU(failing={"nvmlEventSetWait_v2": NVML_ERROR_UNKNOWN})
    fake, sampler, warn = sampler_for(gpu)
    original = fake.nvmlEventSetWait_v2

    def failing_wait(event_set, timeout_ms):
        fake._call("nvmlEventSetWait_v2", gpu)
        return original(event_set, timeout_ms)

    fake.nvmlEventSetWait_v2 = failing_wait
    with pytest.warns(GPUMonitoringWarning, match="waiting for XID events failed"):
        values = sampler.sample()
    assert "gpu/0/xid_events" not in values and fake.live_event_sets == 0
    assert sampler.sample()["gpu/0/power_watts"] == 350.0  # the rest goes on


def test_joules_per_sample_over_every_gpu_where_the_samples_are_known():
    record = HealthRecord(lambda: {"0": {}, "1": {}})
    values = {"gpu/0/energy_joules": 300.0, "gpu/1/energy_joules": 100.0, "gpu/0/power_watts": 350.0}
    assert record.end_epoch(values, samples=800) == {schema.JOULES_PER_SAMPLE: 0.5}
    assert record.last_epoch() == {"0": {"energy_joules": 300.0, "power_watts": 350.0}, "1": {"energy_joules": 100.0}}
    assert record.end_epoch(values, samples=None) == {}  # unknown examples: absent
    assert record.end_epoch({"gpu/0/energy_joules": 3.0, "gpu/1/power_watts": 1.0}, samples=10) == {}  # a GPU without


def test_an_epochs_start_keeps_the_counts_sampled_since_the_last_epoch_end():
    agg = Aggregate()
    agg.add({"gpu/0/energy_joules": 2.0, "gpu/0/xid_events": 1.0, "gpu/0/power_watts": 300.0})
    # Energy and XID events sampled between two epochs go to the next one; the rest is dropped.
    assert agg.counts_only().means() == {"gpu/0/energy_joules": 2.0, "gpu/0/xid_events": 1.0}


def test_energy_that_stops_reporting_mid_fit_is_nan_never_zero():
    gpu = FakeGPU()
    fake, sampler, warn = sampler_for(gpu)
    sampler.sample()
    gpu.failing["nvmlDeviceGetTotalEnergyConsumption"] = NVML_ERROR_UNKNOWN
    with pytest.warns(GPUMonitoringWarning, match="energy_joules"):
        for _ in range(3):  # three failures in a row drop the field
            sampler.sample()
    agg = Aggregate()
    agg.add(sampler.sample())
    value = sampler.epoch_summary(agg)["gpu/0/energy_joules"]
    assert value != value  # NaN: the column stays, the figure is not measured
    assert "energy_joules" in sampler.unsupported()["0"]


def test_an_epoch_end_takes_the_joules_since_the_last_reading_from_the_power_and_the_next_reading_pays_them_back():
    # The counter costs milliseconds of CPU a reading, so it is read once a second: the epoch ending between
    # two readings takes its share from the power, and no joule is counted twice or lost.
    from keras_gpu_tools.telemetry.health import Energy

    counter = {"mj": 0}

    class Counter:
        def query(self, func, handle, on_unsupported=None):
            return counter["mj"]

    now = [0.0]
    energy = Energy(Counter(), clock=lambda: now[0])
    energy.prime(None)
    now[0], counter["mj"] = 1.0, 1_000_000  # 1000 J in the first second
    assert energy(None, None) == (1000.0,)
    now[0] = 1.5
    assert energy.split(1000.0) == 500.0  # the epoch ends: half a second at 1000 W
    now[0], counter["mj"] = 2.0, 2_000_000
    assert energy(None, None) == (500.0,)  # the second's 1000 J less what the epoch end counted
    assert energy.split(float("nan")) == 0.0 and energy.split(None) == 0.0  # no power reading: nothing guessed
