"""The host's figures the leak detector reads at each epoch end."""

import os
import sys

import numpy as np
import pytest

from keras_gpu_tools.leaks import host


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_rss_is_psutils_figure_and_follows_an_allocation():
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    before = host.rss_bytes()
    assert before is not None and abs(before - me.memory_info().rss) < 16 * 2**20
    block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB, touched
    after = host.rss_bytes()
    assert after is not None and after - before > 48 * 2**20 and abs(after - me.memory_info().rss) < 16 * 2**20
    del block


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_reads_its_own_rss():
    host.rss_bytes()  # the parent's descriptor is open
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own /proc/<pid>/statm, not the parent's
        os.close(r)
        ok = host.rss_bytes() is not None and host._statm is not None and host._statm[0] == os.getpid()
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r)
