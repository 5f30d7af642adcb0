"""MemoryLeakDetector end to end: real fits, real event files read back, the report from a real log dir."""

import keras
import numpy as np
import pytest

from keras_gpu_tools import MemoryLeakDetector, report
from keras_gpu_tools.leaks import advice
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import find_runs, read_run
from tests.helpers.callbacks import KeepTensors
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model


@pytest.fixture(autouse=True)
def _fresh_process_record():
    MemoryLeakDetector.forget_fits()  # each test is its own experiment
    yield
    MemoryLeakDetector.forget_fits()


def _fit(detector, kept_mib=0.0, epochs=10):
    model = tiny_dense_model(features=16, hidden=32)
    x, y = regression_data(128, features=16)
    keep = KeepTensors(kept_mib)
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=[keep, detector])
    return history.history


@pytest.mark.multibackend
@pytest.mark.slow
def test_tensors_kept_each_epoch_read_as_host_growth_with_their_cause(tmp_path):
    det = MemoryLeakDetector(log_dir=str(tmp_path), verbose=0)
    hist = _fit(det, kept_mib=24.0)
    growth = hist[schema.MEMORY_HOST_GROWTH]
    assert growth[-1] == pytest.approx(24.0, abs=5.0), growth
    assert len(hist[schema.MEMORY_HOST_RSS_MIB]) == 10
    v = det.verdict
    assert v.category == "grows" and v.host_mib_per_epoch == pytest.approx(24.0, abs=5.0)
    assert advice.TENSORS_KEPT in v.causes, det.summary()
    assert "runs out in about" in v.message
    # The event files: the epochs' figures and the verdict, read back with the package's reader.
    (run, path, files), *_ = [r for r in find_runs(str(tmp_path)) if r[0] == "memory"]
    values = read_run(run, path, files, [])
    assert len(values.scalars[schema.MEMORY_HOST_RSS_MIB].values) == 10
    assert values.scalars[schema.MEMORY_HOST_GROWTH].values[-1] == pytest.approx(growth[-1])
    assert schema.MEMORY_VERDICT_DATA in values.texts and schema.MEMORY_VERDICT in values.texts


@pytest.mark.multibackend
@pytest.mark.slow
def test_a_clean_run_of_the_same_length_is_stable():
    det = MemoryLeakDetector(log_dir=None, verbose=0)
    hist = _fit(det, kept_mib=0.0)
    assert abs(hist[schema.MEMORY_HOST_GROWTH][-1]) < 2.0, hist[schema.MEMORY_HOST_GROWTH]
    assert det.verdict.category == "stable" and det.verdict.causes == []
    assert "stable" in det.summary()


@pytest.mark.multibackend
def test_fewer_than_three_epochs_after_the_warm_up_claim_no_slope():
    det = MemoryLeakDetector(log_dir=None, verbose=0)
    hist = _fit(det, kept_mib=24.0, epochs=3)  # 2 epochs after the warm-up
    assert schema.MEMORY_HOST_GROWTH not in hist and schema.MEMORY_DEVICE_GROWTH not in hist
    assert len(hist[schema.MEMORY_HOST_RSS_MIB]) == 3
    assert det.verdict.category == "unknown" and "3 needed" in det.verdict.message


def test_on_a_cpu_the_device_figures_are_absent_not_zero():
    det = MemoryLeakDetector(log_dir=None, verbose=0)
    hist = _fit(det, epochs=5)
    if MemoryLeakDetector().backend.gpu_devices():
        pytest.skip("this machine has a GPU")
    assert schema.MEMORY_DEVICE_IN_USE_MIB not in hist and schema.MEMORY_DEVICE_GROWTH not in hist


def _loop_of_fits(clear):
    """The loop's verdict, read in a fresh process (what the loop adds to RSS depends on the process's past)."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "tests.helpers.leak_loops"] + (["--clear"] if clear else [])
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_loop_of_fits_building_models_without_clear_session_is_named_with_the_fix():
    if keras.backend.backend() == "torch":
        pytest.skip("torch keeps under 1 MiB per such fit: nothing grows to name")
    v = _loop_of_fits(clear=False)
    assert v["fits"] == 10 and "host per fit" in v["grows"], v["message"]
    assert v["causes"][0] == advice.CLEAR_SESSION
    assert "keras.backend.clear_session()" in v["advice"][0]
    assert v["history"] == 10


@pytest.mark.multibackend
@pytest.mark.slow
def test_with_clear_session_in_the_loop_it_is_not_named():
    v = _loop_of_fits(clear=True)
    assert v["fits"] == 10 and advice.CLEAR_SESSION not in v["causes"], v["message"]


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"warmup_epochs": -1}, ValueError, "argument `warmup_epochs`. Received: warmup_epochs=-1"),
        ({"warmup_epochs": 1.5}, ValueError, "argument `warmup_epochs`"),
        ({"min_growth_mib": -1}, ValueError, "argument `min_growth_mib`. Received: min_growth_mib=-1"),
        ({"min_growth_mib_per_fit": -2.0}, ValueError, "argument `min_growth_mib_per_fit`"),
        ({"verbose": 3}, ValueError, "argument `verbose`"),
        ({"count_tensors": "yes"}, TypeError, "argument `count_tensors`"),
        ({"progress_bar": "some"}, ValueError, "argument `progress_bar`"),
        ({"run_name": ""}, ValueError, "argument `run_name`"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        MemoryLeakDetector(log_dir=None, **kwargs)


@pytest.mark.slow
def test_report_section_from_a_real_log_dir_and_from_the_callback(tmp_path):
    det = MemoryLeakDetector(log_dir=str(tmp_path), verbose=0)
    _fit(det, kept_mib=24.0, epochs=6)
    _fit(det, kept_mib=0.0, epochs=4)  # a second fit: the process's fits are in the report too
    for r in (report(str(tmp_path)), report(det)):
        text = str(r)
        assert "Memory over time" in text and "Verdict: memory" in text
        assert r.data.memory_verdict["category"] in ("grows", "stable")
        assert len(r.data.memory_verdict["fits"]) == 2
        assert r.data.memory_series[schema.MEMORY_HOST_RSS_MIB].values
        assert "kgt-memory-verdict" in r.html()
    assert len(report(str(tmp_path)).data.memory_series[schema.MEMORY_HOST_RSS_MIB].values) == 10
    pytest.importorskip("matplotlib")
    assert "memory" in report(str(tmp_path)).pngs()


def test_a_monitoring_failure_warns_once_and_training_goes_on(monkeypatch):
    det = MemoryLeakDetector(log_dir=None, verbose=0)

    def broken():
        raise RuntimeError("no counter")

    monkeypatch.setattr(det.backend, "trace_counter", lambda model, names=(): broken)  # what an epoch end reads
    with pytest.warns(Warning, match="compiled functions could not be read") as caught:
        hist = _fit(det, epochs=4)
    assert len(hist["loss"]) == 4 and schema.MEMORY_COMPILED_FUNCTIONS not in hist
    assert sum("compiled functions" in str(w.message) for w in caught) == 1
    assert np.isfinite(hist[schema.MEMORY_HOST_RSS_MIB]).all()
