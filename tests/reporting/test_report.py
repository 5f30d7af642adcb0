"""The training report: gathered from callbacks or a log dir, rendered as text, HTML and PNG."""

import base64
import os
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.reporting.from_logdir import gather_log_dir
from keras_gpu_tools.reporting.model import SPLIT_AND_STEP_KEYS, ReportData
from keras_gpu_tools.reporting.report import TrainingReport, report
from keras_gpu_tools.reporting.sections.mixed_precision import findings_markdown
from tests.helpers.fake_report import FakeDetector, FakeGPULogger, fake_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- the package's callbacks, holding what a fit would have recorded ---------------------
# -- from callbacks -------------------------------------------------------------------
def test_figures_plot_exactly_what_the_callbacks_recorded():
    lg, det = FakeGPULogger(), FakeDetector()
    r = report(lg, det)
    figs = r.figures()
    assert list(figs) == ["gpu_0", "host", "step_time"]
    ax_util, ax_mem = figs["gpu_0"].axes
    lines = {ln.get_label(): ln for ln in ax_util.lines}
    assert set(lines) == {"utilization_percent", "sm_activity_percent"}
    expected = [m["gpu/0/utilization_percent"] for _, _, m in lg.timeline]
    np.testing.assert_array_equal(lines["utilization_percent"].get_ydata(), expected)
    np.testing.assert_allclose(lines["utilization_percent"].get_xdata(), [w - 1000.0 for w, _, _ in lg.timeline])
    mem = {ln.get_label(): ln for ln in ax_mem.lines}
    np.testing.assert_array_equal(
        mem["memory_used_mib"].get_ydata(), [m["gpu/0/memory_used_mib"] for _, _, m in lg.timeline]
    )
    assert "H100" in figs["gpu_0"].get_suptitle()
    # Stacked bars: wait at the bottom, then compute, then other, per epoch.
    bars = figs["step_time"].axes[0].patches
    heights = [b.get_height() for b in bars]
    np.testing.assert_allclose(heights, [3.0, 2.0, 1.0, 1.1, 0.5, 0.4])
    assert [b.get_y() for b in bars[2:4]] == [3.0, 2.0]


def test_text_report_has_every_section():
    text = str(fake_report())
    for heading in ("GPUs and host", "Step time", "Input pipeline", "Out of memory", "Mixed precision"):
        assert f"\n{heading}\n" in text
    assert "Not measured in this run: profiler windows (ProfilerWindow)." in text
    assert "GPU 0: NVIDIA H100 80GB HBM3" in text
    assert "Verdict: highly input-bound" in text and "prefetch" in text
    assert (
        "step 57: out of memory at batch 256" in text
        and "micro-batches per batch now: 4" in text
        and "1 recovery from" in text
    )
    assert "[output_dtype] dense_1" in text
    assert re.search(r"gpu/0/utilization_percent\s+40\.0\s+54\.5\s+69\.0\s+69\.0", text)


def test_html_embeds_every_figure_as_png(tmp_path):
    r = fake_report()
    page = r.html(full_page=True)
    images = re.findall(
        r'<figure class="kgt-fig" data-figure="([^"]+)"><img alt="[^"]*" src="data:image/png;base64,([^"]+)"', page
    )
    assert [name for name, _ in images] == list(r.figures()) == ["gpu_0", "host", "step_time", "oom", "training"]
    for name, b64 in images:
        png = base64.b64decode(b64)
        assert png.startswith(PNG_MAGIC) and png == r.pngs()[name]
    assert "highly input-bound" in page and "step 57: out of memory at batch 256" in page and "dense_1" in page
    path = r.save(tmp_path / "r" / "report.html")
    assert open(path, encoding="utf-8").read() == page
    pngs = r.save_figures(tmp_path / "png")
    assert sorted(os.path.basename(p) for p in pngs) == [
        "gpu_0.png",
        "host.png",
        "oom.png",
        "step_time.png",
        "training.png",
    ]
    assert all(open(p, "rb").read().startswith(PNG_MAGIC) for p in pngs)
    assert r._repr_html_() == r.html()


def test_oom_figure_follows_the_reducer_logs():
    fig = fake_report().figures()["oom"]
    lines = {ln.get_label(): ln.get_ydata().tolist() for ln in fig.axes[0].lines}
    assert lines == {"oom/events": [1.0, 0.0], "oom/micro_batches": [4.0, 4.0]}


def test_empty_sections_say_what_is_missing():
    r = report({"loss": [1.0, 0.5]})
    text = r.text()
    for heading in (
        "GPUs and host",
        "Step time",
        "Input pipeline",
        "Out of memory",
        "Profiler windows",
        "Mixed precision",
    ):
        assert f"\n{heading}\n" not in text  # no data, no section...
    assert (
        "Not measured in this run: GPU and host metrics (GPUUtilizationLogger); step time and the input-bound "
        "verdict (InputBoundDetector); profiler windows (ProfilerWindow); mixed-precision findings"
    ) in text
    assert "Not measured in this run" in r.html()  # ...but one line says what is missing
    assert "loss: 1, 0.5" in text


def test_without_matplotlib_the_report_still_renders(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    r = fake_report()
    assert r.figures() == {} and "data:image/png" not in r.html()
    assert "pip install matplotlib" in r.text() and "highly input-bound" in r.html()


def test_bad_arguments():
    with pytest.raises(ValueError, match="nothing to report"):
        report()
    with pytest.raises(TypeError, match="log_dir="):
        report(FakeDetector(), "logs")
    with pytest.raises(ValueError, match="does not exist"):
        report("/nonexistent/kgt-logs")


@pytest.mark.slow
def test_report_modules_import_nothing_heavy():
    # Keras itself may load matplotlib or IPython where they are installed;
    # the report and the live view add no import of their own.
    code = (
        "import sys, keras, keras_gpu_tools; before = set(sys.modules); "
        "import keras_gpu_tools.reporting.report, keras_gpu_tools.live.render, keras_gpu_tools.callbacks.live_view; "
        "print(sorted(m.split('.')[0] for m in set(sys.modules) - before if not m.startswith('keras_gpu_tools')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# -- from a log dir ---------------------------------------------------------------------
def test_log_dir_with_scalars_of_every_callback(tmp_path):
    gpu = EventWriter(str(tmp_path / "gpu"))
    for i in range(5):
        gpu.scalars(
            {"gpu/0/utilization_percent": 10.0 * i, "gpu/0/memory_used_mib": 100.0 + i}, step=i, wall_time=50.0 + i
        )
    gpu.close()
    inp = EventWriter(str(tmp_path / "input"))
    inp.scalars({"input/wait_ms": 1.0, "input/compute_ms": 2.0, "input/other_ms": 0.5, "input/step_ms": 3.5}, step=100)
    inp.scalars({"input/step_ms": 3.4}, step=200)  # a window without a synced step: no split
    inp.close()
    oom = EventWriter(str(tmp_path / "oom"))
    oom.scalars({"oom/events": 1.0, "oom/micro_batches": 2.0}, step=7)
    oom.close()
    data = gather_log_dir(str(tmp_path))
    assert data.series["gpu/0/utilization_percent"].values == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert data.split_x == [100.0, 200.0] and data.split["input/compute_ms"] == [2.0, None]  # the second: "n/a"
    assert data.oom_seen and data.oom_series["oom/micro_batches"].values == [2.0] and data.oom_count() == 1
    assert data.findings is None
    r = TrainingReport(data)
    assert list(r.figures()) == ["gpu_0", "step_time", "oom"]


def test_findings_round_trip_through_tensorboard(tmp_path):
    findings = [
        {"kind": "output_dtype", "layer": "dense_1", "message": "Output `dense_1` of the model is float16: use X."},
        {"kind": "no_tensor_cores", "layer": None, "message": "GPU 0 has no tensor cores."},
    ]
    TrainingReport(ReportData(findings=findings)).write_to_tensorboard(tmp_path)
    assert gather_log_dir(str(tmp_path)).findings == findings
    other = tmp_path / "none"
    TrainingReport(ReportData(findings=[])).write_to_tensorboard(other)
    assert gather_log_dir(str(other)).findings == []
    assert findings_markdown([]) == "No mixed-precision finding."


# -- end to end with a real fit ---------------------------------------------------------------
def test_report_of_a_real_fit_equals_the_callbacks_and_the_log_dir(tmp_path):
    import keras

    from keras_gpu_tools import GPUUtilizationLogger, MixedPrecisionCheck
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

    logdir = str(tmp_path / "logs")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1280, 16)).astype("float32")
    y = rng.integers(0, 4, size=1280)
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4, activation="softmax")]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    lg = GPUUtilizationLogger(log_dir=logdir, interval=0.05)
    det = InputBoundDetector(log_dir=logdir, window=10, sample_every=5, verbose=0)
    prof = ProfilerWindow(log_dir=logdir, start_step=5, num_steps=3, verbose=0)
    mp = MixedPrecisionCheck()
    callbacks = [lg, det, prof, mp]
    if keras.backend.backend() == "tensorflow":
        callbacks.append(keras.callbacks.TensorBoard(log_dir=logdir))
    model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=callbacks, validation_split=0.2)

    r = report(callbacks, model)
    figs = r.figures()
    assert {"host", "step_time"} <= set(figs)
    cpu = next(ln for ln in figs["host"].axes[0].lines if ln.get_label() == "cpu_percent")
    np.testing.assert_array_equal(
        cpu.get_ydata(), [m["host/cpu_percent"] for _, _, m in lg.timeline if "host/cpu_percent" in m]
    )
    heights = [b.get_height() for b in figs["step_time"].axes[0].patches]
    expected = [
        h.get(k, 0.0) for k in ("input/wait_ms", "input/compute_ms", "input/other_ms") for h in det.epoch_history
    ]
    np.testing.assert_allclose(heights, expected)
    assert r.data.verdict["category"] == det.verdict.category
    assert [p["steps"] for p in r.data.profiles] == [
        f"{c.start_step + 1}-{c.start_step + c.num_steps}" for c in prof.captures
    ]
    if keras.backend.backend() == "tensorflow":  # steps 6-8, as the window's line and its tag name them
        assert [p["steps"] for p in r.data.profiles] == ["6-8"]
        assert [p["span"] for p in r.data.profiles] == ["steps 6-8"]
    assert r.data.findings == [] and r.data.training["loss"].values == pytest.approx(model.history.history["loss"])

    # After the fact, from the log dir alone: the same series, verdict, windows, findings.
    r.write_to_tensorboard(logdir)
    later = report(logdir)
    # The step-time table has the fit's own rows, one per epoch (the detector's scalars are by window of 10 steps).
    assert later.data.split_axis == r.data.split_axis == "epoch"
    assert later.data.split_x == r.data.split_x == [1.0, 2.0, 3.0]
    for key, _ in SPLIT_AND_STEP_KEYS:
        assert later.data.split[key] == [None if v is None else pytest.approx(v, rel=1e-6) for v in r.data.split[key]]
    for key in ("host/cpu_percent", "host/rss_mib"):
        np.testing.assert_allclose(later.data.series[key].values, r.data.series[key].values, rtol=1e-6)
        assert later.data.series[key].steps == r.data.series[key].steps
    assert later.data.verdict["category"] == det.verdict.category
    # The input section says what the verdict covers and lists every phase, from the log dir alone.
    text = later.text()
    # (On a loaded machine the first epoch can be left out as warm-up: "steady state, epochs 2-3".)
    verdict = next(line for line in text.splitlines() if line.startswith("Verdict: "))
    assert verdict.startswith(f"Verdict: {det.verdict.category} (") and f"{det.verdict.scope})" in verdict
    phases = [p["label"] for p in later.data.verdict["phases"]]
    assert phases == [p["label"] for p in r.data.verdict["phases"]] and phases[-1] == "epoch 3"
    assert "Phases:\n" + "\n".join(f"- {label}: " for label in phases[:1]) in text and "- epoch 3: " in text
    assert later.data.verdict["speedup_bound"] == pytest.approx(det.verdict.speedup_bound)
    assert [(p["steps"], p["conclusion"]) for p in later.data.profiles] == [
        (p["steps"], p["conclusion"]) for p in r.data.profiles
    ]
    assert later.data.findings == []
    if keras.backend.backend() == "tensorflow":
        np.testing.assert_allclose(later.data.training["loss"].values, model.history.history["loss"], rtol=1e-6)
        assert "val_loss" in later.data.training and not any(
            k.startswith(("host/", "input/")) for k in later.data.training
        )
    page = later.html()
    assert page.count("data:image/png;base64,") == len(later.figures())


# -- text shown literally, unreadable files named -----------------------------------------------------
def test_dollar_signs_in_tags_and_texts_are_shown_literally(tmp_path):
    # matplotlib reads "$...$" as mathtext, and "$a_b_c$" is a mathtext error (double subscript).
    gpu = EventWriter(str(tmp_path / "gpu"))
    gpu.json(
        "gpu/devices/data",
        [
            {
                "index": 0,
                "name": "$x_y_z$",
                "uuid": "GPU-x",
                "memory_total_bytes": 40960 * 2**20,
                "compute_capability": [8, 0],
            }
        ],
        step=0,
    )
    for i in range(3):
        gpu.scalars(
            {"gpu/0/utilization_percent": 10.0 * i, "gpu/0/$a_b_c$": 1.0, "gpu/$a_b_c$/utilization_percent": 5.0},
            step=i,
            wall_time=50.0 + i,
        )
    gpu.close()
    oom = EventWriter(str(tmp_path / "oom"))
    oom.scalars({"oom/events_total": 1.0, "oom/$a_b_c$": 2.0}, step=3)
    oom.close()
    rep = EventWriter(str(tmp_path / "report"))
    rep.json(
        "mixed_precision/findings/data",
        [{"kind": "output_dtype", "layer": "$x_y_z$", "message": "Output `$x_y_z$` is float16."}],
        step=0,
    )
    rep.close()

    r = report(str(tmp_path))
    figs = r.figures()
    assert {"gpu_0", "gpu_$a_b_c$", "oom"} <= set(figs)
    assert figs["gpu_0"].get_suptitle() == "GPU 0: $x_y_z$"
    assert figs["gpu_$a_b_c$"].get_suptitle() == "GPU $a_b_c$"
    assert "oom/$a_b_c$" in [t.get_text() for t in figs["oom"].axes[0].get_legend().get_texts()]
    page = r.html(full_page=True)  # draws every figure: no mathtext error
    assert page.count("data:image/png;base64,") == len(figs)
    assert "$x_y_z$" in page and "gpu/0/$a_b_c$" in page and "$x_y_z$" in r.text()


def _garbage_and_truncated(tmp_path):
    """A log dir with one good run, one garbage event file and one truncated event file."""
    good = EventWriter(str(tmp_path / "gpu"))
    good.scalars({"host/cpu_percent": 50.0}, step=1, wall_time=10.0)
    good.close()
    garbage = tmp_path / "input" / "events.out.tfevents.1700000000.host.1.v2"
    garbage.parent.mkdir()
    garbage.write_bytes(b"this is not a TensorBoard event file, only some text\n" * 20)
    whole = EventWriter(str(tmp_path / "profile"))
    whole.text("profile/steps_1_2", "x" * 200, step=1)
    whole.close()
    (path,) = (tmp_path / "profile").iterdir()
    truncated = tmp_path / "profile" / "events.out.tfevents.1700000001.host.2.v2"
    truncated.write_bytes(path.read_bytes()[:-60])  # the text record cut in the middle
    path.unlink()
    return ["input/" + garbage.name, "profile/" + truncated.name]


def test_unreadable_event_files_are_named_in_the_report(tmp_path):
    garbage, truncated = _garbage_and_truncated(tmp_path)
    r = report(str(tmp_path))
    assert r.data.series["host/cpu_percent"].values == [50.0]  # the good file is read
    assert [p for p, _ in r.data.unreadable] == [garbage]
    # A last record cut short (a writer stopped mid-write) is no error: a note, once.
    (note,) = [n for n in r.data.notes if truncated in n]
    assert note.startswith(truncated) and "cut short" in note
    text, page = r.text(), r.html()
    for name in (garbage, truncated):
        assert text.count(name) == 1 and page.count(name) == 1
    assert "could not be read" in text and "could not be read" in page and "cut short" in text


def test_a_log_dir_of_only_unreadable_event_files_is_an_error(tmp_path):
    garbage = tmp_path / "gpu" / "events.out.tfevents.1700000000.host.1.v2"
    garbage.parent.mkdir()
    garbage.write_bytes(b"\x00\x01garbage" * 50)
    with pytest.raises(ValueError, match=r"none of its 1 event file\(s\) could be read.*gpu/events\.out"):
        report(str(tmp_path))


# -- callbacks found by class; the log dir read from the JSON the callbacks wrote ----------------
def test_callbacks_are_found_by_their_class_not_by_their_attributes():
    class MyReducer(OOMBatchSizeReducer):
        """A user's subclass: still the package's callback."""

    class OOMLookalike:
        """Has the attributes (and the name) the report once looked for, but is no callback of the package."""

        micro_batches = 4
        events = recoveries = ()
        timeline = gpus = captures = findings = ()

    r = report(MyReducer(), OOMLookalike(), {"loss": [1.0]})
    assert r.data.sources == ["MyReducer"] and r.data.oom_seen and r.data.oom_count() == 0
    assert r.data.oom_summary == {"micro-batches per batch now": 1}
    r = report(OOMLookalike(), {"loss": [1.0]})
    assert r.data.sources == [] and not r.data.oom_seen and r.data.findings is None
    assert "\nOut of memory\n" not in r.text() and not r.data.series and not r.data.profiles


def test_json_tags_come_before_the_text_written_for_people(tmp_path):
    w = EventWriter(str(tmp_path / "gpu"))
    w.text(
        "gpu/devices",
        "| index | GPU | UUID | memory (MiB) | compute capability |\n| 0 | NVIDIA A100 | GPU-x | 1 | 8.0 |",
        0,
    )
    record = {
        "index": 0,
        "name": "$x_y_z$ GPU",
        "uuid": "GPU-y",
        "memory_total_bytes": 2**30,
        "compute_capability": [9, 0],
    }
    w.json("gpu/devices/data", [record], 0)
    w.scalars({"gpu/0/utilization_percent": 50.0}, step=1, wall_time=1.0)
    w.close()
    w = EventWriter(str(tmp_path / "profile"))
    w.text("profile/steps_4_5", "ProfilerWindow: steps [3, 5) (scheduled) -> /prose (9.0 MiB)", 3)
    capture = {
        "start_step": 3,
        "num_steps": 2,
        "files": ["/json/t.xplane.pb"],
        "size_bytes": 2**20,
        "reason": "triggered",
    }
    w.json("profile/steps_4_5/data", capture, 3)
    w.json("profile/steps_4_5/input_pipeline/data", {"conclusion": "", "error": "no xprof"}, 3)
    w.close()
    w = EventWriter(str(tmp_path / "input"))
    w.text("input/verdict/data", "{not JSON", 5)
    w.json("oom/events/data", {"step": 1}, 5)  # not an OOMEvent
    w.close()
    data = gather_log_dir(str(tmp_path))
    assert len(data.notes) == 2 and "'input/verdict/data'" in data.notes[0] and "'oom/events/data'" in data.notes[1]
    assert data.verdict is None and not data.oom_events  # left out, and the rest is read
    assert data.gpus == [
        {"index": "0", "name": "$x_y_z$ GPU", "uuid": "GPU-y", "memory": "1024 MiB", "compute capability": "9.0"}
    ]
    (p,) = data.profiles
    assert (p["steps"], p["reason"], p["trace_dir"], p["size_mib"], p["mean_step_ms"], p["conclusion"]) == (
        "4-5",
        "triggered",
        "/json",
        1.0,
        None,
        "xprof gave no conclusion (no xprof)",
    )
    assert TrainingReport(data).figures()["gpu_0"].get_suptitle() == "GPU 0: $x_y_z$ GPU"


def test_log_dir_report_holds_the_callbacks_own_records(tmp_path):
    import keras

    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
    from keras_gpu_tools.telemetry.nvml import NVML
    from tests.helpers.fake_nvml import FakeGPU, FakeNVML

    backend = keras.backend.backend()
    logdir = str(tmp_path / "logs")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 16)).astype("float32")
    y = rng.integers(0, 4, size=640)
    layers = [keras.Input((16,)), keras.layers.Dense(32, activation="relu")]
    if backend == "tensorflow":
        layers.append(OOMAbove(16))  # one recovery: batches of 32 run as 2 x 16
    layers.append(keras.layers.Dense(4, activation="softmax", dtype="mixed_float16"))  # a float16 output: a finding
    model = keras.Sequential(layers)
    model.compile("adam", "sparse_categorical_crossentropy", run_eagerly=backend == "tensorflow")
    lg = GPUUtilizationLogger(log_dir=logdir, interval=0.05, nvml=NVML(FakeNVML([FakeGPU()])))
    det = InputBoundDetector(log_dir=logdir, window=5, sample_every=2, verbose=0)
    prof = ProfilerWindow(log_dir=logdir, start_step=3, num_steps=2, verbose=0)
    mp = MixedPrecisionCheck()
    callbacks = [lg, det, prof, mp]
    if backend == "tensorflow":
        reducer = OOMBatchSizeReducer(log_dir=logdir)
        callbacks.insert(0, reducer)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=callbacks)
    live = report(callbacks).data
    TrainingReport(live).write_to_tensorboard(logdir)  # the findings, which MixedPrecisionCheck does not write
    data = gather_log_dir(logdir)

    ((index, gpu),) = lg.gpus
    assert data.gpus == [
        {
            "index": str(index),
            "name": gpu.name,
            "uuid": gpu.uuid,
            "memory": f"{gpu.memory_total_bytes / 2**20:.0f} MiB",
            "compute capability": ".".join(map(str, gpu.compute_capability)),
        }
    ]
    v = det.verdict
    assert data.verdict == {
        "category": v.category,
        "span": v.span,
        "wait_fraction": v.wait_fraction,
        "message": v.message,
        "evidence": v.evidence,
        "advice": v.advice,
        "scope": v.scope,
        "phases": [
            {
                "label": p.label,
                "steps": p.steps,
                "wait_fraction": p.wait_fraction,
                "step_ms": None if p.step is None else 1e3 * p.step,
                "steady": p.steady,
                "reason": p.reason,
            }
            for p in v.phases
        ],
        "speedup_bound": v.speedup_bound,
        "fit_wait_fraction": v.fit_wait_fraction,
        "fit_figures": det.fit_measurement.logs(),
        "text": det.summary(),
    }
    assert [p["label"] for p in data.verdict["phases"]] == ["epoch 1", "epoch 2"]
    figures = det.measurement.logs()
    assert figures and {k: data.throughput[k] for k in figures} == figures
    assert prof.captures or backend != "tensorflow"  # (JAX profiles only on Python 3.12+)
    assert [
        (p["start"], p["num_steps"], p["reason"], p["trace_dir"], p["size_mib"], p["mean_step_ms"])
        for p in data.profiles
    ] == [
        (c.start_step, c.num_steps, c.reason, c.trace_dir or "", c.size_bytes / 2**20, c.mean_step_ms)
        for c in prof.captures
    ]
    assert mp.findings and data.findings == [
        {"kind": f.kind, "layer": f.layer, "message": f.message} for f in mp.findings
    ]
    if backend == "tensorflow":
        assert len(reducer.events) == 1 and data.oom_events == [e.line() for e in reducer.events]
        assert data.oom_summary == {
            "micro-batches per batch now": reducer.micro_batches,
            "seconds spent in failed attempts": round(reducer.recovery_seconds, 2),
        }
    # The callbacks and their log dir make the same report.
    for field in ("gpus", "verdict", "profiles", "findings", "oom_events", "oom_summary"):
        assert getattr(data, field) == getattr(live, field), field


class OOMAbove(keras.layers.Layer):
    """Raises TensorFlow's out-of-memory error for batches above `limit` (in eager steps)."""

    def __init__(self, limit, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    def call(self, x):
        if x.shape[0] is not None and x.shape[0] > self.limit:
            import tensorflow as tf

            raise tf.errors.ResourceExhaustedError(None, None, f"OOM allocating a tensor of {x.shape[0]} samples")
        return x


def test_job_keys_of_a_history_are_no_training_curve():
    hist = {
        "loss": [1.0, 0.5],
        "job/gpu/utilization_percent_mean": [40.0, 41.0],
        "gpu/0/utilization_percent": [1.0, 2.0],
    }
    r = report(hist)
    assert list(r.data.training) == ["loss"]


def _job_profile_log_dir(tmp_path, job_files):
    """The profiler runs of a job of two processes, as ProfilerWindow writes them (process 1 the slower)."""
    session = "/logs/profile/job/plugins/profile/2026_11_26_09_00_00_steps_4_7"
    for i, ms in enumerate((2.0, 5.5)):
        w = EventWriter(str(tmp_path / "profile" / f"process_{i}"))
        own = {"start_step": 3, "num_steps": 4, "files": [f"{session}/h_p{i}.xplane.pb"], "mean_step_ms": ms}
        w.json("profile/steps_4_7/data", own, 3)
        w.close()
    w = EventWriter(str(tmp_path / "profile" / "job"))
    record = {
        "start_step": 3,
        "num_steps": 4,
        "files": [f"{session}/h_p0.xplane.pb"],
        "mean_step_ms": 2.0,
        "job_files": [f"{session}/{name}" for name in job_files],
        "job_mean_step_ms": [2.0, 5.5],
        "job_analysis": None,  # written apart, once xprof is done
    }
    w.text("profile/steps_4_7", "ProfilerWindow: job of 2 processes, steps [3, 7) -> ...", 3)
    w.json("profile/steps_4_7/data", record, 3)
    w.text("profile/steps_4_7/input_pipeline", "Your program is NOT input-bound because ...", 3)
    w.json("profile/steps_4_7/input_pipeline/data", {"conclusion": "Your program is NOT input-bound because ..."}, 3)
    w.close()
    return session


def test_the_job_section_shows_each_profiler_window_of_the_job(tmp_path):
    session = _job_profile_log_dir(tmp_path, ["h_p0.xplane.pb", "h_p1.xplane.pb"])
    data = gather_log_dir(str(tmp_path))
    assert data.processes == [0, 1] and data.process_count == 2
    (own,) = data.profiles  # process 0's own window, as before
    assert own["mean_step_ms"] == 2.0 and own["trace_dir"] == session
    (p,) = data.job_profiles
    assert (p["steps"], p["processes"], p["trace_dir"], p["mean_step_ms"], p["slowest"]) == (
        "4-7",
        2,
        session,
        [2.0, 5.5],
        1,
    )
    assert p["files"] == [f"{session}/h_p0.xplane.pb", f"{session}/h_p1.xplane.pb"]
    assert p["conclusion"] == "Your program is NOT input-bound because ..."

    text = TrainingReport(data).text()
    job = text.split("Job of 2 processes")[1].split("Profiler windows\n")[0]
    assert "Profiler windows of the job (one session, one trace per process):" in job
    assert f"steps 4-7: 2 trace files of 2 processes in {session}" in job
    assert "  trace: h_p0.xplane.pb\n  trace: h_p1.xplane.pb" in job
    assert "  process 0: mean step 2.00 ms\n  process 1: mean step 5.50 ms (slowest)" in job
    assert "  xprof over every trace: Your program is NOT input-bound because ..." in job
    assert "only" not in job
    assert "No job-wide figures" not in job  # ProfilerWindow writes none: its windows are the job's figures

    html = TrainingReport(data).html()
    section = html.split("<h3>Job of 2 processes</h3>")[1].split("<h3>")[0]
    assert "Profiler windows of the job" in section and f"<code>{session}</code>" in section
    assert "<td>1 (slowest)</td><td>5.50 ms</td>" in section and "<td>0</td><td>2.00 ms</td>" in section
    assert "<li>trace: h_p1.xplane.pb</li>" in section
    assert "xprof over every trace: Your program is NOT input-bound because ..." in section

    # Only the job run (the process runs on other hosts): the job's windows still, and the job's size.
    alone = tmp_path / "alone"
    shutil.copytree(tmp_path / "profile" / "job", alone / "profile" / "job")
    data = gather_log_dir(str(alone))
    assert data.process_count == 2 and [p["steps"] for p in data.job_profiles] == ["4-7"]
    assert "Job of 2 processes" in TrainingReport(data).text()


def test_a_job_window_missing_a_trace_says_so(tmp_path):
    _job_profile_log_dir(tmp_path, ["h_p0.xplane.pb"])  # process 1's log_dir is not process 0's
    text = TrainingReport(gather_log_dir(str(tmp_path))).text()
    assert "steps 4-7: 1 trace file of 2 processes in" in text
    assert "only 1 of 2 processes' traces are there (is log_dir shared by every host?)" in text
    assert "process 1: mean step 5.50 ms (slowest)" in text


# -- saving: the whole file or the earlier one ----------------------------------------------------
def test_save_replaces_the_earlier_file_whole_or_leaves_it(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    path.write_text("earlier report")
    r = TrainingReport(ReportData(title="run_\udcff"))  # a name decoded with surrogateescape
    assert r.save(path) == str(path)
    page = path.read_text(encoding="utf-8")
    assert "run_\\udcff" in page or "run_\\xff" in page

    path.write_text("earlier report")

    def broken(self, full_page=False):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(TrainingReport, "html", broken)
    with pytest.raises(RuntimeError, match="rendering failed"):
        r.save(path)
    assert path.read_text() == "earlier report" and os.listdir(tmp_path) == ["report.html"]


def test_many_windows_are_drawn_as_stacked_steps_over_the_real_steps(tmp_path):
    from keras_gpu_tools.reporting.sections.step_time import BARS_AT_MOST

    w = EventWriter(str(tmp_path / "input"))
    ends = [int(i * 1.5) + 10 for i in range(BARS_AT_MOST + 40)]  # uneven windows
    for i, step in enumerate(ends):
        w.scalars(
            {"input/steps": 10.0, "input/wait_ms": 1.0 + i % 3, "input/compute_ms": 5.0, "input/other_ms": 0.5}, step
        )
    w.close()
    fig = report(str(tmp_path)).figures()["step_time"]
    (ax,) = fig.axes
    assert len(ax.patches) == 0  # no bar per window and part
    parts = ax.collections
    assert len(parts) == 3 and "100 windows" in ax.get_title(loc="left")
    xs = sorted({round(float(x), 6) for path in parts[0].get_paths() for x, _ in path.vertices})
    assert xs[0] <= ends[0] and xs[-1] == ends[-1]  # on the steps' own axis, not one slot per window
