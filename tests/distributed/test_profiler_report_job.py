"""report() of the profiler windows of a real job of two JAX processes: the job's traces, step times, xprof."""

import glob
import os
import sys

import pytest

from keras_gpu_tools import cli
from keras_gpu_tools.reporting.report import report
from tests.distributed.launch import run_job

pytest.importorskip("jax")


def job_section(text: str) -> str:
    """The report's job section (up to the next section, the process's own profiler windows)."""
    return text.split("Job of 2 processes")[1].split("\nProfiler windows\n")[0]


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 12), reason="Keras disables JAX profiling on Python < 3.12")
def test_the_job_section_shows_every_process_trace_and_step_time_of_a_window(tmp_path, capsys):
    pytest.importorskip("xprof")
    pytest.importorskip("tensorboard")
    results = run_job("scenarios_report.profile_report", tmp_path, args={"start_step": 3, "num_steps": 4})
    logs = tmp_path / "job" / "logs"
    (session,) = glob.glob(str(logs / "profile" / "job" / "plugins" / "profile" / "*"))
    traces = sorted(glob.glob(os.path.join(session, "*.xplane.pb")))
    chief = results[0]["captures"][0]
    assert chief["job_files"] == traces and len(traces) == 2  # (what test_profiler_job checks in full)

    rep = report(str(logs))
    (p,) = rep.data.job_profiles
    assert rep.data.process_count == 2 and rep.data.processes == [0, 1]
    assert (p["steps"], p["processes"], p["files"], p["trace_dir"]) == ("4-7", 2, traces, session)
    assert p["mean_step_ms"] == pytest.approx(chief["job_mean_step_ms"]) and all(ms > 0 for ms in p["mean_step_ms"])
    slowest = max(range(2), key=lambda i: p["mean_step_ms"][i])
    assert p["slowest"] == slowest and f"slowest: process {slowest}" in chief["job_line"]
    assert p["conclusion"] == chief["job_conclusion"] and p["conclusion"]

    section = job_section(rep.text())
    assert f"steps 4-7: 2 trace files of 2 processes in {session}" in section
    for i, t in enumerate(traces):
        assert f"  trace: {os.path.basename(t)}" in section
        mark = " (slowest)" if i == slowest else ""
        assert f"  process {i}: mean step {chief['job_mean_step_ms'][i]:.2f} ms{mark}\n" in section + "\n"
    assert f"  xprof over every trace: {chief['job_conclusion']}" in section
    html = rep.html()
    assert f"<td>{slowest} (slowest)</td>" in html and f"<code>{session}</code>" in html

    # The command line prints the same section (its prose wrapped for a terminal).
    assert cli.main(["report", str(logs)]) == 0
    assert job_section(capsys.readouterr().out).split() == section.split()

    # From process 0's own callbacks: the same window (process 1 holds no job figures).
    mine = results[0]
    assert mine["report_process_count"] == 2 and len(mine["report_job_profiles"]) == 1
    assert (
        job_section(mine["report_text"]).split("Profiler windows of the job")[1]
        == section.split("Profiler windows of the job")[1]
    )
    assert results[1]["report_job_profiles"] == []
