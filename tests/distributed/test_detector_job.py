"""InputBoundDetector in real jobs of two JAX processes on the CPU (gloo): job figures, stragglers, MFU."""

import json
import os

import pytest

from keras_gpu_tools.input.stragglers import job_verdict, process_row
from keras_gpu_tools.logdir import schema
from tests.distributed.launch import JOB_GPUS, run_job

pytest.importorskip("jax")

JOB_KEYS = (
    "job/step_ms_max",
    "job/step_ms_slowest_process",
    "job/input_wait_fraction_max",
    "job/input_wait_process",
    "job/samples_per_sec",
)


def read_events(run_dir):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def job_history(result):
    return {k: v for k, v in result["history"].items() if k.startswith("job/")}


@pytest.mark.slow
def test_a_process_with_a_slow_input_is_named_by_every_process(tmp_path):
    # Process 1 takes 20 ms to load each batch, process 0 nothing; both run 2 devices' worth of peaks apart.
    # The time is a fake clock in each process (scenarios_detector.fixed_clock): 5 ms of compute a step, and
    # process 0 waits the 20 ms for process 1 in the all-reduce, so the figures and the verdict are exact.
    results = run_job(
        "scenarios_detector.fit_job",
        tmp_path,
        processes=2,
        args={"delays": [0.0, 0.02], "peaks": [1e12, 3e12]},
    )
    r0, r1 = results
    for r in results:
        assert r["warnings"] == []
        assert r["job_stragglers"] == [1]  # both name process 1
        assert "Process 1 holds the job back" in r["job_message"] and "all-reduce" in r["job_message"]
        # Advice for process 1's own pipeline (a generator), known on every process.
        assert r["job_advice"][0].startswith("Process 1: A Python generator runs in the training loop")
        assert "| 1 (straggler) |" in r["summary"] and "The job (2 processes" in r["summary"]
        h = r["history"]
        assert set(JOB_KEYS) <= set(h) and h["job/input_wait_process"] == [1.0, 1.0, 1.0]
        # MFU against the job's summed peak: one device at 1e12 and one at 3e12 (gathered at the first epoch end).
        for flops, mfu in zip(h["throughput/flops_per_sec"], h["throughput/mfu"]):
            assert mfu == pytest.approx(flops / 4e12)
    assert r0["job_message"] == r1["job_message"] and r0["job_text"] == r1["job_text"]  # they agree
    assert job_history(r0) == job_history(r1)  # the same job keys in both Histories
    h0, h1 = r0["history"], r1["history"]
    # Process 1 waits 20 of its 25 ms; process 0 not at all (its 20 ms are in the collective): the same step.
    assert h1["input/wait_fraction"][-1] == pytest.approx(0.8) and h0["input/wait_fraction"][-1] == 0.0
    assert h0["input/step_ms"][-1] == pytest.approx(25.0) and h1["input/step_ms"][-1] == pytest.approx(25.0)
    for e in range(3):  # each process's own figures, as today; the job's from them
        assert h0["job/input_wait_fraction_max"][e] == max(h0["input/wait_fraction"][e], h1["input/wait_fraction"][e])
        assert h0["job/step_ms_max"][e] == max(h0["input/step_ms"][e], h1["input/step_ms"][e])
        total = h0["throughput/samples_per_sec"][e] + h1["throughput/samples_per_sec"][e]
        assert h0["job/samples_per_sec"][e] == pytest.approx(total)
    # The job run: written by process 0 alone, the same keys at the same epoch ends.
    logs = tmp_path / "job" / "logs" / "input"
    assert r0["job_run_dir"] == str(logs / "job") and r1["job_run_dir"] is None
    assert r0["run_dir"].endswith("input/process_0") and r1["run_dir"].endswith("input/process_1")
    files = os.listdir(logs / "job")
    assert files and all(f.split(".")[-2] == str(r0["pid"]) for f in files)  # events.out.tfevents.<t>.<host>.<pid>.<n>
    acc = read_events(logs / "job")
    for key in JOB_KEYS:
        points = acc.Scalars(key)
        assert [p.step for p in points] == [30, 60, 90]
        assert [p.value for p in points] == pytest.approx(h0[key], rel=1e-6)
    text = acc.Tensors("input/job_verdict")[-1].tensor_proto.string_val[0].decode()
    assert "Process 1 holds the job back" in text
    # The JSON verdict for report() has a "job" part, in each process's own run.
    for i in range(2):
        own = read_events(logs / f"process_{i}")
        assert not [t for t in own.Tags()["scalars"] if t.startswith("job/")]
        record = json.loads(own.Tensors("input/verdict/data")[-1].tensor_proto.string_val[0])
        assert record["scope"] == "fit" and [s["process"] for s in record["job"]["stragglers"]] == [1]
        assert [p["process"] for p in record["job"]["processes"]] == [0, 1]


@pytest.mark.slow
def test_a_balanced_job_names_no_straggler_and_counts_the_flops_of_the_global_step(tmp_path):
    # 2 processes x 2 devices, 16 samples per process: a global batch of 32 over 4 devices. Alike on a fake
    # clock (no wait, 5 ms a step): whether noise-level differences name anyone is test_job_verdict_* below.
    results = run_job("scenarios_detector.fit_job", tmp_path, processes=2, devices_per_process=2, args={"epochs": 2})
    for r in results:
        assert r["job_stragglers"] == [] and r["job_message"].startswith("No process stands out")
        assert r["job_message"] == results[0]["job_message"]  # every process computes the same verdict
        assert r["history"]["input/wait_fraction"][-1] == 0.0
        assert r["history"]["input/step_ms"][-1] == pytest.approx(5.0)
        assert r["devices_in_step"] == 4
        h = r["history"]
        for flops, per_device, mfu in zip(
            h["throughput/flops_per_sec"], h["throughput/flops_per_sec_per_device"], h["throughput/mfu"]
        ):
            assert per_device == pytest.approx(flops / 4) and mfu == pytest.approx(flops / 4e12)
    assert job_history(results[0]) == job_history(results[1])
    # No all-reduce is timed outside the step across processes (a process without the callback would hang):
    # the collectives are left out, with the reason.
    for r in results:
        assert "step/collective_ms" not in r["history_keys"] and "step/step_ms" in r["history_keys"]
        assert r["collective_reason"].startswith("the step's devices are in several processes")
    # XLA counts the global step (the traced arguments are the job's global arrays): the same FLOPs as one
    # process with the same global batch, so FLOP/s is the job's and the per-device figure divides by 4.
    (one,) = run_job(
        "scenarios_detector.fit_job", tmp_path / "one", processes=1, args={"epochs": 1, "steps": 5, "batch": 32}
    )
    assert one["devices_in_step"] == 1 and one["flops_source"] == results[0]["flops_source"]
    if not JOB_GPUS:  # a GPU job's step does not lower for the CPU: the jaxpr's count
        assert one["flops_source"] == "XLA cost analysis"
    assert results[0]["flops_per_step"] == results[1]["flops_per_step"] == one["flops_per_step"] > 0
    assert "job/step_ms_max" not in one["history"]  # one process: no job keys


@pytest.mark.slow
def test_a_power_throttled_gpu_is_named_as_the_cause(tmp_path):
    # Process 1's GPU (a fake health source, as its GPUUtilizationLogger would publish) is power-throttled
    # 41% of each epoch at a lower clock; the steps of the two processes are alike (they train in step).
    ok = {"throttle_power_percent": 0.0, "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0}
    hot = {"throttle_power_percent": 41.0, "sm_clock_mhz": 1700.0, "sm_clock_max_mhz": 1980.0}
    results = run_job("scenarios_detector.fit_job", tmp_path, args={"epochs": 2, "steps": 10, "health": [ok, hot]})
    r0, r1 = results
    assert r0["job_message"] == r1["job_message"] and r0["job_stragglers"] == r1["job_stragglers"]
    assert r0["job_stragglers"] == [1]  # its steps and input wait are alike (a fake clock): its GPU alone
    assert (
        "process 1's GPU 1 was power-throttled 41% of the epoch (the other processes' 0%); process 1's GPU 1 ran "
        "its SM clock at 1700 MHz, 86% of its 1980 MHz maximum"
    ) in r0["job_message"]
    assert any("nvidia-smi -q -d POWER" in a for a in r0["job_advice"])
    # In process 0's JSON record for report(): the straggler with its causes.
    own = read_events(tmp_path / "job" / "logs" / "input" / "process_0")
    record = json.loads(own.Tensors("input/verdict/data")[-1].tensor_proto.string_val[0])
    (s,) = [s for s in record["job"]["stragglers"] if s["process"] == 1]
    assert [c["field"] for c in s["causes"]] == ["throttle_power_percent", "sm_clock_mhz"]
    assert s["kind"] == "GPU health"  # its steps, in step with the others', look alike
    assert r0["job_message"].startswith("Process 1's GPU holds the job back: ")
    # The report of the job's log directory shows it in the job's section.
    from keras_gpu_tools import report

    page = report(str(tmp_path / "job" / "logs")).text()
    assert "(straggler: " in page and "process 1's GPU 1 was power-throttled 41% of the epoch" in page


def _row(process, wait_fraction, step_ms, category="not input-bound"):
    """A process's message of an epoch end, from the epoch logs its detector would have."""
    logs = {
        schema.INPUT_STEPS: 60,
        schema.INPUT_STEP_MS: step_ms,
        schema.INPUT_WAIT_FRACTION: wait_fraction,
        schema.INPUT_WAIT_MS: wait_fraction * step_ms,
        schema.INPUT_COMPUTE_MS: step_ms * (1 - wait_fraction),
        schema.SAMPLES_PER_SEC: 16e3 / step_ms,
    }
    row = process_row(process, f"host{process}", logs, logs, scope="epochs 2-3", category=category)
    assert None not in row["steady"].values()  # every figure known
    return row


def test_job_verdict_names_no_one_for_equal_or_noise_level_rows():
    # The naming decision of the jobs above, on fixed figures: what each process computes from the same rows.
    equal = job_verdict([_row(0, 0.02, 5.0), _row(1, 0.02, 5.0)])
    assert equal.straggler_processes == [] and equal.message.startswith("No process stands out")
    # A busy host's noise: a few points of wait, a fraction of a millisecond (and up to 1.25x) per step.
    for rows in (
        [_row(0, 0.02, 5.0), _row(1, 0.09, 5.4)],  # 7 points more wait (under 10), 0.4 ms more step
        [_row(0, 0.0, 2.0), _row(1, 0.0, 2.9)],  # 1.45x the step but under 1 ms more
        [_row(0, 0.0, 20.0), _row(1, 0.0, 24.9)],  # 4.9 ms more but under 1.25x
        [_row(0, 0.30, 25.0), _row(1, 0.42, 25.0)],  # 12 points more wait, but under 2x the others'
    ):
        v = job_verdict(rows)
        assert v.straggler_processes == [] and v.message.startswith("No process stands out"), rows
        assert job_verdict(list(reversed(rows))).message == v.message  # the same whatever the order received


def test_job_verdict_names_a_process_whose_wait_stands_out():
    # The figures the job above gets on its fake clock: process 1 waits 20 of 25 ms, process 0 none.
    v = job_verdict([_row(0, 0.0, 25.0), _row(1, 0.8, 25.0, "highly input-bound")])
    assert [(s.process, s.kind) for s in v.stragglers] == [(1, "input wait")]
    assert v.message.startswith("Process 1 holds the job back: it waits for input 80.0% of its step time")
    assert "| 1 (straggler) |" in v.text() and "| 0 |" in v.text()
    # Just over both margins (10 points and 2x the others' median): named; the step rule names a slow step.
    assert job_verdict([_row(0, 0.10, 5.0), _row(1, 0.20, 5.0)]).straggler_processes == [1]
    slow = job_verdict([_row(0, 0.0, 4.0), _row(1, 0.0, 5.1)])
    assert [(s.process, s.kind) for s in slow.stragglers] == [(1, "step time")]
