"""GPUUtilizationLogger in a real job of two JAX processes on the CPU (gloo), NVML faked, one shared log_dir.

Each process sees its own fake GPU(s) through CUDA_VISIBLE_DEVICES; the logs are
read back with TensorBoard's own reader, and the report is built from them.
"""

import json
import os

import pytest

from keras_gpu_tools.reporting.report import report
from tests.distributed.launch import run_job
from tests.distributed.scenarios_logger import fake_gpu_figures

pytest.importorskip("jax")

METRICS = ("utilization_percent", "sm_activity_percent", "memory_used_mib")


def read_run(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc, {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tf_text(event) -> str:
    """A text event's string (what EventWriter.text and .json write)."""
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(event.tensor_proto).item().decode()


def writer_pids(run_dir):
    """The process ids that wrote the run's event files (their names end in .<host>.<pid>.<n>)."""
    names = [f for f in os.listdir(run_dir) if ".tfevents." in f]
    assert names, f"no event file in {run_dir}"
    return {int(f.split(".")[-2]) for f in names}


@pytest.mark.slow
@pytest.mark.parametrize("devices_per_process, others", [(1, True), (2, False)])
def test_two_processes_log_apart_and_share_job_figures(tmp_path, devices_per_process, others):
    """With ``others``, an InputBoundDetector and an OOMBatchSizeReducer share the log_dir (for the report)."""
    k = devices_per_process
    results = run_job(
        "scenarios_logger.logger_fit",
        tmp_path,
        devices_per_process=k,
        args={"devices_per_process": k, "others": others},
    )
    logs = tmp_path / "job" / "logs" / "gpu"
    assert sorted(os.listdir(logs)) == ["job", "process_0", "process_1"]

    # One writer per run: each process its own, the job run process 0 only.
    for i, r in enumerate(results):
        assert r["run_dir"] == str(logs / f"process_{i}")
        assert writer_pids(logs / f"process_{i}") == {r["pid"]}
        assert not r["warnings"], r["warnings"]
    assert results[0]["job_run_dir"] == str(logs / "job") and results[1]["job_run_dir"] is None
    assert writer_pids(logs / "job") == {results[0]["pid"]}

    # Each process's GPUs by their job-wide labels: no tag of one process is one of the other's.
    labels = [r["labels"] for r in results]
    assert len(set(labels[0] + labels[1])) == 2 * k
    tags = []
    for i, r in enumerate(results):
        acc, scalars = read_run(logs / f"process_{i}")
        gpu_tags = {t for t in scalars if t.startswith("gpu/")}
        assert {t.split("/")[1] for t in gpu_tags} == set(labels[i])
        assert "gpu/devices/data" in acc.Tags()["tensors"]
        tags.append(gpu_tags)
        # Its own GPUs' figures, machine GPU p * K + j seen as its GPU:j.
        for j, label in enumerate(labels[i]):
            want = fake_gpu_figures(i * k + j)
            for m in METRICS:
                assert {v for _, v in scalars[f"gpu/{label}/{m}"]} == {want[m]}
                assert r["history"][f"gpu/{label}/{m}"] == [want[m]] * 2
        assert [(d["index"], d["label"], d["process_index"], d["process_count"]) for d in r["records"]] == [
            (j, labels[i][j], i, 2) for j in range(k)
        ]
        assert not any(key.startswith("gpu/") and key.split("/")[1] not in labels[i] for key in r["history"])
    assert not tags[0] & tags[1]

    # The job figures: min / mean / max over every GPU of the job, the same in both Histories.
    everyone = [fake_gpu_figures(g) for g in range(2 * k)]
    expected = {}
    for m in METRICS:
        values = [f[m] for f in everyone]
        expected.update(
            {
                f"job/gpu/{m}_min": min(values),
                f"job/gpu/{m}_mean": sum(values) / len(values),
                f"job/gpu/{m}_max": max(values),
            }
        )
    for r in results:
        job = {key: v for key, v in r["history"].items() if key.startswith("job/gpu/")}  # (the detector's: job/...)
        assert job == {key: [v] * 2 for key, v in expected.items()}
    _, job_scalars = read_run(logs / "job")
    steps = results[0]["global_step"]
    assert set(job_scalars) == set(expected)
    for key, v in expected.items():
        assert job_scalars[key] == [(steps // 2, pytest.approx(v)), (steps, pytest.approx(v))]

    # The report of the shared log_dir: every GPU of the job once, process 0's host, the job table.
    rep = report(str(tmp_path / "job" / "logs"))
    d = rep.data
    assert sorted(g["index"] for g in d.gpus) == sorted(labels[0] + labels[1])
    _, p0 = read_run(logs / "process_0")
    assert d.series["host/rss_mib"].values == [v for _, v in p0["host/rss_mib"]]  # not process 1's as well
    for label in labels[1]:
        assert len(d.series[f"gpu/{label}/utilization_percent"].values) == len(
            read_run(logs / "process_1")[1][f"gpu/{label}/utilization_percent"]
        )
    assert d.processes == [0, 1]
    text = rep.text()
    assert "Job of 2 processes" in text
    util = next(line for line in text.splitlines() if line.startswith("gpu/utilization_percent"))
    assert util.split()[1:4] == [f"{expected[f'job/gpu/utilization_percent_{s}']:.1f}" for s in ("min", "mean", "max")]
    assert "Job of 2 processes" in rep.html()
    if others:  # the other callbacks' sections: process 0's runs alone, nothing summed or interleaved
        acc, _ = read_run(logs.parent / "input" / "process_0")  # process 0's epochs: its verdict records' figures
        records = [json.loads(tf_text(e)) for e in acc.Tensors("input/verdict/data")]
        waits = [r["figures"].get("input/wait_ms") for r in records if r["scope"].startswith("epoch ")]
        assert d.split_axis == "epoch" and d.split_x == [float(i + 1) for i in range(len(waits))]
        assert d.split["input/wait_ms"] == [None if w is None else pytest.approx(w) for w in waits]
        _, oom = read_run(logs.parent / "oom" / "process_0")
        assert {t: s.values for t, s in d.oom_series.items()} == {t: [v for _, v in p] for t, p in oom.items()}
        assert d.verdict is not None and "oom/process_1" in d.sources and "input/process_1" in d.sources
    for r in results:  # the report of each process's callback: its own GPUs, the same job table
        assert "Job of 2 processes" in r["report"] and util in r["report"].splitlines()


@pytest.mark.slow
def test_a_logger_missing_on_the_other_process_costs_no_wait_and_one_warning(tmp_path):
    # Each process's logger has a run name the other lacks: the processes see it when they compare their
    # callbacks at fit start, so no epoch end waits (the first would wait job_timeout_s = 30 s otherwise).
    results = run_job("scenarios_logger.logger_unanswered", tmp_path)
    for i, r in enumerate(results):
        assert len(r["history"]["loss"]) == 3  # training went on
        assert not any(key.startswith("job/") for key in r["history"])
        assert any(key.endswith("/utilization_percent") for key in r["history"])  # its own figures stay
        job_warnings = [w for w in r["warnings"] if "job-wide figures are left out" in w]
        assert len(job_warnings) == 1 and f"does not run on process(es) [{1 - i}]" in job_warnings[0], r["warnings"]
        # No epoch end waited its 30 s out (that wait would end in a "gave no ..." warning): no clock is compared.
        assert len(r["epoch_seconds"]) == 3 and not any("gave no" in w for w in r["warnings"]), r["warnings"]
