"""A log dir reused by a single-process fit and a job of two processes: the report covers one of them."""

import os

import numpy as np
import pytest

from keras_gpu_tools import cli
from keras_gpu_tools.reporting.report import report


def _single_process_fit(logs):
    """A real fit of one process with the detector and the logger, into `logs` (runs `input`, `gpu`)."""
    import keras

    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(640, 8)).astype("float32"), rng.normal(size=(640, 1)).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    lg = GPUUtilizationLogger(log_dir=str(logs), interval=0.05)
    det = InputBoundDetector(log_dir=str(logs), window=5, sample_every=5, verbose=0)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[lg, det])
    return lg, det


def _touch(logs, runs, when):
    for run in runs:
        for name in os.listdir(logs / run):
            if ".tfevents." in name:
                os.utime(logs / run / name, (when, when))


@pytest.mark.slow
def test_a_single_run_and_a_job_in_one_log_dir_are_reported_apart(tmp_path, capsys):
    pytest.importorskip("jax")
    from tests.distributed.launch import run_job

    run_job("scenarios_report.detector_report", tmp_path, processes=2, args={"delays": [0.0, 0.02]})
    logs = tmp_path / "job" / "logs"  # input/process_0, input/process_1, input/job
    lg, det = _single_process_fit(logs)  # then input, gpu: written last

    # By default the runs written last: the single process's, alone; the job's are named, not mixed in.
    data = report(str(logs)).data
    text = report(str(logs)).text()
    assert data.processes == [] and data.process_count == 1 and data.job_verdict is None and not data.job
    assert "own verdict" not in text and "Job of" not in text
    assert data.verdict["category"] == det.verdict.category
    assert data.split_x == [5.0 * i for i in range(1, 9)]  # its windows of 5 steps over 40 steps, not the job's
    note = next(n for n in data.notes if "leaves them out" in n)
    assert "input/process_0" in note and "input/job" in note and "layout='job'" in note and "--layout job" in note

    # The job's runs on request: its verdict and processes, none of the single run's figures.
    job = report(str(logs), layout="job").data
    assert job.processes == [0, 1] and job.process_count == 2 and job.job_verdict["stragglers"] == [(1, "input wait")]
    assert not job.series  # the single run's GPU logger is left out
    (note,) = [n for n in job.notes if "leaves them out" in n]
    assert "a single process (gpu, input), written later" in note and "layout='single'" in note
    assert "Process 0's own verdict" in report(str(logs), layout="job").text()
    single = report(str(logs), layout="single").data
    assert single.processes == [] and single.series.keys() == data.series.keys() != set()

    # Written the other way round (the job last): the job by default.
    _touch(logs, ["input", "gpu"], 1_000_000_000)
    latest = report(str(logs)).data
    assert latest.processes == [0, 1] and not latest.series
    (note,) = [n for n in latest.notes if "leaves them out" in n]
    assert "a single process (gpu, input), written earlier" in note

    # The command line: --layout, and a layout the directory lacks is refused (exit 2, nothing written).
    out = tmp_path / "r.html"
    assert cli.main(["report", str(logs), "--layout", "single", "-q", "-o", str(out)]) == 0
    assert "Job of" not in out.read_text()
    assert cli.main(["report", str(logs), "--layout", "nope", "-q", "-o", str(tmp_path / "x.html")]) == 2
    assert not (tmp_path / "x.html").exists()
    capsys.readouterr()


def test_a_layout_the_log_dir_lacks_is_refused(tmp_path):
    _single_process_fit(tmp_path)
    assert report(str(tmp_path), layout="single").data.verdict is not None
    with pytest.raises(ValueError, match="layout='job', but the log directory .* holds no run of a job"):
        report(str(tmp_path), layout="job")
    with pytest.raises(ValueError, match="Invalid value for argument `layout`. Received: layout='all'"):
        report(str(tmp_path), layout="all")
