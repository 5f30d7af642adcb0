"""The keras-gpu-tools command: doctor's reasoning, report and demo's checks (the README's demo runs in test_readme.py)."""

import os
import subprocess
import sys

import pytest

from keras_gpu_tools.cli import doctor
from keras_gpu_tools.telemetry.nvml import NVML
from tests.helpers.fake_nvml import FakeGPU, FakeNVML

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "keras_gpu_tools", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def facts_with(gpus, env, fw_gpus=(), built_with_cuda=None, backend="tensorflow"):
    nv = doctor.nvml_facts(NVML(FakeNVML(gpus)), env=env)
    fw = doctor.FrameworkFacts(backend, gpus=list(fw_gpus), built_with_cuda=built_with_cuda)
    return fw, nv, doctor.diagnose(fw, nv, env)


def texts(findings, level):
    return [f.text for f in findings if f.level == level]


@pytest.mark.slow
def test_doctor_runs_on_this_machine_and_exits_1_exactly_where_a_finding_fails():
    proc = run_cli("doctor")
    out = proc.stdout
    assert proc.returncode == (1 if "[FAIL]" in out else 0), proc.stderr[-2000:]
    assert "Keras 3." in out and "backend:" in out and "[NVML]" in out and "Findings" in out
    assert "[distribution]" in out


def test_gpu_present_but_cpu_only_framework_build():
    gpus = [FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b")]
    fw, nv, findings = facts_with(gpus, env={}, built_with_cuda=False)
    problems = texts(findings, "problem")
    assert len(problems) == 1
    assert "NVML sees 2 GPU(s) but tensorflow sees none" in problems[0]
    assert "no CUDA support" in problems[0] and "tensorflow[and-cuda]" in problems[0]


def test_cuda_visible_devices_hides_everything():
    fw, nv, findings = facts_with([FakeGPU()], env={"CUDA_VISIBLE_DEVICES": ""})
    assert any("hides every GPU" in t for t in texts(findings, "problem"))


def test_all_good_and_mixed_precision_advice():
    gpus = [FakeGPU(name="NVIDIA H100 80GB HBM3", uuid="GPU-a", compute_capability=(9, 0))]
    fw, nv, findings = facts_with(gpus, env={}, fw_gpus=["/physical_device:GPU:0"], built_with_cuda=True)
    assert not texts(findings, "problem")
    assert any("uses 1 GPU(s)" in t for t in texts(findings, "ok"))
    assert any("bfloat16" in t and "9.0" in t for t in texts(findings, "info"))
    report = doctor.render(fw, nv, findings, {})
    assert "NVIDIA H100 80GB HBM3" in report and "GPU-a" in report and "80.0 GiB" in report


@pytest.mark.parametrize(
    "cc, expected",
    [((9, 0), "float16 and bfloat16"), ((7, 5), "float16 only"), ((6, 1), "no tensor cores"), (None, "unknown")],
)
def test_mixed_precision_advice_by_compute_capability(cc, expected):
    assert expected in doctor.mixed_precision_advice(cc)


def test_mixed_models_with_numeric_visible_devices_warn_about_order():
    gpus = [FakeGPU(name="NVIDIA A100", uuid="GPU-a"), FakeGPU(name="NVIDIA T4", uuid="GPU-b")]
    _, _, findings = facts_with(gpus, env={"CUDA_VISIBLE_DEVICES": "1,0"}, fw_gpus=["a", "b"])
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in t for t in texts(findings, "warn"))


def test_no_driver_no_gpu():
    nv = doctor.NVMLFacts(False, reason="NVML Shared Library Not Found")
    findings = doctor.diagnose(doctor.FrameworkFacts("jax"), nv, {})
    assert "No NVIDIA GPU is usable" in texts(findings, "problem")[0]
    assert doctor.exit_code(findings) == 1


def test_doctor_exits_0_without_a_failed_finding_and_1_with_one(capsys, monkeypatch):
    from keras_gpu_tools.cli import app

    assert doctor.exit_code([doctor.Finding("ok", "a"), doctor.Finding("warn", "b"), doctor.Finding("info", "c")]) == 0
    assert doctor.exit_code([doctor.Finding("ok", "a"), doctor.Finding("problem", "b")]) == 1
    for level, code in (("warn", 0), ("problem", 1)):
        monkeypatch.setattr(doctor, "examine", lambda level=level: ("the report", [doctor.Finding(level, "x")]))
        assert app.main(["doctor"]) == code
        assert capsys.readouterr().out == "the report\n"  # printed either way


def test_the_doctors_help_gives_its_exit_codes(capsys):
    from keras_gpu_tools.cli import app

    with pytest.raises(SystemExit):
        app.main(["doctor", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 no finding is a problem" in text and "1 a finding is a problem, printed [FAIL]" in text


# The demo end to end, then `report` rebuilding its report: tests/test_readme.py runs the quick start's
# demo command as written and checks both.


def test_report_of_a_directory_without_logs_fails_clearly(tmp_path, capsys):
    from keras_gpu_tools import cli

    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no TensorBoard event file" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_rejects_bad_arguments(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("demo", "--logdir", str(blocker))
    assert proc.returncode == 2 and "--logdir" in proc.stderr
    proc = run_cli("demo", "--epochs", "0")
    assert proc.returncode == 2 and "positive integer" in proc.stderr


def test_doctor_reports_a_policy_without_tensor_cores():
    import keras

    nv = doctor.nvml_facts(
        NVML(FakeNVML([FakeGPU(name="Tesla P100", uuid="GPU-p", compute_capability=(6, 0))])), env={}
    )
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        findings = doctor.policy_findings(nv)
    finally:
        keras.config.set_dtype_policy(previous)
    assert any("6.0" in f.text and f.level == "warn" for f in findings), [f.text for f in findings]
    assert doctor.policy_findings(nv) == []  # float32: nothing to say


def test_report_warns_about_unreadable_event_files(tmp_path, capsys):
    from keras_gpu_tools import cli
    from keras_gpu_tools.logdir.writer import EventWriter

    good = EventWriter(str(tmp_path / "gpu"))
    good.scalars({"host/cpu_percent": 50.0}, step=1, wall_time=10.0)
    good.close()
    garbage = tmp_path / "input" / "events.out.tfevents.1700000000.host.1.v2"
    garbage.parent.mkdir()
    garbage.write_bytes(b"not an event file" * 30)
    # Some files read: the report is written, with a warning naming the others.
    assert cli.main(["report", str(tmp_path), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and f"input/{garbage.name}" in err
    assert (tmp_path / "report.html").exists()
    # Nothing read: an error, and the HTML report of a previous run is left alone.
    (tmp_path / "report.html").write_text("earlier report")
    (tmp_path / "gpu").rename(tmp_path / "gone")
    for f in (tmp_path / "gone").iterdir():
        f.write_bytes(b"\xff" * 40)
    assert cli.main(["report", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "could be read" in err and garbage.name in err
    assert (tmp_path / "report.html").read_text() == "earlier report"


# -- the distribution -------------------------------------------------------------------------
def test_doctor_shows_one_process_and_the_keras_3_limits_of_tensorflow():
    d = doctor.distribution_facts("tensorflow", gpus=0, env={})
    assert (d.process_index, d.process_count, d.engine, d.error) == (0, 1, "one device", None)
    # One CPU, no GPU, no cluster: the multi-worker limit does not apply, so it is not said.
    assert doctor.distribution_findings(d) == []
    report = doctor.render(doctor.FrameworkFacts("tensorflow"), doctor.NVMLFacts(False, "none"), [], {}, d)
    assert "[distribution]\n  engine: one device\n  one process; 1 device(s) per training step" in report
    assert "MultiWorkerMirroredStrategy" not in report
    assert doctor.distribution_findings(doctor.distribution_facts("tensorflow", gpus=1, env={})) == []
    # Several GPUs, or a launcher's several processes: the limit is said, as information.
    for gpus, env in ((2, {}), (1, {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"})):
        d = doctor.distribution_facts("tensorflow", gpus=gpus, env=env)
        notes = [f for f in doctor.distribution_findings(d) if "MultiWorkerMirroredStrategy" in f.text]
        (note,) = notes
        assert note.level == "info" and "MultiWorkerMirroredStrategy does not train with Keras 3" in note.text
        assert "keras-team/keras#20585" in note.text and "keras.distribution.initialize()" in note.text


def test_doctor_warns_where_tf_config_asks_for_several_workers():
    d = doctor.distribution_facts("tensorflow", gpus=0, env={"TF_CONFIG": '{"cluster": {}}'})
    (note,) = doctor.distribution_findings(d)
    assert note.level == "warn" and note.text.startswith("TF_CONFIG is set: tf.distribute.MultiWorkerMirroredStrategy")


def test_doctor_names_the_strategy_of_its_scope():
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("a tf.distribute strategy")
    import tensorflow as tf

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        d = doctor.distribution_facts("tensorflow", gpus=0, env={})
    assert d.engine == "tf.distribute MirroredStrategy over 1 replicas" and d.process_count == 1


def test_doctor_says_torch_fit_uses_one_of_several_gpus():
    gpus = [FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-b")]
    nv = doctor.nvml_facts(NVML(FakeNVML(gpus)), env={})
    d = doctor.distribution_facts("torch", gpus=len(nv.visible), env={})
    (note,) = doctor.distribution_findings(d)
    assert (
        note.level == "warn" and "2 GPUs are visible, but Keras's fit() on the torch backend trains on one" in note.text
    )
    assert doctor.distribution_findings(doctor.distribution_facts("torch", gpus=1, env={})) == []


def test_doctor_warns_that_launcher_processes_train_alone():
    env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"}
    d = doctor.distribution_facts("torch", gpus=1, env=env)
    assert (d.process_index, d.process_count, d.source) == (1, 4, "SLURM_PROCID/SLURM_STEP_NUM_TASKS")
    assert d.launcher == ["SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=4"] and not d.channel
    (finding,) = doctor.distribution_findings(d)
    assert finding.level == "warn" and "process 1 of 4" in finding.text
    assert "each process trains a model of its own" in finding.text
    report = doctor.render(doctor.FrameworkFacts("torch"), doctor.NVMLFacts(False, "none"), [finding], env, d)
    assert "process 1 of 4 (SLURM_PROCID/SLURM_STEP_NUM_TASKS)" in report and "store): no" in report
    assert "launcher variables: SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=4" in report


# -- report on hostile log dirs: never less than there was, never a traceback ------------------
def _good_run(log_dir, run="gpu"):
    from keras_gpu_tools.logdir.writer import EventWriter

    w = EventWriter(os.path.join(os.fsdecode(log_dir), run))
    w.scalars({"host/cpu_percent": 50.0}, step=1, wall_time=10.0)
    w.close()


EARLIER = "earlier report " * 1000


def test_report_with_a_run_directory_that_is_not_utf8_replaces_the_earlier_report(tmp_path, capsys):
    from keras_gpu_tools import cli

    (tmp_path / "report.html").write_text(EARLIER)
    _good_run(tmp_path)
    _good_run(os.fsencode(tmp_path) + b"/run_\xff")
    assert cli.main(["report", str(tmp_path)]) == 0, capsys.readouterr().err
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "run_\\xff" in page and "run_\\xff" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == sorted(
        [b"run_\xff".decode("utf-8", "surrogateescape"), "gpu", "report.html"]
    )


def test_report_of_only_empty_event_files_exits_2_and_keeps_the_earlier_report(tmp_path, capsys):
    from keras_gpu_tools import cli

    (tmp_path / "report.html").write_text(EARLIER)
    for run in ("gpu", "input"):  # writers killed before their first flush
        (tmp_path / run).mkdir()
        (tmp_path / run / "events.out.tfevents.1700000000.host.1.v2").write_bytes(b"")
    assert cli.main(["report", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "could be read" in err and "gpu/events.out" in err and "is empty" in err
    assert (tmp_path / "report.html").read_text() == EARLIER
    assert "2 nothing is written, and an earlier report is kept: no event file could be read" in build_report_help()


def build_report_help():
    from keras_gpu_tools.cli.app import build_parser

    sub = next(a for a in build_parser()._subparsers._group_actions if a.choices)
    return " ".join(sub.choices["report"].format_help().split())


@pytest.mark.slow
def test_report_command_of_only_empty_event_files_exits_2_in_a_process_of_its_own(tmp_path):
    (tmp_path / "report.html").write_text(EARLIER)
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "events.out.tfevents.1700000000.host.1.v2").write_bytes(b"")
    proc = run_cli("report", str(tmp_path), "--quiet", timeout=300)
    assert proc.returncode == 2 and "is empty" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "report.html").read_text() == EARLIER


def test_report_never_opens_a_fifo_and_names_it(tmp_path, capsys):
    import threading

    from keras_gpu_tools import cli
    from tests.helpers.timing_telemetry import fifo_reader_seen

    _good_run(tmp_path)
    (tmp_path / "input").mkdir()
    fifo = tmp_path / "input" / "events.out.tfevents.1700000000.host.1.v2"
    os.mkfifo(fifo)
    result = {}
    # Whether the FIFO was opened, not whether the report (its figures drawn) ended within a deadline.
    with fifo_reader_seen(fifo) as seen:
        t = threading.Thread(target=lambda: result.update(rc=cli.main(["report", str(tmp_path), "--quiet"])))
        t.start()
        t.join()
    assert not seen["opened"], "report blocked in open() on a FIFO"
    assert result["rc"] == 0
    err = capsys.readouterr().err
    assert f"input/{fifo.name} is not a regular file" in err
    assert f"input/{fifo.name}" in (tmp_path / "report.html").read_text()


def test_report_names_crafted_event_files_with_their_reason(tmp_path, capsys):
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from keras_gpu_tools import cli
    from keras_gpu_tools.logdir.writer import EventWriter

    _good_run(tmp_path)
    header = struct.pack("<Q", 2**40)  # a valid length checksum announcing 1 TiB
    (tmp_path / "oom").mkdir()
    huge = tmp_path / "oom" / "events.out.tfevents.1700000000.host.1.v2"
    huge.write_bytes(header + struct.pack("<I", masked_crc32c(header)) + b"\x00" * 16)
    w = EventWriter(str(tmp_path / "input"))
    w.text("input/verdict/data", "[" * 200_000 + "]" * 200_000, step=1)
    w.close()
    (deep,) = (tmp_path / "input").iterdir()
    assert cli.main(["report", str(tmp_path), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"oom/{huge.name} is not a TensorBoard event file" in err or f"oom/{huge.name} is corrupt" in err, err
    assert f"input/{deep.name}" in err and "nested deeper than" in err
    page = (tmp_path / "report.html").read_text()
    assert "Event files that could not be read" in page or "could not be read" in page
    assert f"oom/{huge.name}" in page and f"input/{deep.name}" in page


def test_report_checks_its_output_paths_before_writing_anything(tmp_path, capsys):
    from keras_gpu_tools import cli

    _good_run(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert cli.main(["report", str(tmp_path), "--quiet", "-o", str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert "--output" in err and "is a directory" in err and "Traceback" not in err
    assert list(out_dir.iterdir()) == [] and not (tmp_path / "report.html").exists()

    blocker = tmp_path / "plots"
    blocker.write_text("a file")
    assert cli.main(["report", str(tmp_path), "--quiet", "--png", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert "--png" in err and "not a directory" in err
    assert not (tmp_path / "report.html").exists() and blocker.read_text() == "a file"

    assert cli.main(["report", str(tmp_path), "--quiet", "-o", str(blocker / "report.html")]) == 2
    assert "--output" in capsys.readouterr().err and not (tmp_path / "report.html").exists()


def test_doctor_lists_each_health_field_with_supported_or_its_reason():
    hopper = FakeGPU(uuid="GPU-a")
    older = FakeGPU(
        name="Tesla V100-SXM2-16GB",
        uuid="GPU-b",
        compute_capability=(7, 0),
        gpm=False,
        nvlink_links=0,
        unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors:1"},
    )
    fw, nv, findings = facts_with([hopper, older], env={}, fw_gpus=["GPU:0", "GPU:1"], built_with_cuda=True)
    assert nv.health["GPU:0"] == dict.fromkeys(nv.health["GPU:0"])  # everything reported
    assert set(nv.health["GPU:0"]) >= {"energy_joules", "dram_bandwidth_percent", "xid_events", "nvlink_tx_mib_per_sec"}
    reasons = nv.health["GPU:1"]
    assert reasons["energy_joules"] == "NVMLError: Not Supported"
    assert reasons["ecc_uncorrected_errors"] == "NVMLError: Not Supported"
    assert reasons["ecc_corrected_errors"] is None
    assert "Hopper" in reasons["dram_bandwidth_percent"] and "Hopper" in reasons["nvlink_rx_mib_per_sec"]
    assert reasons["throttle_power_percent"] is None and reasons["xid_events"] is None
    report = doctor.render(fw, nv, findings, {})
    assert "[health fields, GPU:1]" in report
    assert "  energy_joules: not reported: NVMLError: Not Supported" in report
    assert "  throttle_power_percent: supported" in report
