"""The records' checksums: the same as TensorBoard's, and the same bytes as its RecordWriter writes."""

import io
import os
import random

from keras_gpu_tools.logdir.crc32c import BLOCK, crc32c, masked_crc32c, numpy_crc32c
from keras_gpu_tools.logdir.writer import EventWriter


def test_the_checksum_is_crc32c_for_every_length_around_the_blocks():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as reference
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as masked_reference

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    rng = random.Random(0)
    lengths = list(range(0, 3 * BLOCK + 70)) + [rng.randrange(1, 200_000) for _ in range(20)]
    for n in lengths:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert crc32c(data) == reference(data), n
        assert numpy_crc32c(data) == reference(data), n  # without the C extension
        assert masked_crc32c(data) == masked_reference(data), n


def test_an_event_file_is_byte_for_byte_what_tensorboards_record_writer_writes(tmp_path):
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.summary.writer.record_writer import RecordWriter

    writer = EventWriter(str(tmp_path))
    writer.text("input/verdict", "x" * 5000, step=1)  # longer than a block, not a multiple of it
    writer.scalars({"gpu/0/utilization_percent": 42.0}, step=2)
    writer.close()
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    events = list(event_file_loader.RawEventFileLoader(path).Load())  # TensorBoard's reader checks every checksum
    assert len(events) == 3  # the file version, the text, the scalar
    expected = io.BytesIO()
    records = RecordWriter(expected)
    for raw in events:
        records.write(raw)
    assert open(path, "rb").read() == expected.getvalue()
