"""A process's claim on a log directory: the first training writes its runs as named, a second one at once its own."""

import os

import pytest

from keras_gpu_tools.logdir import claim, schema

fcntl = pytest.importorskip("fcntl")


def test_the_first_training_writes_its_runs_as_named_and_a_second_at_once_its_own(tmp_path, caplog):
    log_dir = str(tmp_path / "logs")
    assert claim.claim(log_dir) == ""  # the first: it holds the lock
    assert claim.claim(log_dir) == ""  # another fit() of the same process: the same runs
    other = os.open(os.path.join(log_dir, claim.LOCK_NAME), os.O_RDWR)  # as another process would try
    with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    claim.release(log_dir)
    claim.release(log_dir)  # the last release gives the lock back
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # now held by "another process"
    try:
        suffix = claim.claim(log_dir)
        assert suffix == schema.training_run() and schema.TRAINING_NAME_RE.match(suffix)
        assert "another training writes the log directory" in caplog.text
        claim.release(log_dir)
    finally:
        os.close(other)
    assert claim.claim(log_dir) == ""  # the other one gone: the runs as named again
    claim.release(log_dir)


def test_a_remote_log_dir_is_never_locked():
    assert claim.claim("gs://bucket/logs") == ""
    claim.release("gs://bucket/logs")


def test_training_run_names_are_safe_run_names():
    assert schema.training_run("gpu node_1", 42) == "gpu-node-1_pid42"
    assert schema.TRAINING_RUN_RE.match("input/gpu-node-1_pid42").group(2) == "gpu-node-1_pid42"
    assert schema.TRAINING_RUN_RE.match("input/process_1") is None
