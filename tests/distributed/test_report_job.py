"""report() of a log_dir written by a real job of two JAX processes (CPU, gloo), one of them slowed on purpose."""

import json
import shutil

import pytest

from keras_gpu_tools import cli
from keras_gpu_tools.reporting.report import report
from tests.distributed.launch import run_job

pytest.importorskip("jax")


def read_json(run_dir, tag="input/verdict/data"):
    """The last JSON of ``tag`` in a run, read with TensorBoard's reader."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return json.loads(acc.Tensors(tag)[-1].tensor_proto.string_val[0])


def row_of(text, process):
    """The line of the per-process table that starts with the process index."""
    return next(line for line in text.splitlines() if line.split(" ", 1)[0] == str(process))


@pytest.mark.slow
def test_the_report_shows_each_process_and_names_the_straggler(tmp_path, capsys):
    # Process 1 takes 20 ms to load each batch, process 0 nothing (the detector's own straggler job, on a fake
    # clock in each process: 5 ms of compute a step, process 0 waiting for process 1 in the all-reduce).
    results = run_job("scenarios_report.detector_report", tmp_path, processes=2, args={"delays": [0.0, 0.02]})
    logs = tmp_path / "job" / "logs"
    input_runs = logs / "input"
    # What each process measured of itself, in its own run (the scope of the whole fit): exact figures.
    own = [read_json(input_runs / f"process_{i}")["figures"] for i in range(2)]
    assert own[1]["input/wait_fraction"] == pytest.approx(0.8) and own[0]["input/wait_fraction"] == 0.0, own
    assert own[0]["input/step_ms"] == pytest.approx(25.0) and own[1]["input/step_ms"] == pytest.approx(25.0), own

    rep = report(str(logs))
    jv = rep.data.job_verdict
    assert rep.data.process_count == 2 and [p["process"] for p in jv["processes"]] == [0, 1]
    assert jv["stragglers"] == [(1, "input wait")]
    assert jv["message"] == results[0]["job_message"] and jv["advice"] == results[0]["job_advice"]
    for i, p in enumerate(jv["processes"]):  # each row is that process's own steady state, not process 0's
        assert p["wait_fraction"] == pytest.approx(own[i]["input/wait_fraction"])
        assert p["step_ms"] == pytest.approx(own[i]["input/step_ms"])

    text = rep.text()
    section = text.split("Job of 2 processes")[1]
    assert "Input pipeline of each process (its steady state):" in section
    for i in range(2):
        line = row_of(section, i)
        assert f"{100 * own[i]['input/wait_fraction']:.1f}%" in line and f"{own[i]['input/step_ms']:.2f} ms" in line
    assert row_of(section, 1).startswith("1 (straggler: input wait)") and "straggler" not in row_of(section, 0)
    assert "Process 1 holds the job back" in section and "What to change:" in section
    assert "- Process 1: A Python generator runs in the training loop" in section
    # The job keys of the detector's job run in the table of job-wide figures: process 1 waits the most.
    assert "input_wait_process: 1" in section and "step_ms_slowest_process: " in section

    html = rep.html()
    assert "straggler: process 1" in html  # the badge
    assert "<td>1 (straggler: input wait)</td>" in html and "Process 1 holds the job back" in html
    assert "<li>Process 1: A Python generator runs in the training loop" in html

    # The command line shows the same, and writes the same HTML.
    out = tmp_path / "report.html"
    assert cli.main(["report", str(logs), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert row_of(printed.split("Job of 2 processes")[1], 1) == row_of(section, 1)
    assert "Process 1 holds the job back" in out.read_text()

    # From each process's own callbacks: the same verdict (every process computes it from the same figures).
    for r in results:
        assert r["report_job_verdict"]["stragglers"] == [[1, "input wait"]]
        assert row_of(r["report_text"].split("Job of 2")[1], 1) == row_of(section, 1)
        assert "input_wait_process: 1" in r["report_text"] and "straggler: process 1" in r["report_html"]

    # The detector's own folder (`keras-gpu-tools report logs/input`): the same, process 0's figures alone.
    mine = report(str(input_runs)).data
    assert mine.processes == [0, 1] and mine.job_verdict == jv
    assert mine.split == rep.data.split and mine.verdict["message"] == rep.data.verdict["message"]
    assert {k: s.values for k, s in mine.job.items()} == {k: s.values for k, s in rep.data.job.items()} != {}

    # Only the job run left (say, the process runs are on other hosts): its text is shown as written.
    alone = tmp_path / "alone"
    shutil.copytree(input_runs / "job", alone / "input" / "job")
    text = report(str(alone)).text()
    assert "| 1 (straggler) |" in text and "Process 1 holds the job back" in text


@pytest.mark.slow
def test_a_process_that_gave_up_on_the_channel_costs_the_others_no_second_wait(tmp_path):
    # Process 1 comes 9 s late to its first epoch end: process 0's logger waits 3 s for it, warns and gives up.
    # Process 1 would then find process 0's figures there, and wait in vain for it at its next epoch end (the
    # job stalled a second time for one late process): it must see that process 0 gave up, and give up too.
    # The waits are counted on the job's store, not timed (the margins only keep a loaded machine's skew
    # between the processes from deciding who is late).
    r0, r1 = run_job("scenarios_report.late_once", tmp_path, args={"timeout": 3.0, "late": 9.0})
    assert len(r0["loss"]) == len(r1["loss"]) == 3  # training went on
    assert r0["channel"] == ["timed out", "skipped", "skipped"], r0["channel"]  # one wait, in vain
    assert r1["channel"] == ["skipped", "skipped", "skipped"], r1["channel"]  # no wait at all, at no epoch end
    assert [len(k) > 0 for k in r0["job_keys"]] == [False, False, False]
    assert r1["job_keys"] == r0["job_keys"]  # the same keys in every History: none
    for r in (r0, r1):  # one warning each
        job = [w for w in r["warnings"] if "job-wide figures are left out" in w]
        assert len(job) == 1, r["warnings"]
    assert "process 1 gave no" in r0["warnings"][-1]
    assert "process 0 gave up" in [w for w in r1["warnings"] if "job-wide" in w][0]
