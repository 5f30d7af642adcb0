"""A log dir reused by a single-process fit and a job of two processes: the report covers one of them."""

import os
import time

import numpy as np
import pytest

from keras_gpu_tools import cli
from keras_gpu_tools.input.span import WHOLE_FIT
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


def _job_runs(logs):
    """The runs a job of two processes' detectors writes (input/process_0, input/process_1, input/job), from fixed
    figures through the package's own verdicts and EventWriter: process 1 waits 20 ms of its 25 ms step for input,
    process 0 none (it waits for process 1 in the all-reduce), as the detector's job test measures on a fake clock.
    """
    from keras_gpu_tools.input.measure import Measurement
    from keras_gpu_tools.input.stragglers import job_logs, job_verdict, process_row
    from keras_gpu_tools.input.verdict import verdict_for
    from keras_gpu_tools.logdir import schema
    from keras_gpu_tools.logdir.writer import EventWriter

    steps, fetches = 90, (0.0, 0.02)
    ms = [
        Measurement(
            steps=steps,
            sampled_steps=9,
            fetch=f,
            compute=0.025 - f,
            other=0.0,
            step=0.025,
            wait=f,
            wait_fraction=f / 0.025,
            steps_per_sec=40.0,
            samples_per_sec=640.0,
        )
        for f in fetches
    ]
    pipeline = {"kind": "generator"}
    verdicts = [verdict_for(m, pipeline=pipeline, scope=WHOLE_FIT, fit=m) for m in ms]
    rows = [
        process_row(i, "host", m.logs(), m.logs(), WHOLE_FIT, v.category, v.advice)
        for i, (m, v) in enumerate(zip(ms, verdicts))
    ]
    jv = job_verdict(rows)
    for i, (m, v) in enumerate(zip(ms, verdicts)):  # as InputBoundDetector's write_fit
        w = EventWriter(str(logs / "input" / f"process_{i}"))
        for epoch in (1, 2, 3):
            w.scalars(m.logs(), step=30 * epoch)
        record = {"scope": "fit", "verdict": v, "measurement": m, "figures": m.logs(), "fit_figures": m.logs()}
        w.text(schema.INPUT_VERDICT, v.message, step=steps)
        w.json(schema.INPUT_VERDICT_DATA, {**record, "notes": [], schema.JOB: jv}, step=steps)
        w.close()
    w = EventWriter(str(logs / "input" / "job"))  # process 0's job run
    for epoch in (1, 2, 3):
        w.scalars(job_logs(rows), step=30 * epoch)
    w.text(schema.INPUT_JOB_VERDICT, jv.text(), step=steps)
    w.close()
    return jv


def _touch(logs, runs, when):
    for run in runs:
        for name in os.listdir(logs / run):
            if ".tfevents." in name:
                os.utime(logs / run / name, (when, when))


@pytest.mark.slow
def test_a_single_run_and_a_job_in_one_log_dir_are_reported_apart(tmp_path, capsys):
    logs = tmp_path / "job" / "logs"  # input/process_0, input/process_1, input/job
    assert _job_runs(logs).straggler_processes == [1]
    _touch(logs, ["input/process_0", "input/process_1", "input/job"], time.time() - 3600)  # surely the older
    lg, det = _single_process_fit(logs)  # then input, gpu: written last

    # By default the runs written last: the single process's, alone; the job's are named, not mixed in.
    data = report(str(logs)).data
    text = report(str(logs)).text()
    assert data.processes == [] and data.process_count == 1 and data.job_verdict is None and not data.job
    assert "own verdict" not in text and "Job of" not in text
    assert data.verdict["category"] == det.verdict.category
    # Its two epochs' step-time rows, as its own report has them, not the job's.
    assert data.split_axis == "epoch" and data.split_x == [1.0, 2.0]
    assert data.split["input/wait_ms"] == [pytest.approx(h["input/wait_ms"]) for h in det.epoch_history]
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
