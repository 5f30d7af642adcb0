"""ProfilerWindow in a job of several processes: one session with one trace per process, read back with xprof."""

import glob
import os
import sys

import pytest

from keras_gpu_tools.profiling import trace as prof
from tests.distributed.launch import JOB_GPUS, run_job

pytest.importorskip("jax")


def read_texts(run_dir: str) -> dict[str, str]:
    """The text summaries of one TensorBoard run, read back with TensorBoard's reader (the last of each tag)."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}


def steps_in(path: str) -> list[int]:
    """The training steps xprof finds in one trace file (analyzed apart from the session's cache)."""
    rows = prof.analyze_input_pipeline([path], isolated=True).step_rows
    return sorted(int(str(r["step"]).split()[-1]) for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 12), reason="Keras disables JAX profiling on Python < 3.12")
def test_two_processes_trace_the_same_steps_into_one_session(tmp_path):
    pytest.importorskip("xprof")
    pytest.importorskip("tensorboard")
    results = run_job("scenarios_profiler.profile_window", tmp_path, args={"start_step": 3, "num_steps": 4})
    logs = tmp_path / "job" / "logs" / "profile"

    # One session of the job's run, one trace per process, nothing left in the processes' own runs.
    sessions = glob.glob(str(logs / "job" / "plugins" / "profile" / "*"))
    assert len(sessions) == 1 and sessions[0].endswith("_steps_4_7"), sessions
    traces = sorted(glob.glob(os.path.join(sessions[0], "*.xplane.pb")))
    assert [os.path.basename(t).rsplit("_p", 1)[1] for t in traces] == ["0.xplane.pb", "1.xplane.pb"]
    assert not glob.glob(str(logs / "process_*" / "plugins"))

    # xprof (TensorBoard's Profile tab) sees one host per process, each with exactly the window's steps.
    from xprof import profile_plugin

    hosts = profile_plugin._get_hosts(os.listdir(sessions[0]))
    assert {os.path.basename(t)[: -len(".xplane.pb")] for t in traces} <= hosts
    for t in traces:  # on a GPU xprof numbers the device's steps from 0: the window's 4 steps all the same
        assert steps_in(t) == ([0, 1, 2, 3] if JOB_GPUS else [3, 4, 5, 6])

    for i, r in enumerate(results):
        (cap,) = r["captures"]
        assert (cap["start"], cap["steps"], cap["reason"]) == (3, 4, "scheduled")
        assert cap["files"] == [traces[i]]  # each process's own trace, in the shared session
        assert cap["conclusion"]  # xprof's conclusion for this process
        texts = read_texts(str(logs / f"process_{i}"))
        assert sessions[0] in texts["profile/steps_4_7"] and texts["profile/steps_4_7/input_pipeline"]

    # Process 0 reports the job: every trace, every process's step time, xprof over all traces.
    chief, other = results[0]["captures"][0], results[1]["captures"][0]
    assert chief["job_files"] == traces and len(chief["job_mean_step_ms"]) == 2
    assert all(ms > 0 for ms in chief["job_mean_step_ms"])
    assert "job of 2 processes" in chief["job_line"] and "slowest: process" in chief["job_line"]
    assert chief["job_conclusion"]
    assert other["job_files"] == [] and other["job_conclusion"] is None
    job_texts = read_texts(str(logs / "job"))
    assert job_texts["profile/steps_4_7"] == chief["job_line"]
    assert job_texts["profile/steps_4_7/input_pipeline"] == chief["job_conclusion"]
    assert len(glob.glob(str(logs / "job" / "events.out.tfevents.*"))) == 1  # one writer: process 0


def test_a_process_of_a_launcher_without_a_channel_keeps_its_sessions_in_its_own_run(tmp_path, monkeypatch):
    """RANK/WORLD_SIZE say one of two processes, but no engine joins them: no session to share, no wait."""
    import keras
    import numpy as np

    from keras_gpu_tools import ProfilerWindow

    if keras.backend.backend() == "jax" and sys.version_info < (3, 12):
        pytest.skip("Keras disables JAX profiling on Python < 3.12")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    cb = ProfilerWindow(log_dir=tmp_path, start_step=2, num_steps=2, analyze=False, verbose=0)
    x = np.zeros((48, 8), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    (cap,) = cb.captures
    assert cap.num_steps == 2 and cap.files and cap.job_files == [] and cap.job_line() == ""
    assert os.path.dirname(os.path.dirname(cap.trace_dir)) == str(tmp_path / "profile" / "process_1" / "plugins")
    assert not (tmp_path / "profile" / "job").exists()


def test_traces_of_two_processes_on_one_host_do_not_overwrite_each_other(tmp_path):
    session = tmp_path / "profile" / "job" / "plugins" / "profile" / "2026_11_26_09_00_00_steps_4_7"
    moved = {}
    for i in range(2):
        run = tmp_path / "profile" / f"process_{i}"
        written = run / "plugins" / "profile" / "2026_11_26_09_00_01"
        written.mkdir(parents=True)
        (written / "my.host.xplane.pb").write_bytes(b"p%d" % i)
        (written / "my.host.trace.json.gz").write_bytes(b"t%d" % i)
        moved[i] = prof.move_to_job_session(str(run), set(), "*.xplane.pb", str(session), i)
        assert not (run / "plugins").exists()  # no empty run left for the Profile tab
    assert sorted(os.listdir(session)) == [
        "my.host_p0.trace.json.gz",
        "my.host_p0.xplane.pb",
        "my.host_p1.trace.json.gz",
        "my.host_p1.xplane.pb",
    ]
    assert moved == {i: [str(session / f"my.host_p{i}.xplane.pb")] for i in range(2)}
    assert (session / "my.host_p1.xplane.pb").read_bytes() == b"p1"


def test_one_process_analysis_leaves_no_cache_in_the_session(tmp_path):
    """xprof caches its result in the trace's folder as the whole session's: a process's own analysis must not."""
    pytest.importorskip("xprof")
    import keras
    import numpy as np

    from keras_gpu_tools import ProfilerWindow

    if keras.backend.backend() == "jax" and sys.version_info < (3, 12):
        pytest.skip("Keras disables JAX profiling on Python < 3.12")
    if keras.backend.backend() == "torch":
        pytest.skip("torch traces are not xplane files")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    cb = ProfilerWindow(log_dir=tmp_path, start_step=1, num_steps=2, analyze=False, verbose=0)
    x = np.zeros((32, 8), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    files = cb.captures[0].files
    before = sorted(os.listdir(os.path.dirname(files[0])))
    assert prof.analyze_input_pipeline(files, isolated=True).step_rows
    assert sorted(os.listdir(os.path.dirname(files[0]))) == before
    assert prof.analyze_input_pipeline(files).step_rows  # in place: the cache is written next to the trace
    assert len(os.listdir(os.path.dirname(files[0]))) > len(before)
