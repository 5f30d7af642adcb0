"""Every notebook in notebooks/ runs top to bottom without an error (on this machine, CPU-sized).

Each runs in a kernel of this interpreter, in a temporary working directory (so its
logs go there), with the backend of this pytest process. A `%tensorboard` the notebook
starts is stopped afterwards.
"""

import glob
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == [
        "01_quickstart.ipynb",
        "02_input_bound.ipynb",
        "03_out_of_memory.ipynb",
        "04_mixed_precision.ipynb",
        "05_profiling.ipynb",
        "06_batch_throughput.ipynb",
        "07_step_breakdown.ipynb",
        "08_find_speedups.ipynb",
    ]


def test_notebooks_are_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path}: outputs not stripped"


def _stop_tensorboards_under(directory):
    """Stops the TensorBoard servers that `%tensorboard` started from `directory` (by pid)."""
    import psutil

    try:
        from tensorboard import manager
    except ImportError:
        return
    for info in manager.get_all():
        try:
            proc = psutil.Process(info.pid)
            if os.path.realpath(proc.cwd()) == os.path.realpath(directory):
                proc.terminate()
                proc.wait(10)
        except (psutil.Error, OSError):
            pass


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # The kernel is this interpreter's (ipykernel's "python3" is sys.executable);
    # %tensorboard finds the tensorboard of the same environment.
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))
    if os.path.exists(os.path.join(bindir, "tensorboard")):
        monkeypatch.setenv("TENSORBOARD_BINARY", os.path.join(bindir, "tensorboard"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # No bound on the notebook's wall time (it moves with the machine's load): the 600 s per cell above
    # catches a hang.
    try:
        client.execute()
    finally:
        _stop_tensorboards_under(tmp_path)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # Every code cell ran, in order (a cell the client skipped would have no count).
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert counts == list(range(1, len(counts) + 1)), counts
