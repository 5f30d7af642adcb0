"""OOMBatchSizeReducer in a real job of two JAX processes on the CPU (gloo): one process runs out of memory."""

import numpy as np
import pytest

from tests.distributed.launch import JOB_GPUS, run_job

pytest.importorskip("jax")


@pytest.mark.slow
def test_an_oom_on_one_process_is_retried_as_the_same_split_everywhere(tmp_path):
    # 40 samples per process in batches of 16 (the job's batch: 32 over 2 devices, 16 rows each),
    # then a last batch of 8 per process. Process 0 runs out of memory above 4 rows per device:
    # 16 and 8 rows fail in its rehearsals, 4 fit; process 1 fits everything itself.
    results = run_job("scenarios_oom.one_process_oom", tmp_path, processes=2, devices_per_process=1, timeout=180)
    first, second = results
    # The same split everywhere: the same events, in the same order. On GPUs (probe="auto") process 0
    # predicts its rehearsals from XLA's memory analysis and runs neither.
    own = "predicted" if JOB_GPUS else "jax"
    assert first["events"] == [[32, 1, 2, own], [32, 2, 4, own]], first["events"]
    assert second["events"] == [[32, 1, 2, "agreed"], [32, 2, 4, "agreed"]], second["events"]
    assert "out of memory on process 0 of 2" in " ".join(second["why"][0])
    for r in results:
        assert r["granule"] == 2 and r["oom_events"] == [2.0, 0.0]
        # Agreement once per new batch shape or split (32 as 1, 2, 4; the last batch of 16), never per step.
        assert r["agreements"] == 4
        assert r["micro_batches"] == 2  # the last batch of 16 (8 rows per device) as 2 x 8
        np.testing.assert_array_equal(r["seen"], np.full(80, 2.0))  # every sample of the job once per epoch
        assert r["iterations"] == r["ref_iterations"] == 2 * 3  # one update per original batch
        for w, ref in zip(r["weights"], r["ref_weights"]):
            np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r["loss"], r["ref_loss"], rtol=1e-5)
    # Identical weights on every process.
    for a, b in zip(first["weights"], second["weights"]):
        np.testing.assert_array_equal(a, b)
    assert first["run_dir"].endswith("oom/process_0") and second["run_dir"].endswith("oom/process_1")


@pytest.mark.slow
def test_one_process_over_two_devices_splits_each_device_share(tmp_path):
    # keras.distribution.DataParallel over 2 CPU devices of one process: batches of 16 are 8 rows
    # per device. Above 2 rows per device the step runs out of memory (a real XLA allocator error
    # in the step itself: one process, no peer to wait for), so 16 runs as 4 x 4 (2 rows per device).
    (r,) = run_job("scenarios_oom.one_process_data_parallel", tmp_path, processes=1, devices_per_process=2)
    assert r["devices"] == 2
    # On a GPU (probe="auto") every split that cannot fit is predicted from XLA's memory analysis, none runs.
    kind = "predicted" if JOB_GPUS else "jax"
    assert r["events"] == [[16, 1, 2, kind], [16, 2, 4, kind]], r["lines"]
    assert r["agreements"] == 0  # one process: nothing to agree on
    assert r["micro_batches"] == 2  # the last batch of 8 as 2 x 4 (2 rows per device)
    np.testing.assert_array_equal(r["seen"], np.full(40, 2.0))
    assert r["iterations"] == 2 * 3
    for w, ref in zip(r["weights"], r["ref_weights"]):
        np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["loss"], r["ref_loss"], rtol=1e-5)
    assert "the last batch of each epoch holds 7 samples (39 samples in batches of 16)" in r["uneven"]
    assert "2 data-parallel devices" in r["uneven"] and "such as 38" in r["uneven"]
    assert r["uneven_iterations"] == 0  # refused before the first step
    assert "Batch sizes tried: 8, 8 as 2 x 4, 8 as 4 x 2." in r["never"], r["never"]
    assert "one sample per device" in r["never"]


@pytest.mark.slow
def test_an_evaluation_oom_on_one_process_is_agreed_like_a_training_one(tmp_path):
    # Process 0 runs out of memory above 4 rows per device, in evaluation and prediction only:
    # the validation batches of 16 per process (32 over the job) fail on it as 1 and 2 micro-batches.
    results = run_job("scenarios_oom.evaluation_oom", tmp_path, processes=2, devices_per_process=1, timeout=180)
    first, second = results
    assert first["fit_events"] == [[32, 1, 2, "jax", "test"], [32, 2, 4, "jax", "test"]], first["fit_events"]
    assert second["fit_events"] == [[32, 1, 2, "agreed", "test"], [32, 2, 4, "agreed", "test"]]
    assert "out of memory on process 0 of 2" in " ".join(second["fit_why"][0])
    for r in results:
        # Training: 32 and the last batch of 16 once each; validation: 32 as 1, 2, 4 (then known).
        assert r["fit_agreements"] == 5
        np.testing.assert_allclose(r["val_loss"], r["ref_val_loss"], rtol=1e-5)
        np.testing.assert_allclose(r["loss"], r["ref_loss"], rtol=1e-5)
        for w, ref in zip(r["weights"], r["ref_weights"]):
            np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)
        # evaluate() outside fit: the same agreement, the unsplit result.
        assert [e[:3] for e in r["evaluate_events"]] == [[32, 1, 2], [32, 2, 4]]
        assert r["evaluate_agreements"] == 3
        np.testing.assert_allclose(r["evaluate"], r["ref_evaluate"], rtol=1e-5)
        # predict() over the job: the same split everywhere before Keras's own gathering error.
        assert [e[:3] for e in r["job_predict_events"]] == [[32, 1, 2], [32, 2, 4]]
        assert r["job_predict_agreements"] == 3
        assert "non-addressable" in r["job_predict_error"]
    # The same validation loss on both processes (a job-wide figure).
    assert first["val_loss"] == second["val_loss"]
    assert first["evaluate"] == second["evaluate"]
    # predict() on process 0 alone: split there (16 rows as 4 x 4), every sample once and in order, no agreement.
    if "local_events" not in first:  # a GPU job: see scenarios_oom.evaluation_oom
        return
    assert first["local_events"] == [[16, 1, 2, "jax", "predict"], [16, 2, 4, "jax", "predict"]]
    assert first["local_agreements"] == 0
    np.testing.assert_allclose(first["local_predict"], first["ref_local_predict"], rtol=1e-5, atol=1e-6)
    assert len(first["local_predict"]) == 32
