"""`keras-gpu-tools doctor` inside a real job of two JAX processes (CPU, gloo): it shows the job."""

import pytest

from tests.distributed.launch import run_job

pytest.importorskip("jax")


@pytest.mark.slow
def test_doctor_shows_each_process_its_place_in_the_job(tmp_path):
    results = run_job("scenarios_profiler.doctor", tmp_path, processes=2, devices_per_process=2)
    for i, r in enumerate(results):
        report = r["report"]
        section = report.split("[distribution]")[1].split("Findings")[0]
        assert "keras.distribution DataParallel, mesh {'batch': 4}" in section
        assert f"process {i} of 2 (jax.distributed); 4 device(s) per training step" in section
        assert "key-value store): yes" in section
        flat = " ".join(report.split())  # findings are wrapped
        assert "each process trains a model of its own" not in flat
        assert "no keras.distribution is set" not in flat
        assert "JAX sees 2 devices and no keras.distribution is set: fit() runs on one" in " ".join(r["before"].split())
