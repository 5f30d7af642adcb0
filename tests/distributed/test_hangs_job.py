"""A job never hangs on us: a dead process, and processes that run different callbacks (real JAX jobs, gloo)."""

import pytest

from tests.distributed.launch import JOB_GPUS, run_job

pytest.importorskip("jax")


@pytest.mark.slow
@pytest.mark.skipif(
    JOB_GPUS, reason="NCCL, unlike gloo, does not notice a dead peer: the next step waits as without us"
)
def test_a_dead_process_makes_the_survivors_fit_raise_within_seconds(tmp_path):
    # Without the package the survivor's next step raises (gloo: the peer closed the connection) 0.1 s after the
    # death. Our callbacks wait for every process at each epoch end, here for up to 600 s; the dead process must
    # end the wait at once, so that the same error reaches the user's except/finally.
    r0, r1 = run_job("scenarios_hangs.peer_dies", tmp_path, killed=(1,), timeout=200)
    assert r1 is None
    assert r0["raised"] is not None and r0["finally_ran"], r0
    assert "gloo" in r0["message"].lower() or "connection" in r0["message"].lower(), r0["message"]
    # The wait ended on the event, the dead process's silence (not its 600 s timeout; the store's own heartbeat
    # would abort process 0 after 100 s, which run_job reports as a failed exit): no clock is compared.
    assert r0["ended_at"] >= r0["died_at"], r0
    det, log = r0["warnings"]
    assert det.startswith("InputBoundDetector:") and "process 1 stopped answering" in det, det
    assert "gave no" not in det, det  # not a timeout
    # The logger did not wait on its own key: it learned of the detector's ended wait.
    assert log.startswith("GPUUtilizationLogger:") and "'input/fit1/epoch0'" in log and "'gpu/" not in log, log
    assert len(r0["warnings"]) == 2


@pytest.mark.slow
def test_a_reducer_missing_on_a_process_is_refused_on_every_process(tmp_path):
    r0, r1 = run_job("scenarios_hangs.reducer_on_one_process", tmp_path, timeout=200)
    for r in (r0, r1):
        assert r["raised"] == "ValueError", r
        assert "OOMBatchSizeReducer (run 'oom') runs on process(es) [0] but not on process(es) [1]" in r["message"]
        # Refused at fit start, before any step, on the roster every process sent (not after the agreement's
        # 600 s wait, which run_job's 200 s would report as a hang).
        assert r["steps_trained"] == 0
        assert "gave no" not in r["message"], r["message"]


@pytest.mark.slow
@pytest.mark.skipif(JOB_GPUS, reason="process 1 is left in NCCL's collective, which does not notice process 0's exit")
def test_a_reducer_with_a_process_that_runs_none_of_ours_is_refused_after_the_short_deadline(tmp_path):
    # Process 1 may be aborted by JAX once process 0, the coordination service's host, has left.
    r0, r1 = run_job("scenarios_hangs.reducer_on_one_process", tmp_path, timeout=200, args={"other": None}, killed=(1,))
    assert r0["raised"] == "ValueError" and r0["steps_trained"] == 0, r0
    assert "OOMBatchSizeReducer: every process of the job must run it" in r0["message"]
    assert "process 1 gave no" in r0["message"] and "runs none of keras_gpu_tools's callbacks" in r0["message"]
    # Process 1 (none of ours) was left in the first step's collective; process 0's exit ends it, as with Keras
    # alone: its fit() raises (gloo) or JAX aborts it, whichever comes first. It does not hang.
    assert r1 is None or (r1["raised"] is not None and r1["finally_ran"]), r1


@pytest.mark.slow
def test_an_epoch_end_waits_once_for_all_callbacks(tmp_path):
    r0, r1 = run_job("scenarios_hangs.one_wait_per_epoch_end", tmp_path, timeout=200)
    for r in (r0, r1):
        assert r["epochs"] == 3  # training went on
    det, log = r0["warnings"]["InputBoundDetector"], r0["warnings"]["GPUUtilizationLogger"]
    assert len(det) == 1 and "process 1 gave no 'input/fit1/epoch0'" in det[0], det
    # The logger did not wait on its own key: it learned of the detector's failed wait.
    assert len(log) == 1 and "'input/fit1/epoch0'" in log[0] and "'gpu/" not in log[0], log
