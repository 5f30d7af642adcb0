"""GPUUtilizationLogger end to end: a real model.fit, real event files read back
with TensorBoard's own reader. NVML is faked (no GPU here); the GPU paths run in
test_gpu_utilization_logger_gpu.py on the GPU machine."""

import csv
import os
import subprocess
import sys
import threading
import time
import warnings

import keras
import pytest

from keras_gpu_tools import GPUUtilizationLogger
from keras_gpu_tools.errors import GPUMonitoringWarning
from keras_gpu_tools.telemetry import sampler
from keras_gpu_tools.telemetry.nvml import NVML
from tests.helpers.data import regression_data
from tests.helpers.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGPU, FakeNVML
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_telemetry import TickAt, manual_sampling

pytestmark = pytest.mark.multibackend

THREAD_PREFIX = "keras_gpu_tools"


class SlowSteps(keras.callbacks.Callback):
    """Makes each step take a little wall time, so the sampler ticks during fit."""

    def __init__(self, seconds=0.004):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def read_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc, {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def our_threads():
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def wait_for_no_threads(timeout=60.0):  # returns as soon as they are gone
    deadline = time.monotonic() + timeout
    while our_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return our_threads()


@pytest.fixture(autouse=True)
def no_cuda_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def fake_nvml(**gpu_kwargs):
    fake = FakeNVML([FakeGPU(**gpu_kwargs)])
    return fake, NVML(fake)


def test_epoch_logs_and_tensorboard_series(tmp_path, monkeypatch):
    monkeypatch.setattr(sampler, "SLOW_PERIOD", 0.0)  # a point of every field at each of these short ticks
    monkeypatch.setattr(sampler, "GPM_PERIOD", 0.0)
    jobs = manual_sampling(monkeypatch)  # samples at the batches chosen here, not at the clock's
    fake, nvml = fake_nvml()
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=nvml)
    history = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, TickAt(jobs, {3, 7, 15})])
    h = history.history
    # Epoch means of what NVML reported, in the documented units.
    assert h["gpu/0/utilization_percent"] == [87.0, 87.0]
    assert h["gpu/0/power_watts"] == [350.0, 350.0]
    assert h["gpu/0/memory_used_mib"] == [1024.0, 1024.0]
    assert h["gpu/0/memory_used_mib_max"] == [1024.0, 1024.0]
    assert h["gpu/0/sm_activity_percent"] == [91.5, 91.5]
    assert all(v > 0 for v in h["host/rss_mib"])
    assert len(h["loss"]) == 2  # the model's own logs are untouched

    steps = 2 * 256 // 16
    assert cb.global_step == steps
    acc, scalars = read_scalars(os.path.join(str(tmp_path), "gpu"))
    series = scalars["gpu/0/utilization_percent"]
    assert all(v == 87.0 for _, v in series)
    # One point per sample, at the global step after the batch it was taken in (batches 3, 7, 15 of each epoch).
    points = [s for s, _ in series]
    assert points == [4, 8, 16, 20, 24, steps]
    assert len(jobs) == 1 and jobs[0].runs == 6
    assert "host/cpu_percent" in scalars
    # The device table is written as text.
    assert "gpu/devices" in acc.Tags()["tensors"]
    assert not wait_for_no_threads()


def test_no_nvml_warns_once_and_logs_host_metrics(tmp_path):
    fake = FakeNVML(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=None, interval=0.02, nvml=NVML(fake))
    with pytest.warns(GPUMonitoringWarning) as record:
        history = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, SlowSteps()])
    messages = [str(w.message) for w in record if "NVML" in str(w.message)]
    assert len(messages) == 1 and "host/* metrics" in messages[0]
    keys = set(history.history)
    assert {"host/cpu_percent", "host/rss_mib", "loss"} <= keys
    assert not any(k.startswith("gpu/") for k in keys)
    assert len(history.history["loss"]) == 2
    assert not os.listdir(tmp_path)  # log_dir=None: no event files anywhere


def test_unsupported_field_is_absent_not_zero(tmp_path):
    fake, nvml = fake_nvml(unsupported={"nvmlDeviceGetPowerUsage"}, gpm=False)
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=nvml)
    with pytest.warns(GPUMonitoringWarning):
        history = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, SlowSteps()])
    assert "gpu/0/power_watts" not in history.history
    assert "gpu/0/sm_activity_percent" not in history.history
    assert history.history["gpu/0/power_limit_watts"] == [700.0, 700.0]
    _, scalars = read_scalars(os.path.join(str(tmp_path), "gpu"))
    assert "gpu/0/power_watts" not in scalars
    assert fake.count("nvmlDeviceGetPowerUsage") == 1
    power_warnings = [m for m in cb.warnings.messages if "power_watts" in m]
    assert len(power_warnings) == 1


def test_epoch_shorter_than_the_first_sample_still_gets_the_keys(tmp_path):
    fake, nvml = fake_nvml(delay=0.3)  # a slow first sample (PCIe, GPM on a real GPU)
    x, y = regression_data(32)
    cb = GPUUtilizationLogger(log_dir=None, interval=0.05, nvml=nvml)
    history = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
    assert history.history["gpu/0/utilization_percent"] == [87.0, 87.0]


def test_training_thread_makes_no_per_step_nvml_call(tmp_path):
    def main_thread_calls(steps_per_epoch):
        fake, nvml = fake_nvml()
        x, y = regression_data(16 * steps_per_epoch)
        cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.01, nvml=nvml)
        tiny_dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb, SlowSteps(0.002)])
        me = threading.get_ident()
        return sum(1 for _, tid in fake.calls if tid == me), len(fake.calls)

    few_main, few_total = main_thread_calls(4)
    many_main, many_total = main_thread_calls(40)
    # Device discovery at on_train_begin and the close at its end only: the count does not grow with steps.
    # Both fits took their first sample (the epoch end waits for it), on the sampler thread.
    assert few_main == many_main
    assert few_total > few_main and many_total > many_main


def test_two_fits_continue_the_step_axis(tmp_path, monkeypatch):
    jobs = manual_sampling(monkeypatch)  # samples at chosen batches: the points' steps are exact
    monkeypatch.setattr(sampler, "SLOW_PERIOD", 0.0)  # every field at every sample, however fast they come
    fake, nvml = fake_nvml()
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=nvml)
    model = tiny_dense_model()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb, TickAt(jobs, {7, 15})])
    assert cb.global_step == 16
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb, TickAt(jobs, {7, 15})])
    assert cb.global_step == 32
    assert len(cb.epoch_history) == 2 and len(jobs) == 2
    _, scalars = read_scalars(os.path.join(str(tmp_path), "gpu"))
    points = [s for s, _ in scalars["gpu/0/utilization_percent"]]
    # the second fit's steps go on from the first's (each fit writes its own event file; read back in name order)
    assert sorted(points) == [8, 16, 24, 32]
    assert not wait_for_no_threads()


class RaiseAtEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("user callback failed")


def test_no_thread_outlives_a_fit_that_raised(tmp_path):
    fake, nvml = fake_nvml()
    x, y = regression_data(256)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=nvml)
    model = tiny_dense_model()
    with pytest.raises(RuntimeError, match="user callback failed"):
        model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[cb, SlowSteps(), RaiseAtEpochEnd()])
    assert not wait_for_no_threads(), "sampler or guard thread still running after fit() raised"
    # Every thread that called NVML but this one has ended: nothing can sample it any more.
    callers = {tid for _, tid in fake.calls} - {threading.get_ident()}
    assert callers, "the sampler thread took no sample"
    assert not [t for t in threading.enumerate() if t.ident in callers], "NVML still being sampled after fit() raised"
    # What was sampled before the failure reached TensorBoard, and the file was closed.
    _, scalars = read_scalars(os.path.join(str(tmp_path), "gpu"))
    assert scalars["gpu/0/utilization_percent"]
    # The same instance trains again.
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb, SlowSteps()])
    assert history.history["gpu/0/utilization_percent"] == [87.0]
    assert not wait_for_no_threads()


def test_unknown_device_raises_before_training(tmp_path):
    fake, nvml = fake_nvml()
    x, y = regression_data(256)
    model = tiny_dense_model()
    cb = GPUUtilizationLogger(log_dir=tmp_path, devices=[3], nvml=nvml)
    with pytest.raises(ValueError, match=r"devices=\[3\].*GPU index 3 does not exist"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0
    assert not our_threads()


def test_csv_logger_after_it_sees_the_keys(tmp_path):
    fake, nvml = fake_nvml()
    x, y = regression_data(256)
    path = tmp_path / "log.csv"
    cb = GPUUtilizationLogger(log_dir=None, interval=0.02, nvml=nvml)
    tiny_dense_model().fit(
        x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, SlowSteps(), keras.callbacks.CSVLogger(str(path))]
    )
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 2 and float(rows[1]["gpu/0/utilization_percent"]) == 87.0


class RecordEpochKeys(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.keys = []

    def on_epoch_end(self, epoch, logs=None):
        self.keys.append(frozenset(logs))


def test_short_epochs_all_carry_the_same_keys(tmp_path):
    # Epochs of 2 steps take milliseconds: most see no sample, none a CPU span of 0.1 s.
    fake, nvml = fake_nvml()
    x, y = regression_data(32)
    path = tmp_path / "log.csv"
    cb = GPUUtilizationLogger(log_dir=None, interval=0.05, nvml=nvml)
    rec = RecordEpochKeys()
    history = tiny_dense_model().fit(
        x, y, batch_size=16, epochs=5, verbose=0, callbacks=[cb, rec, keras.callbacks.CSVLogger(str(path))]
    )
    ours = {k for k in rec.keys[0] if k.startswith(("gpu/", "host/"))}
    expected = {
        "gpu/0/utilization_percent",
        "gpu/0/memory_used_mib",
        "gpu/0/memory_used_mib_max",
        "gpu/0/power_watts_max",
        "gpu/0/sm_activity_percent",  # GPM: a rate between two samples, there from the first
        "host/cpu_percent",
        "host/system_cpu_percent",
        "host/rss_mib",
        "host/rss_mib_max",
    }
    assert expected <= ours, expected - ours
    assert [sorted(k) for k in rec.keys] == [sorted(rec.keys[0])] * 5
    for key in ours:
        assert len(history.history[key]) == 5, key
    assert history.history["gpu/0/utilization_percent"] == [87.0] * 5  # carried, never a made-up 0
    assert all(v > 0 for v in history.history["host/rss_mib_max"])
    assert [len(e) for e in cb.epoch_history] == [len(cb.epoch_history[0])] * 5
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 5 and ours <= set(rows[0])
    assert not [(i, k) for i, row in enumerate(rows) for k in ours if row[k] in ("", "NA")]


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch runs steps_per_execution=1 only")
def test_steps_per_execution_counts_the_steps_run(tmp_path):
    # 15 batches an epoch in executions of 4: Keras reports the last one as ending at batch 16.
    fake, nvml = fake_nvml()
    x, y = regression_data(15 * 4)
    model = tiny_dense_model()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.01, nvml=nvml)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[cb, SlowSteps()])
    assert cb.global_step == 30
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[cb, SlowSteps()])
    assert cb.global_step == 45
    _, scalars = read_scalars(os.path.join(str(tmp_path), "gpu"))
    assert max(s for s, _ in scalars["gpu/0/utilization_percent"]) <= 45


def test_constructible_with_defaults_and_works_without_gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cb = GPUUtilizationLogger()  # the real NVML: no GPU on this machine (or CI)
    x, y = regression_data(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GPUMonitoringWarning)
        history = tiny_dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    assert "host/rss_mib" in history.history
    assert os.path.isdir(tmp_path / "logs" / "gpu")  # next to Keras's logs/train
    assert not wait_for_no_threads()


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"interval": 0}, ValueError, "interval=0"),
        ({"interval": -1.5}, ValueError, "interval=-1.5"),
        ({"interval": "fast"}, ValueError, "interval='fast'"),
        ({"interval": True}, ValueError, "interval=True"),
        ({"devices": "0"}, TypeError, "devices='0'"),
        ({"devices": [-1]}, ValueError, "entry -1"),
        ({"devices": [0.5]}, ValueError, "entry 0.5"),
        ({"run_name": ""}, ValueError, "run_name=''"),
        ({"log_dir": 3}, TypeError, "log_dir=3"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, error, fragment):
    with pytest.raises(error) as info:
        GPUUtilizationLogger(**kwargs)
    assert fragment in str(info.value) and "Expected" in str(info.value)


def test_log_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="log_dir"):
        GPUUtilizationLogger(log_dir=blocker)
    with pytest.raises(ValueError, match="not a writable directory"):
        GPUUtilizationLogger(log_dir=blocker / "sub")


def test_import_does_not_load_tensorflow():
    code = "import sys, keras_gpu_tools; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    env = dict(os.environ, KERAS_BACKEND="jax" if keras.backend.backend() != "jax" else "torch")
    for backend, module in (("jax", "jax"), ("torch", "torch")):
        try:
            __import__(module)
        except ImportError:
            continue
        env["KERAS_BACKEND"] = backend
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return
    pytest.skip("neither jax nor torch is installed")


@pytest.mark.parametrize("rank", [0, 1])
def test_process_of_a_launched_job_names_its_gpu_by_host_and_nvml_index(tmp_path, monkeypatch, rank):
    """torchrun/SLURM-style: two processes on one host, each seeing its own GPU as GPU:0, no channel."""
    import socket

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(rank))
    fake = FakeNVML([FakeGPU(uuid="GPU-a", utilization=11), FakeGPU(uuid="GPU-b", utilization=22)])
    x, y = regression_data(64)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=NVML(fake))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GPUMonitoringWarning)  # no channel is not a failure: nothing to warn of
        history = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, SlowSteps()])
    label = f"{socket.gethostname()}:{rank}"  # NVML's index: the other process's GPU is the host's other one
    assert history.history[f"gpu/{label}/utilization_percent"] == [[11.0, 22.0][rank]] * 2
    assert not any(k.startswith("job/") for k in history.history)  # no channel: nothing job-wide
    assert sorted(os.listdir(tmp_path / "gpu")) == [f"process_{rank}"]  # and no job run
    acc, scalars = read_scalars(os.path.join(str(tmp_path), "gpu", f"process_{rank}"))
    assert {t.split("/")[1] for t in scalars if t.startswith("gpu/")} == {label}
    record = cb.device_records()[0]
    assert (record["index"], record["label"], record["process_index"], record["process_count"]) == (0, label, rank, 2)


def test_one_process_over_several_gpus_is_the_whole_job(tmp_path):
    """MirroredStrategy or DataParallel in one process: job figures over its own GPUs, nothing exchanged."""
    gpus = [FakeGPU(uuid="GPU-a", utilization=10), FakeGPU(uuid="GPU-b", utilization=40)]
    x, y = regression_data(64)
    cb = GPUUtilizationLogger(log_dir=tmp_path, interval=0.02, nvml=NVML(FakeNVML(gpus)))
    h = tiny_dense_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb, SlowSteps()]).history
    assert h["gpu/0/utilization_percent"] == [10.0] * 2 and h["gpu/1/utilization_percent"] == [40.0] * 2
    assert h["job/gpu/utilization_percent_min"] == [10.0] * 2
    assert h["job/gpu/utilization_percent_mean"] == [25.0] * 2
    assert h["job/gpu/utilization_percent_max"] == [40.0] * 2
    assert sorted(os.listdir(tmp_path / "gpu"))[0].startswith("events.out")  # one process: the run itself, no job run


def test_one_process_one_gpu_has_no_job_keys(tmp_path):
    fake, nvml = fake_nvml()
    x, y = regression_data(64)
    cb = GPUUtilizationLogger(log_dir=None, interval=0.02, nvml=nvml)
    h = tiny_dense_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb, SlowSteps()]).history
    assert "gpu/0/utilization_percent" in h and not any(k.startswith("job/") for k in h)
