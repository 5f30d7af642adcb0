"""The event writer: TensorBoard's format, read back by TensorBoard's reader, with no thread of its own."""

import json
import os
import subprocess
import sys
import threading
import warnings

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from keras_gpu_tools.errors import KerasGPUToolsWarning
from keras_gpu_tools.logdir.writer import EventWriter


def _read(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_events_read_back_by_tensorboard_while_the_writer_is_open(tmp_path):
    w = EventWriter(str(tmp_path / "gpu"))
    try:
        w.scalars({"gpu/0/utilization": 87.5, "host/cpu": 12.0}, step=3, wall_time=1000.0)
        w.scalars({"gpu/0/utilization": 90.0}, step=4)
        w.json("gpu/devices/data", {"name": "H100", "ids": (0, 1)}, step=3)
        # No flush, no close: each event is on disk when the call returns.
        acc = _read(tmp_path / "gpu")
        util = acc.Scalars("gpu/0/utilization")
        assert [(e.step, e.value) for e in util] == [(3, 87.5), (4, 90.0)]
        assert util[0].wall_time == 1000.0
        assert acc.Scalars("host/cpu")[0].value == 12.0
        (text,) = acc.Tensors("gpu/devices/data")
        assert json.loads(text.tensor_proto.string_val[0]) == {"name": "H100", "ids": [0, 1]}
        (name,) = os.listdir(tmp_path / "gpu")
        assert name.startswith("events.out.tfevents.") and name == os.path.basename(w._events.path)
    finally:
        w.close()
    w.close()  # twice is harmless
    w.scalars({"late": 1.0}, step=5)  # after close: dropped, never raises
    assert "late" not in _read(tmp_path / "gpu").Tags()["scalars"]


def test_scalars_handed_over_are_written_by_another_thread_or_at_close(tmp_path):
    w = EventWriter(str(tmp_path / "gpu"))
    w.scalars_later({"gpu_epoch/0/power_watts": 300.0}, step=7)
    assert "gpu_epoch/0/power_watts" not in _read(tmp_path / "gpu").Tags()["scalars"]  # handed over: not yet written
    t = threading.Thread(target=w.write_later)
    t.start()
    t.join()
    assert [(e.step, e.value) for e in _read(tmp_path / "gpu").Scalars("gpu_epoch/0/power_watts")] == [(7, 300.0)]
    w.write_later()  # nothing pending: nothing written twice
    w.scalars_later({"gpu_epoch/0/power_watts": 310.0}, step=8)
    w.close()  # what is still pending is written before the file closes
    assert [e.step for e in _read(tmp_path / "gpu").Scalars("gpu_epoch/0/power_watts")] == [7, 8]
    w.scalars_later({"gpu_epoch/0/power_watts": 1.0}, step=9)  # after close: dropped
    w.write_later()
    assert [e.step for e in _read(tmp_path / "gpu").Scalars("gpu_epoch/0/power_watts")] == [7, 8]


def test_writes_handed_over_keep_their_order_their_time_and_survive_one_that_fails(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    w = EventWriter(str(tmp_path / "input"))
    w.scalars_later({"input/wait_fraction": 0.5}, step=10)
    w.later(lambda: w.json("input/verdict/data", {"scope": "epoch 1"}, step=10, wall_time=1234.0))

    def broken():
        raise ValueError("a record that cannot be made")

    w.later(broken)
    w.scalars_later({"input/wait_fraction": 0.25}, step=20)
    with pytest.warns(KerasGPUToolsWarning, match="left out"):
        t = threading.Thread(target=w.write_later)  # the session's thread writes them...
        t.start()
        w.write_later()  # ...while fit()'s end waits for those writes, then writes what is left
    t.join()
    w.json("input/verdict/data", {"scope": "fit"}, step=20)  # written last, as on_train_end does
    w.close()
    events = [e for e in EventFileLoader(w._events.path).Load() if e.HasField("summary")]
    order = [(e.step, e.summary.value[0].tag) for e in events]
    assert order == [(10, "input/wait_fraction"), (10, "input/verdict/data"), (20, "input/wait_fraction")] + [
        (20, "input/verdict/data")
    ]
    assert events[1].wall_time == 1234.0


def test_two_writers_in_one_run_dir_never_share_a_file(tmp_path):
    a, b = EventWriter(str(tmp_path / "run")), EventWriter(str(tmp_path / "run"))
    a.close()
    b.close()
    assert a._events.path != b._events.path and len(os.listdir(tmp_path / "run")) == 2


def test_writing_starts_no_thread(tmp_path):
    before = set(threading.enumerate())
    w = EventWriter(str(tmp_path / "input"))
    for step in range(50):
        w.scalars({"input/wait_fraction": 0.1}, step=step)
    w.text("input/verdict", "not input-bound", step=50)
    assert set(threading.enumerate()) - before == set()
    w.close()


def test_a_failed_write_warns_once_and_training_goes_on(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux) for a real out-of-space error")
    w = EventWriter(str(tmp_path / "oom"))
    local = w._events
    local._file.close()
    local._file = open("/dev/full", "wb", buffering=0)  # every write fails with ENOSPC, as on a full disk
    local._records = RecordWriter(local._file)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.scalars({"oom/events": 1.0}, step=1)  # must not raise
        w.scalars({"oom/events": 2.0}, step=2)
        w.flush()
        w.close()
    mine = [x for x in caught if issubclass(x.category, KerasGPUToolsWarning) and "writing the logs" in str(x.message)]
    assert len(mine) == 1
    message = str(mine[0].message)
    assert "training goes on" in message and w.run_dir in message and "No space left" in message


def _full(writer):
    """Points `writer`'s event file at /dev/full: every write fails with ENOSPC, as on a full disk."""
    local = writer._events
    local._file.close()
    local._file = open("/dev/full", "wb", buffering=0)


def test_a_full_disk_is_said_once_a_run_whichever_of_its_writers_finds_it(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux) for a real out-of-space error")
    from keras_gpu_tools.logdir.writer import is_write_error, writes_failed, writes_stopped

    run = str(tmp_path / "profile")
    w = EventWriter(run)
    _full(w)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.text("profile/steps_3_6", "a window", step=1)
        # The profiler's own writer of the same run, then the OOM event files': nothing more said.
        error = RuntimeError(f"{run}/plugins/profile/x/vm.xplane.pb; No space left on device")  # TensorFlow's words
        assert is_write_error(error) and not is_write_error(RuntimeError("a bug"))
        writes_failed(run, error)
        writes_failed(run + "/", OSError(28, "No space left on device"))
        assert writes_stopped(run)
        w.close()
    assert [str(x.message).count(run) for x in caught] == [1]
    later = EventWriter(run)  # a later fit, space freed: the run is written again
    later.scalars({"a": 1.0}, step=1)
    later.close()
    assert not writes_stopped(run) and _read(run).Tags()["scalars"] == ["a"]


def test_writing_does_not_import_tensorflow(tmp_path):
    # TensorBoard's own EventFileWriter imports TensorFlow when it is installed (2-3 s, and a
    # second framework in a JAX or torch process); ours must not.
    code = (
        "import sys; from keras_gpu_tools.logdir.writer import EventWriter; "
        f"w = EventWriter({str(tmp_path / 'run')!r}); w.scalars({{'a': 1.0}}, step=1); "
        "w.text('t', 'x', step=1); w.json('t/data', [1], step=1); w.close(); "
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
    assert len(_read(tmp_path / "run").Scalars("a")) == 1


class _FakeEventFileWriter:
    """Stands for tensorboard's writer on a bucket this machine cannot reach."""

    made: list = []

    def __init__(self, logdir, flush_secs=120):
        self.logdir, self.flush_secs, self.events, self.calls = logdir, flush_secs, [], []
        _FakeEventFileWriter.made.append(self)

    def add_event(self, event):
        if len(self.events) == 2:
            raise OSError("the connection to the bucket was lost")
        self.events.append(event)

    def flush(self):
        self.calls.append("flush")

    def close(self):
        self.calls.append("close")


def test_a_remote_run_goes_through_tensorboards_writer(tmp_path, monkeypatch):
    # gs://, s3://, hdfs:// need tensorboard's file system layer (TensorFlow's, for gs://), and
    # its thread keeps a slow upload off the caller: no local file, no local directory.
    import types

    from keras_gpu_tools.runtime import deps

    monkeypatch.setattr(
        deps, "tensorboard_event_writer", lambda: types.SimpleNamespace(EventFileWriter=_FakeEventFileWriter)
    )
    monkeypatch.chdir(tmp_path)
    _FakeEventFileWriter.made.clear()
    w = EventWriter("gs://bucket/logs/gpu")
    (remote,) = _FakeEventFileWriter.made
    assert (remote.logdir, remote.flush_secs) == ("gs://bucket/logs/gpu", 10)
    w.scalars({"gpu/0/utilization": 50.0}, step=1)
    w.flush()
    assert [type(e) for e in remote.events] == [event_pb2.Event] and remote.events[0].step == 1
    assert remote.calls == ["flush"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.text("gpu/devices", "one H100", step=1)
        w.scalars({"gpu/0/utilization": 60.0}, step=2)  # the third event fails: warned, never raised
        w.scalars({"gpu/0/utilization": 70.0}, step=3)
        w.close()
    assert (
        len(
            [
                x
                for x in caught
                if issubclass(x.category, KerasGPUToolsWarning) and "gs://bucket/logs/gpu" in str(x.message)
            ]
        )
        == 1
    )
    assert len(remote.events) == 2 and remote.calls == ["flush", "close"]
    assert os.listdir(tmp_path) == []
