"""Every record's two checksums verified: a flipped bit is named by file and offset, its value never shown."""

import os
import struct

import pytest
from tensorboard.backend.event_processing import event_file_loader

from keras_gpu_tools import report
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import read_event_file, read_run
from keras_gpu_tools.logdir.writer import EventWriter

RSS = [650.0 + i for i in range(8)]  # MiB: the host's memory at 8 samples


def _gpu_run(log_dir):
    """A GPU run as GPUUtilizationLogger writes it: the host's RSS and CPU, one event per sample."""
    w = EventWriter(str(log_dir / "gpu"))
    for i, rss in enumerate(RSS):
        w.scalars({schema.HOST_RSS_MIB: rss, "host/cpu_percent": 50.0}, step=i, wall_time=100.0 + i)
    w.close()
    (name,) = os.listdir(log_dir / "gpu")
    return log_dir / "gpu" / name


def _records(path):
    """(offset, length) of each record of an event file, from its framing."""
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        out.append((at, length))
        at += 12 + length + 4
    return out


def _patch(path, at, new):
    data = bytearray(path.read_bytes())
    data[at : at + len(new)] = new
    path.write_bytes(bytes(data))


def _tensorboard_reads(path):
    """How many records TensorBoard's own reader gets through (it stops at the first bad one)."""
    return sum(1 for _ in event_file_loader.RawEventFileLoader(str(path)).Load())


def _value_times_1000(path, record):
    """The RSS of a record multiplied by 1000 in place, its checksum left as it was."""
    offset, length = _records(path)[record]
    body = path.read_bytes()[offset + 12 : offset + 12 + length]
    old = struct.pack("<f", RSS[record - 1])
    at = body.index(old)
    _patch(path, offset + 12 + at, struct.pack("<f", RSS[record - 1] * 1000))
    return offset


@pytest.mark.parametrize("damage", ["value_times_1000", "bit_in_data", "byte_in_data_checksum"])
def test_a_damaged_record_is_skipped_and_named_once_by_file_and_offset(tmp_path, damage):
    path = _gpu_run(tmp_path)
    record = 4  # the sample of RSS[3] (record 0 is the file's version)
    offset, length = _records(path)[record]
    if damage == "value_times_1000":
        _value_times_1000(path, record)
    elif damage == "bit_in_data":
        _patch(path, offset + 12 + length // 2, bytes([path.read_bytes()[offset + 12 + length // 2] ^ 0x04]))
    else:
        _patch(path, offset + 12 + length, b"\x00\x00\x00\x00")
    assert _tensorboard_reads(path) == record  # TensorBoard's reader stops there: the damage is real

    r = report(str(tmp_path))
    kept = r.data.series[schema.HOST_RSS_MIB]
    assert kept.values == RSS[:3] + RSS[4:]  # the damaged sample left out, every later one read
    ((name, why),) = r.data.unreadable  # named once
    assert name == f"gpu/{path.name}" and f"at byte(s) {offset}:" in why and "checksum" in why
    assert kept.stats()[2] == max(RSS)  # the maximum is a real sample's
    text = r.text()
    assert text.count(path.name) == 1 and "653000" not in text.replace(",", "")  # the damaged value never shown


def test_a_damaged_length_ends_the_file_at_that_record_named_by_offset(tmp_path):
    path = _gpu_run(tmp_path)
    offset, _ = _records(path)[4]
    _patch(path, offset, bytes([path.read_bytes()[offset] ^ 0x01]))  # the length's lowest bit
    assert _tensorboard_reads(path) == 4
    unreadable = []
    values = read_run("gpu", str(path.parent), [path.name], unreadable)
    assert values.scalars[schema.HOST_RSS_MIB].values == RSS[:3]  # where the next record starts is unknown
    ((_, why),) = unreadable
    assert f"record header at byte {offset} fails its checksum" in why and "(4 event(s) read before it)" in why


def test_a_last_record_cut_short_is_no_error_and_said_once(tmp_path):
    path = _gpu_run(tmp_path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 7)  # a writer killed in the middle of its last record
    r = report(str(tmp_path))
    assert r.data.unreadable == [] and r.data.series[schema.HOST_RSS_MIB].values == RSS[:-1]
    (note,) = [n for n in r.data.notes if path.name in n]
    offset = _records_before(path, size)
    assert f"cut short at byte {offset}" in note
    assert r.text().count(path.name) == 1
    assert "could not be read" not in r.text()


def _records_before(path, size):
    """The offset of the last record of the file as it was before truncation (size bytes)."""
    data, at, last = path.read_bytes(), 0, 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        last = at
        at += 12 + length + 4
    return last


def test_text_that_is_not_utf8_is_left_out_as_unreadable_never_mangled(tmp_path):
    w = EventWriter(str(tmp_path / "memory"))
    w.text(schema.MEMORY_VERDICT, "No growth rate yet.", step=1, wall_time=1.0)
    w.close()
    (name,) = os.listdir(tmp_path / "memory")
    path = tmp_path / "memory" / name
    # A writer's byte that is not UTF-8, the record's checksum made to match: only the decoding can tell.
    offset, length = _records(path)[1]
    data = bytearray(path.read_bytes())
    body = bytes(data[offset + 12 : offset + 12 + length]).replace(b"growth", b"g\xffowth")
    from keras_gpu_tools.logdir.crc32c import masked_crc32c

    data[offset + 12 : offset + 12 + length + 4] = body + struct.pack("<I", masked_crc32c(body))
    path.write_bytes(bytes(data))
    unreadable = []
    values = read_run("memory", str(path.parent), [name], unreadable)
    assert schema.MEMORY_VERDICT not in values.texts
    ((_, why),) = unreadable
    assert "not UTF-8" in why and schema.MEMORY_VERDICT in why and "\ufffd" not in why


def test_read_event_file_says_what_it_skipped(tmp_path):
    path = _gpu_run(tmp_path)
    offsets = [o for o, _ in _records(path)]
    for record in (2, 5):
        _value_times_1000(path, record)
    events, said = read_event_file(str(path))
    assert len(events) == len(RSS) + 1 - 2
    assert "has 2 record(s)" in said and f"at byte(s) {offsets[2]}, {offsets[5]}:" in said
