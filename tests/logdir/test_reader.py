"""The event file reader on hostile log directories: FIFOs, crafted lengths, deep JSON, odd names."""

import json
import os
import struct
import threading

from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from keras_gpu_tools.logdir.reader import find_runs, read_event_file, read_run
from keras_gpu_tools.logdir.writer import EventWriter
from tests.helpers.timing_telemetry import fifo_reader_seen


def _one_event_file(run_dir) -> str:
    w = EventWriter(str(run_dir))
    w.scalars({"host/cpu_percent": 50.0}, step=1, wall_time=10.0)
    w.close()
    (name,) = os.listdir(run_dir)
    return os.path.join(run_dir, name)


def test_a_fifo_named_like_an_event_file_is_never_opened(tmp_path):
    fifo = tmp_path / "events.out.tfevents.1700000000.host.1.v2"
    os.mkfifo(fifo)
    result = {}
    with fifo_reader_seen(fifo) as seen:  # whether it was opened, however long the read took
        reader = threading.Thread(target=lambda: result.update(out=read_event_file(str(fifo))))
        reader.start()
        reader.join()
    assert not seen["opened"], "read_event_file blocked in open() on a FIFO"
    events, problem = result["out"]
    assert events == [] and "not a regular file" in problem and "FIFO" in problem


def test_a_record_longer_than_the_rest_of_the_file_is_refused(tmp_path):
    path = _one_event_file(tmp_path / "gpu")
    header = struct.pack("<Q", 2**40)
    with open(path, "ab") as f:  # a valid length checksum announcing 1 TiB, then a few bytes
        f.write(header + struct.pack("<I", masked_crc32c(header)) + b"\x00" * 64)
    events, problem = read_event_file(path)
    assert len(events) == 2  # the file version and the scalar before it
    assert "announces 1099511627776 bytes" in problem and "only 64 bytes follow" in problem, problem


def test_an_empty_event_file_is_named(tmp_path):
    path = tmp_path / "events.out.tfevents.1700000000.host.1.v2"
    path.write_bytes(b"")
    events, problem = read_event_file(str(path))
    assert events == [] and "is empty" in problem


def test_a_json_text_nested_too_deep_is_refused_and_the_file_named(tmp_path):
    w = EventWriter(str(tmp_path / "input"))
    w.text("input/verdict/data", "[" * 200_000 + "]" * 200_000, step=1)
    w.json("gpu/devices/data", [{"name": "H100", "ids": [[0, 1], {"a": "[[[[[["}]}], step=1)  # shallow: kept
    w.close()
    ((run, directory, files),) = find_runs(str(tmp_path))
    unreadable = []
    values = read_run(run, directory, files, unreadable)
    assert "input/verdict/data" not in values.texts and "gpu/devices/data" in values.texts
    ((name, why),) = unreadable
    assert name == f"input/{files[0]}" and "input/verdict/data" in why and "nested deeper than" in why


def test_names_that_are_not_utf8_are_shown_with_their_escapes(tmp_path):
    odd = os.path.join(os.fsencode(tmp_path), b"run_\xff")
    _one_event_file(os.fsdecode(odd))
    ((run, directory, files),) = find_runs(str(tmp_path))
    assert run == "run_\\xff" and run.encode("utf-8")  # printable
    assert os.path.isdir(directory)  # the directory itself still opens
    assert len(read_event_file(os.path.join(directory, files[0]))[0]) == 2


def test_event_files_are_read_in_the_order_they_were_written(tmp_path):
    """A process's tenth file of one second comes after its ninth (names compared as numbers)."""
    for counter, value in ((9, 1.0), (10, 2.0)):
        name = f"events.out.tfevents.1700000000.host.42.{counter}"
        w = EventWriter(str(tmp_path))
        w.scalars({"host/cpu_percent": value}, step=int(value), wall_time=10.0)
        w.close()
        (written,) = [f for f in os.listdir(tmp_path) if not f.startswith("events.out.tfevents.1700000000")]
        os.rename(tmp_path / written, tmp_path / name)
    ((_, _, files),) = find_runs(str(tmp_path))
    assert files == ["events.out.tfevents.1700000000.host.42.9", "events.out.tfevents.1700000000.host.42.10"]
    values = read_run(".", str(tmp_path), files, [])
    assert values.scalars["host/cpu_percent"].steps == [1, 2]


def test_json_records_are_read_from_their_own_plugin_and_from_the_text_of_earlier_versions(tmp_path):
    """The JSON the report reads is kept out of TensorBoard's Text tab; logs of earlier versions held it as text."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from keras_gpu_tools.logdir import schema

    new, old = tmp_path / "new", tmp_path / "old"
    w = EventWriter(str(new))
    w.text(schema.INPUT_VERDICT, "Fit: not input-bound", step=3)
    w.json(schema.INPUT_VERDICT_DATA, {"scope": "fit", "wait": 0.01}, step=3)
    w.close()
    w = EventWriter(str(old))  # the earlier layout: the JSON as a text of the text plugin
    w.text(schema.INPUT_VERDICT_DATA, '{"scope": "fit", "wait": 0.02}', step=3)
    w.close()

    acc = EventAccumulator(str(new))
    acc.Reload()
    assert set(acc.PluginTagToContent(schema.TEXT_PLUGIN)) == {schema.INPUT_VERDICT}
    assert set(acc.PluginTagToContent(schema.DATA_PLUGIN)) == {schema.INPUT_VERDICT_DATA}
    for run, wait in ((new, 0.01), (old, 0.02)):
        values = read_run(run.name, str(run), os.listdir(run), [])
        (point,) = values.texts[schema.INPUT_VERDICT_DATA]
        assert point.step == 3 and json.loads(point.text) == {"scope": "fit", "wait": wait}
