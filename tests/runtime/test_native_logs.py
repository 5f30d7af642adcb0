"""Native log lines kept off file descriptor 2 while a block runs; everything else still reaches it."""

import logging
import os
import threading

import pytest

from keras_gpu_tools.runtime import native_logs
from keras_gpu_tools.runtime.native_logs import quiet_native_logs

ABSL = b"I0000 00:00:1764331200.123456   4242 profiler_session.cc:104] Profiler session initializing.\n"
OLD_TF = b"2026-11-28 12:00:00.123456: W tensorflow/core/profiler/lib/profiler_session.cc:110] Profiler is running.\n"
KINETO = b"USDT:2026-11-28 12:28:01 11887:11887 SyncActivityProfilerHandler.cpp:52] profiler_start\n"


def test_native_lines_go_to_the_logger_and_the_rest_to_the_terminal(capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="keras_gpu_tools"), quiet_native_logs():
        os.write(2, ABSL + b"a warning of someone else\n" + OLD_TF + KINETO)
    err = capfd.readouterr().err
    assert err == "a warning of someone else\n"
    assert all(m in caplog.text for m in ("Profiler session initializing.", "Profiler is running.", "profiler_start"))
    os.write(2, ABSL)  # descriptor 2 is the terminal again
    assert capfd.readouterr().err == ABSL.decode()


def test_descriptor_2_is_restored_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError, match="the profiler failed"), quiet_native_logs():
        os.write(2, ABSL)
        raise RuntimeError("the profiler failed")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    assert native_logs._depth == 0 and native_logs._saved is None


def test_blocks_that_nest_and_overlap_across_threads_restore_once_the_last_ends(capfd):
    inside, release = threading.Event(), threading.Event()

    def other_thread():
        with quiet_native_logs():
            os.write(2, ABSL)
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other_thread)
    with quiet_native_logs():
        t.start()
        assert inside.wait(5)
        with quiet_native_logs():
            os.write(2, OLD_TF)
    os.write(2, ABSL)  # the other thread's block still runs: held back with it
    release.set()
    t.join(5)
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
