"""plan_batch_size(objective="throughput") in a real job of two JAX processes on the CPU (gloo)."""

import os

import pytest

from keras_gpu_tools.reporting.report import report
from tests.distributed.launch import run_job

pytest.importorskip("jax")


@pytest.mark.slow
def test_every_process_plans_the_same_batch_from_the_slowest_process_figures(tmp_path):
    # DataParallel over the job's 2 devices (one per process): candidates of 2, 4 rows per device
    # (max_batch_size=8 global), each a collective fit of both processes.
    first, second = run_job("scenarios_planner.throughput_plan", tmp_path, processes=2, timeout=300)
    for r in (first, second):
        assert r["devices"] == 2 and r["batch_size"] == 2 * r["per_device"]
        assert [c["batch_size"] for c in r["candidates"]] == [4, 8]
        assert [c["per_device_batch_size"] for c in r["candidates"]] == [2, 4]
        assert all(c["stopped"] == "fixed" and c["uncertainty"] is not None for c in r["candidates"])
        assert all(c["measured"] for c in r["candidates"])
        assert r["unchanged"] and r["trained"]
        assert len(r["gathered"]) == 2  # both processes' rows
    # The same plan on every process: the same batch, the same rows, the same words.
    assert first["batch_size"] == second["batch_size"]
    assert first["candidates"] == second["candidates"] and first["why"] == second["why"]
    assert first["gathered"] == second["gathered"]
    # Each candidate's figures are the slowest process's: its samples/s, the longest compile.
    own = first["gathered"]
    for i, merged in enumerate(first["candidates"]):
        rows = [proc[i] for proc in own]
        assert merged["samples_per_sec"] == min(r["samples_per_sec"] for r in rows)
        assert merged["compile_seconds"] == max(r["compile_seconds"] for r in rows)
        assert merged["steps"] == rows[0]["steps"] == rows[1]["steps"]  # the same steps in every process
    # The same weights everywhere, and process 0 alone wrote the plan.
    assert first["weights"] == second["weights"]
    runs = sorted(d for d, _, files in os.walk(tmp_path / "job" / "logs") if any("tfevents" in f for f in files))
    assert [os.path.relpath(d, tmp_path / "job" / "logs") for d in runs] == ["plan"]
    shown = report(str(tmp_path / "job" / "logs")).data.plan  # the report reads it
    assert shown["chosen"] == first["batch_size"] and [c.as_dict() for c in shown["candidates"]] == first["candidates"]
