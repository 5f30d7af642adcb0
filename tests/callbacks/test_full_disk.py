"""A full disk under the log dir: one warning a run naming its directory, no traceback, training goes on."""

import contextlib
import os
import shutil
import subprocess
import warnings

import pytest

from keras_gpu_tools import InputBoundDetector, MemoryLeakDetector, OOMBatchSizeReducer
from keras_gpu_tools.errors import KerasGPUToolsWarning
from keras_gpu_tools.logdir import writer as writer_module
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model


@contextlib.contextmanager
def _full_disk(tmp_path, monkeypatch):
    """A directory on a full file system: a 64 KiB tmpfs filled up where one can be mounted, else writes to /dev/full."""
    where = tmp_path / "logs"
    where.mkdir()
    mounted = (
        shutil.which("mount")
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )
    try:
        if mounted:
            with open(where / "filler", "wb") as f, contextlib.suppress(OSError):
                f.write(b"\0" * 65536)  # every block taken: the kernel's own ENOSPC
        elif os.path.exists("/dev/full"):
            opened = writer_module._LocalEvents.__init__

            def to_dev_full(self, run_dir):
                opened(self, run_dir)
                self._file.close()
                self._file = open("/dev/full", "wb", buffering=0)  # every write: ENOSPC

            monkeypatch.setattr(writer_module._LocalEvents, "__init__", to_dev_full)
        else:
            pytest.skip("no tmpfs mount and no /dev/full: no real out-of-space error here")
        yield str(where)
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=False)


def test_a_full_disk_is_said_once_a_run_and_training_goes_on(tmp_path, monkeypatch, capfd):
    with _full_disk(tmp_path, monkeypatch) as log_dir:
        callbacks = [
            InputBoundDetector(log_dir=log_dir, verbose=0),
            MemoryLeakDetector(log_dir=log_dir, verbose=0),
            OOMBatchSizeReducer(log_dir=log_dir, verbose=0),
        ]
        model = tiny_dense_model()
        x, y = regression_data(256)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(x, y, batch_size=32, epochs=4, verbose=0, callbacks=callbacks)
    assert len(history.history["loss"]) == 4  # training went on
    said = [str(w.message) for w in caught if issubclass(w.category, KerasGPUToolsWarning)]
    full = [m for m in said if "No space left on device" in m]
    runs = [m.split("writing the logs in ", 1)[1].split(" failed", 1)[0] for m in full]
    assert full and len(runs) == len(set(runs)), full  # at most one warning a run
    assert all(r.startswith(log_dir) for r in runs) and all("training goes on" in m for m in full)
    assert len(full) == len(said), said  # nothing else said about it
    assert "Traceback" not in capfd.readouterr().err
