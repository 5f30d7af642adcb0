"""GPUUtilizationLogger's GPU health end to end: a real model.fit with a fake NVML, logs read back."""

import json
import os
import threading
import time

import keras
import pytest

from keras_gpu_tools import GPUUtilizationLogger
from keras_gpu_tools.callbacks import gpu_utilization_logger
from keras_gpu_tools.errors import GPUMonitoringWarning
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import read_run
from keras_gpu_tools.runtime.session import session_of
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS, SHARED_GPU_HEALTH
from keras_gpu_tools.telemetry.nvml import NVML
from keras_gpu_tools.telemetry.sampler import GPUProbe
from tests.helpers.data import regression_data
from tests.helpers.fake_nvml import FakeGPU, FakeNVML
from tests.helpers.models import tiny_dense_model
from tests.helpers.step_records import FakeClock
from tests.helpers.timing_telemetry import TickAt, manual_sampling

pytestmark = pytest.mark.multibackend


@pytest.fixture(autouse=True)
def no_cuda_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


class EpochClock(keras.callbacks.Callback):
    """Sleeps a little each step, so the sampler thread ticks during the fit."""

    def __init__(self, seconds=0.004):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def clocked_probes(monkeypatch, clock):
    """The logger's GPU probes read the energy counter, and keep their read periods, by ``clock``."""

    class ClockedProbe(GPUProbe):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.clock = clock
            if self.energy is not None:
                self.energy.clock = clock

    monkeypatch.setattr(gpu_utilization_logger, "GPUProbe", ClockedProbe)


class ReadsHealth(keras.callbacks.Callback):
    """Another feature of the fit: reads the logger's health source at each epoch end."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        source = session_of(self.model).shared[SHARED_GPU_HEALTH]
        self.seen.append((source.last_epoch(), source.unsupported()))


def run_texts(run_dir):
    values = read_run("gpu", run_dir, sorted(os.listdir(run_dir)), [])
    return {tag: points[-1].text for tag, points in values.texts.items()}, values.scalars


def test_health_fields_in_history_energy_per_epoch_and_joules_per_sample(tmp_path, monkeypatch):
    # Virtual time: each step takes 3/32 s of a fake clock (1.5 s an epoch), which the GPU's energy counter, the
    # probe and the epoch ends all read; the samples are taken at every step, on the training thread.
    clock, jobs = FakeClock(), manual_sampling(monkeypatch)
    clocked_probes(monkeypatch, clock)
    gpu = FakeGPU(power_mw=400_000, clock_reasons=0x4, ecc_corrected=2, clock=clock)  # held at the power cap
    nvml = NVML(FakeNVML([gpu]))
    x, y = regression_data(256)
    cb, reader = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=nvml), ReadsHealth()
    steps = TickAt(jobs, range(16), on_batch=lambda batch: clock.advance(3 / 32))
    history = tiny_dense_model().fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[cb, steps, reader])
    h = history.history
    for field in set(HEALTH_FIELDS) - {"xid_events"}:
        assert len(h[f"gpu/0/{field}"]) == 3, field
    assert h["gpu/0/throttle_power_percent"] == [100.0] * 3
    assert h["gpu/0/throttle_thermal_percent"] == [0.0] * 3
    assert h["gpu/0/memory_clock_mhz"] == [2619.0] * 3 and h["gpu/0/sm_clock_max_mhz"] == [1980.0] * 3
    assert h["gpu/0/ecc_corrected_errors"] == [2.0] * 3 and h["gpu/0/xid_events"] == [0.0] * 3
    # Energy: 400 W over each epoch's time, from the first sample (batch 0 of epoch 1) on: the counter is read
    # every 2 s, the joules since the last reading are taken from the power at an epoch's end, none counted twice.
    assert h["gpu/0/energy_joules"] == [400 * 15 * 3 / 32, 400 * 1.5, 400 * 1.5]
    assert gpu.clock() == 100.0 + 3 * 1.5
    assert h[schema.JOULES_PER_SAMPLE] == pytest.approx([e / 256 for e in h["gpu/0/energy_joules"]])
    # The fit's other callbacks see the last epoch's figures, and no field unsupported.
    last, unsupported = reader.seen[-1]
    assert last["0"]["energy_joules"] == h["gpu/0/energy_joules"][-1]
    assert last["0"]["throttle_power_percent"] == 100.0 and last["0"]["power_watts"] == 400.0
    assert unsupported == {"0": {}}
    # The run holds the record (every field reported) and joules per sample by step.
    texts, scalars = run_texts(os.path.join(str(tmp_path), "gpu"))
    assert json.loads(texts[schema.GPU_UNSUPPORTED_TEXT + schema.DATA_SUFFIX]) == {"0": {}}
    assert "every field is reported" in texts[schema.GPU_UNSUPPORTED_TEXT]
    assert list(scalars[schema.JOULES_PER_SAMPLE].values) == pytest.approx(h[schema.JOULES_PER_SAMPLE])
    assert "gpu/0/energy_joules" in scalars
    assert "throttle_power_percent 100" in cb.summary()


def test_unsupported_fields_absent_with_their_reason_in_the_run_summary_and_property(tmp_path):
    gpu = FakeGPU(
        name="NVIDIA A10",
        gpm=False,
        nvlink_links=0,
        unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors"},
    )
    nvml = NVML(FakeNVML([gpu]))
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=nvml)
    with pytest.warns(GPUMonitoringWarning, match="energy_joules"):
        history = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, EpochClock()])
    h = history.history
    assert "gpu/0/energy_joules" not in h and schema.JOULES_PER_SAMPLE not in h
    assert "gpu/0/dram_bandwidth_percent" not in h and "gpu/0/ecc_corrected_errors" not in h
    assert h["gpu/0/throttle_power_percent"] == [0.0, 0.0]  # reported: a true 0
    reasons = cb.unsupported_fields["0"]
    assert reasons["energy_joules"] == "NVMLError: Not Supported"
    assert "Hopper" in reasons["dram_bandwidth_percent"]
    texts, _ = run_texts(os.path.join(str(tmp_path), "gpu"))
    assert json.loads(texts[schema.GPU_UNSUPPORTED_TEXT + schema.DATA_SUFFIX]) == cb.unsupported_fields
    assert "- energy_joules: NVMLError: Not Supported" in texts[schema.GPU_UNSUPPORTED_TEXT]
    assert "- energy_joules: NVMLError: Not Supported" in cb.summary()


def test_joules_per_sample_absent_where_the_epochs_examples_are_unknown(tmp_path):
    nvml = NVML(FakeNVML([FakeGPU()]))
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=None, interval=0.02, nvml=nvml)
    history = tiny_dense_model().fit(
        x, y, batch_size=16, epochs=2, steps_per_epoch=8, verbose=0, callbacks=[cb, EpochClock()]
    )
    assert len(history.history["gpu/0/energy_joules"]) == 2
    assert schema.JOULES_PER_SAMPLE not in history.history


def test_xid_event_during_fit_warned_once_naming_the_gpu(tmp_path, monkeypatch):
    jobs = manual_sampling(monkeypatch)  # sampled at chosen batches: the event is seen in the epoch it came in
    gpu = FakeGPU(uuid="GPU-feed")
    nvml = NVML(FakeNVML([gpu]))

    def inject(batch):
        if batch == 4:
            gpu.xid_pending.append(48)  # a double-bit ECC error

    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=None, interval=0.02, nvml=nvml)
    with pytest.warns(GPUMonitoringWarning) as record:
        history = tiny_dense_model().fit(
            x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, TickAt(jobs, {0, 4, 8}, on_batch=inject)]
        )
    xid = [str(w.message) for w in record if "XID" in str(w.message)]
    assert len(xid) == 1 and "GPU 0" in xid[0] and "GPU-feed" in xid[0] and "XID 48" in xid[0]
    assert sum(history.history["gpu/0/xid_events"]) == 2.0  # one in each epoch
    assert history.history["gpu/0/xid_events"] == [1.0, 1.0]


class RaiseAtBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 5:
            raise RuntimeError("user callback failed")


def test_event_set_freed_when_fit_raises(tmp_path):
    fake = FakeNVML([FakeGPU()])
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=NVML(fake))
    with pytest.raises(RuntimeError, match="user callback failed"):
        tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, EpochClock(), RaiseAtBatch()])

    def alive():
        return [t for t in threading.enumerate() if t.name.startswith("keras_gpu_tools") and t.is_alive()]

    # The teardown frees the event set, then the fit's thread ends: wait for all three (ends as soon as they are).
    deadline = time.monotonic() + 60.0
    while (fake.live_event_sets or cb.fit_running or alive()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.count("nvmlEventSetCreate") == 1 and fake.live_event_sets == 0
    assert not alive()
