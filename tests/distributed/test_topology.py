"""Who am I, in a real job of two JAX processes on the CPU (gloo), and the job's channel."""

import pytest

from keras_gpu_tools.runtime import topology as topo
from keras_gpu_tools.runtime.kv_exchange import KVExchange
from tests.distributed.launch import run_job

pytest.importorskip("jax")


@pytest.mark.slow
def test_two_processes_know_their_place_and_share_a_channel(tmp_path):
    results = run_job("scenarios.topology", tmp_path, processes=2, devices_per_process=2)
    for i, r in enumerate(results):
        assert r["process_index"] == i and r["process_count"] == 2 and r["source"] == "jax.distributed"
        assert r["devices_in_step"] == 4  # the mesh: 2 processes x 2 devices
        assert "DataParallel" in r["engine"]
        assert r["gathered"] == [{"index": 0}, {"index": 1}]
        assert r["epochs"] == [[0, 1], [10, 11], [20, 21]]
        # What is left in the store: the barrier's values (and, at most, a slower process's last epoch).
        assert {k for k in r["left"] if "epoch0" in k or "epoch1" in k} == set(), r["left"]
        assert r["run_dir"].endswith(f"gpu/process_{i}")
    ids = results[0]["device_ids"] + results[1]["device_ids"]
    assert len(set(ids)) == 4  # job-wide ids: no two devices share one
    assert results[0]["labels"] != results[1]["labels"]


@pytest.mark.slow
def test_processes_that_train_their_own_models_keep_apart_and_never_wait_for_each_other(tmp_path):
    results = run_job("scenarios.independent", tmp_path, processes=2)
    for i, r in enumerate(results):
        assert (r["process_index"], r["process_count"]) == (i, 2)
        assert not r["exchange"] and "each of the 2 processes trains its own model" in r["engine"]
        assert r["run_dir"].endswith(f"input/process_{i}")  # logs still kept apart
        assert r["job_keys"] == []  # nothing gathered: no epoch end waits for another process


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        ({"RANK": "1", "WORLD_SIZE": "4"}, (1, 4, "RANK/WORLD_SIZE")),
        ({"RANK": "0", "WORLD_SIZE": "1"}, None),  # one process: nothing to keep apart
        ({"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "3"}, (2, 3, "SLURM_PROCID/SLURM_STEP_NUM_TASKS")),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),  # an sbatch script: one python, a 4-task allocation
        (
            {"RANK": "x", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
            (1, 2, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"),
        ),
        ({"RANK": "5", "WORLD_SIZE": "2"}, None),  # inconsistent: ignored
    ],
)
def test_launcher_variables(env, expected):
    assert topo.from_launcher(env) == expected
    t = topo.single(env=env)
    if expected:
        assert (t.process_index, t.process_count) == expected[:2] and t.exchange is None
        assert t.run_dir("logs", "gpu").endswith(f"process_{expected[0]}")
        assert t.device_label(0) == f"{t.host}:0"
    else:
        assert not t.multi_process and t.run_dir("logs", "gpu") == "logs/gpu" and t.device_label(3) == "3"


def test_job_gather_of_one_process_is_none_and_a_failing_channel_warns_once():
    assert topo.JobGather(topo.Topology(), "x", print).gather("a", 1) is None

    class Silent:
        def key_value_set(self, key, value):
            pass

        def blocking_key_value_get(self, key, timeout_ms):
            raise TimeoutError("deadline exceeded")

    warned = []
    t = topo.Topology(process_index=0, process_count=2, exchange=KVExchange(Silent(), 0, 2))
    g = topo.JobGather(t, "det/fit1", warned.append, timeout_s=0.01)
    assert g.gather("epoch0", {"a": 1}) is None and g.gather("epoch1", {"a": 1}) is None
    assert len(warned) == 1 and "process 1 gave no 'det/fit1/epoch0'" in warned[0]
