"""Reading a long run: what is kept per tag is bounded, its figures exact, memory flat in the file's size."""

import os
import tracemalloc

import numpy as np
import pytest

from keras_gpu_tools.logdir import reader
from keras_gpu_tools.logdir.reader import find_runs, read_run
from keras_gpu_tools.logdir.series import MAX_POINTS, Series
from keras_gpu_tools.logdir.writer import EventWriter


def _long_run(directory, n):
    """`n` samples of a GPU and the host as GPUUtilizationLogger writes them (one event each); the values."""
    rng = np.random.default_rng(n)
    util = rng.uniform(0, 100, size=n)
    w = EventWriter(str(directory))
    for i in range(n):
        w.scalars({"gpu/0/utilization_percent": util[i], "host/rss_mib": 900.0 + i}, step=i // 4, wall_time=1e9 + i)
    w.close()
    return util.astype("float32").astype(float)  # what simple_value (a float32) holds


@pytest.mark.parametrize("n", [3 * MAX_POINTS, 30 * MAX_POINTS])
def test_points_kept_per_tag_are_bounded_and_the_figures_exact(tmp_path, n):
    util = _long_run(tmp_path, n)
    ((run, directory, files),) = find_runs(str(tmp_path))
    s = read_run(run, directory, files, []).scalars["gpu/0/utilization_percent"]
    assert MAX_POINTS // 2 <= len(s.values) <= MAX_POINTS + 1  # whatever the run's length
    assert s.n == n and s.sampled
    low, mean, high, last = s.stats()
    assert (low, high, last) == (util.min(), util.max(), util[-1]) and mean == pytest.approx(util.mean(), rel=1e-12)
    # Evenly spaced points, the first and the last among them: always the same ones.
    assert s.wall[0] == 1e9 and s.wall[-1] == 1e9 + n - 1 and s.values[-1] == util[-1]
    gaps = set(np.diff(s.wall[:-1]))
    assert gaps == {float(s.stride)} and s.values[:-1] == list(util[:: s.stride][: len(s.values) - 1])


def test_a_series_keeps_the_same_points_however_they_come():
    one, chunks = Series("a"), Series("a")
    values = [float(v) for v in range(10 * MAX_POINTS + 7)]
    for v in values:
        one.add(v, int(v), v)
    for i in range(0, len(values), 999):
        part = values[i : i + 999]
        chunks.extend(part, [int(v) for v in part], part)
    assert (one.wall, one.steps, one.values, one.stats()) == (chunks.wall, chunks.steps, chunks.values, chunks.stats())


def test_memory_does_not_grow_with_the_file(tmp_path, monkeypatch):
    """A file ten times larger needs no more memory to read (small chunks, so both files span several)."""
    monkeypatch.setattr(reader.EventFile, "CHUNK_BYTES", 1 << 14)
    monkeypatch.setattr(reader, "_PENDING", 1000)
    peaks = []
    for n in (2000, 20000):
        _long_run(tmp_path / str(n), n)
        ((run, directory, files),) = find_runs(str(tmp_path / str(n)))
        tracemalloc.start()
        read_run(run, directory, files, [])
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 2 * peaks[0], peaks


def test_a_file_cut_short_is_read_to_its_last_whole_record_and_said_once(tmp_path):
    _long_run(tmp_path, 50)
    ((run, directory, files),) = find_runs(str(tmp_path))
    path = os.path.join(directory, files[0])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 5)
    unreadable = []
    values = read_run(run, directory, files, unreadable)
    assert values.events == 50 and values.scalars["host/rss_mib"].n == 49
    assert unreadable == []  # a writer stopped mid-record: no error
    (note,) = values.notes
    assert "cut short" in note and "the 50 event(s) before it are read" in note
