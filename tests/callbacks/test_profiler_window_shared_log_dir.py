"""Two independent trainings (two real processes, no keras.distribution) profiling into one log directory at once."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.profiling.layers import OUTSIDE
from keras_gpu_tools.reporting.from_logdir import gather_log_dir

pytestmark = [pytest.mark.multibackend, pytest.mark.slow]

BACKEND = keras.backend.backend()
ROOT = Path(__file__).resolve().parents[2]


def run_two(out: Path) -> list[dict]:
    """Both trainings at once (``tests/helpers/shared_log_dir.py``); their results, by index."""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "tests.helpers.shared_log_dir"]
    logs = [open(out / f"log_{i}.txt", "w") for i in range(2)]
    procs = [
        subprocess.Popen([*cmd, str(i), str(out)], env=env, stdout=logs[i], stderr=subprocess.STDOUT) for i in range(2)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    for f in logs:
        f.close()
    assert codes == [0, 0], "\n".join((out / f"log_{i}.txt").read_text()[-3000:] for i in range(2))
    return [json.loads((out / f"result_{i}.json").read_text()) for i in range(2)]


@pytest.mark.skipif(BACKEND == "jax" and sys.version_info < (3, 12), reason="Keras disables JAX profiling on < 3.12")
def test_two_trainings_into_one_log_dir_stay_apart(tmp_path):
    results = run_two(tmp_path)
    logs = tmp_path / "logs"
    first, second = sorted(results, key=lambda r: r["training"] != "")
    assert first["training"] == "" and schema.TRAINING_NAME_RE.match(second["training"]), results
    assert first["run_dir"] == str(logs / "profile")
    assert second["run_dir"] == str(logs / "profile" / second["training"])
    assert second["detector_run_dir"] == str(logs / "input" / second["training"])

    for i, r in enumerate(results):
        assert r["warnings"] == [], r["warnings"]  # 0 errors
        (cap,) = r["captures"]
        assert (cap["start"], cap["steps"], cap["reason"]) == (3, 3, "scheduled")
        assert len(cap["files"]) == 1 and cap["files"][0].startswith(os.path.join(r["run_dir"], "plugins", "profile"))
        # Its table holds its own model's layers only: the other's trace is not in it.
        assert not r["table_error"], r["table_error"]
        mine, theirs = f"dense_{'ab'[i]}", f"dense_{'ab'[1 - i]}"
        assert {p for p in r["layers"] if p != OUTSIDE} == {f"{mine}0", f"{mine}1"}, r["layers"]
        assert not any(p.startswith(theirs) for p in r["layers"])
        assert r["epochs"] == 2
    assert results[0]["captures"][0]["files"] != results[1]["captures"][0]["files"]
    sessions = glob.glob(str(logs / "profile" / "plugins" / "profile" / "*"))
    assert len(sessions) == 1 and sessions[0].endswith("_steps_4_6"), sessions  # the first training's own
    assert not glob.glob(str(logs / "**" / ".staging_*"), recursive=True)  # nothing left where they were written

    # The report covers one training at a time and lists both.
    name = second["training"]
    default, other = gather_log_dir(str(logs)), gather_log_dir(str(logs), layout=name)
    for data in (default, other):
        (note,) = [n for n in data.notes if "trainings that wrote it at the same time" in n]
        assert "holds 2 trainings" in note and f"layout={name!r}" in note or "report(log_dir)" in note, note
    assert {"input", "profile"} <= set(default.sources) and not any(name in s for s in default.sources)
    assert {f"input/{name}", f"profile/{name}"} <= set(other.sources)
    assert all(s.endswith(name) for s in other.sources), other.sources
    with pytest.raises(ValueError, match="layout"):
        gather_log_dir(str(logs), layout="elsewhere_pid1")
