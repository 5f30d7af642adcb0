"""examples/two_processes.py: two processes on one machine train one model with every callback, one log_dir."""

import glob
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.distributed.launch import ROOT
from tests.helpers.gpu import HAS_GPU

pytest.importorskip("jax")


@pytest.mark.slow
def test_the_example_trains_one_model_in_two_processes_into_one_log_dir(tmp_path):
    log_dir = tmp_path / "logs"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(ROOT / "examples" / "two_processes.py"), "--log-dir", str(log_dir)]
    proc = subprocess.run(
        [*cmd, "--epochs", "1", "--steps", "8", "--batch-size", "16", "--timeout", "240"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout

    # One model: the same weights on both processes after data-parallel training.
    sums = dict(re.findall(r"\[process (\d)\] final loss [\d.]+; weights sum (-?[\d.]+)", out))
    assert set(sums) == {"0", "1"} and sums["0"] == sums["1"], out[-2000:]

    # Every callback's run is per process; no run has two writers (the writer's pid is in the file name).
    # Process 0 adds the job's figures where there are some: the input wait of every
    # process, and the GPUs' figures where NVML sees GPUs (the CPU-trained job still watches them).
    for run, job in (("gpu", ["job"] if HAS_GPU else []), ("input", ["job"]), ("oom", [])):
        assert sorted(os.listdir(log_dir / run)) == job + ["process_0", "process_1"], run
    writers = defaultdict(set)
    for f in glob.glob(str(log_dir / "**" / "events.out.tfevents.*"), recursive=True):
        writers[os.path.dirname(f)].add(os.path.basename(f).split(".")[4])
    assert writers and all(len(pids) == 1 for pids in writers.values()), writers

    from tensorboard.backend.event_processing import event_accumulator

    for i in range(2):
        acc = event_accumulator.EventAccumulator(str(log_dir / "input" / f"process_{i}"))
        acc.Reload()
        assert any(t.startswith("input/") for t in acc.Tags()["scalars"] + acc.Tags()["tensors"])
    if sys.version_info >= (3, 12):  # Keras disables JAX profiling below
        traces = glob.glob(str(log_dir / "profile" / "job" / "plugins" / "profile" / "*" / "*.xplane.pb"))
        assert len(traces) == 2 and "[process 0] ProfilerWindow: job of 2 processes" in out
