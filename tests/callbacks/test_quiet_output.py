"""What a user sees of our callbacks: a short progress bar, lines of their own, a clean TensorBoard.

Real fits with every callback of the package and Keras's own progress bar
(``verbose=1``), output captured at the file descriptors; real event files
read back with TensorBoard's ``EventAccumulator``.
"""

import contextlib
import os
import re
import subprocess
import sys
import time
import warnings

import keras
import pytest

from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, OOMBatchSizeReducer, ProfilerWindow
from keras_gpu_tools.callbacks import keys as key_tables
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.native_logs import NATIVE_LINE
from keras_gpu_tools.telemetry.nvml import NVML
from tests.helpers.data import regression_data
from tests.helpers.fake_nvml import FakeGPU, FakeNVML
from tests.helpers.models import tiny_dense_model

WIDEST = 200  # characters: no line of ours wider
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FIELD = re.compile(r" - ([^\s:]+): ")
OURS = ("InputBoundDetector", "ProfilerWindow", "OOMBatchSizeReducer", "GPUUtilizationLogger")


@pytest.fixture(autouse=True)
def no_cuda_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def terminal_lines(text: str) -> list[str]:
    """What a terminal shows: colours and backspaces dropped, each carriage return starting the line over."""
    text = _ANSI.sub("", text).replace("\b", "")
    return [part for line in text.split("\n") for part in line.split("\r") if part.strip()]


def all_callbacks(log_dir, **detector):
    fake = FakeNVML([FakeGPU()])
    return [
        GPUUtilizationLogger(log_dir=log_dir, interval=0.02, nvml=NVML(fake)),
        InputBoundDetector(log_dir=log_dir, window=4, sample_every=2, **detector),
        ProfilerWindow(log_dir=log_dir, start_step=2, num_steps=2),
        OOMBatchSizeReducer(log_dir=log_dir, verbose=1),
    ]


def fit(callbacks, verbose=1, epochs=2):
    x, y = regression_data(64, features=4)
    model = tiny_dense_model(features=4, hidden=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: the callbacks say so once
        history = model.fit(
            x, y, batch_size=8, epochs=epochs, validation_split=0.25, verbose=verbose, callbacks=callbacks
        )
    for cb in callbacks:
        if isinstance(cb, ProfilerWindow):
            cb.wait_for_analysis()
    return model, history


def epoch_bars(lines):
    """The final progress bar line of each epoch (the one with the validation loss)."""
    return [line for line in lines if "val_loss:" in line]


@pytest.mark.multibackend
@pytest.mark.parametrize("progress_bar", ["none", "brief"])
def test_the_progress_bar_shows_kerass_metrics_and_one_short_field_of_ours_at_most(tmp_path, capfd, progress_bar):
    callbacks = all_callbacks(str(tmp_path), verbose=2, progress_bar=progress_bar)
    fit(callbacks)
    lines = terminal_lines(capfd.readouterr().out)
    assert max(len(line) for line in lines) <= WIDEST, max(lines, key=len)
    bars = epoch_bars(lines)
    assert len(bars) == 2
    for bar in bars:
        fields = _FIELD.findall(bar)
        assert {"loss", "val_loss"} <= set(fields)
        brief = [schema.INPUT_WAIT_FRACTION] if progress_bar == "brief" else []  # (the others' are "none")
        assert [f for f in fields if f.startswith(schema.OWN_PREFIXES)] == brief
        assert "e+" not in bar.split(" - input/")[-1] and "e-" not in bar.split(" - input/")[-1]
    # Our lines are lines of their own: never glued to the bar's (unfinished) line.
    ours = [line for line in lines if any(name in line for name in OURS)]
    assert [line for line in ours if not line.startswith(OURS)] == []
    assert sum(line.startswith("InputBoundDetector: ") and "(epoch " in line for line in ours) == 2  # verbose=2


@pytest.mark.multibackend
def test_progress_bar_all_brings_a_callbacks_figures_to_the_bar(tmp_path, capfd):
    callbacks = all_callbacks(str(tmp_path), verbose=0, progress_bar="all")
    _, history = fit(callbacks, epochs=1)
    (bar,) = epoch_bars(terminal_lines(capfd.readouterr().out))
    fields = set(_FIELD.findall(bar))
    detector_keys = {
        k
        for k in history.history
        if k.startswith((schema.INPUT_PREFIX, schema.THROUGHPUT_PREFIX)) and k != schema.JOULES_PER_SAMPLE
    }
    assert detector_keys and detector_keys <= fields
    # The logger's figures stay off: the one brief field is the detector's, shown among all of its own.
    logger_keys = {k for k in history.history if k.startswith((schema.GPU_PREFIX, schema.HOST_PREFIX))}
    assert not fields & (logger_keys | {schema.JOULES_PER_SAMPLE})


class Boom(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("boom")


def test_kerass_callbacks_are_given_back_as_they_were_also_after_a_fit_that_raised(tmp_path):
    pytest.importorskip("tensorflow", reason="Keras's TensorBoard callback writes through TensorFlow")
    board, history, bar = keras.callbacks.TensorBoard(log_dir=str(tmp_path)), keras.callbacks.History(), None
    x, y = regression_data(32, features=4)
    model = tiny_dense_model(features=4, hidden=8)
    for boom in ([], [Boom()]):
        bar = keras.callbacks.ProgbarLogger()
        callbacks = [InputBoundDetector(log_dir=None, verbose=0), board, history, bar, *boom]
        with warnings.catch_warnings(), pytest.raises(RuntimeError) if boom else contextlib.nullcontext():
            warnings.simplefilter("ignore")
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=callbacks)
        deadline = time.monotonic() + 30  # after a raise, the fit's session notices within 0.2 s (more under load)
        while any("on_epoch_end" in vars(c) for c in (board, history, bar)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [c for c in (board, history, bar) if "on_epoch_end" in vars(c)] == []
    assert len(history.history["loss"]) == 2 and len(history.history["input/wait_fraction"]) == 2  # (History kept)


def documented_keys(cls) -> set:
    """The keys docs/keys.md gives for a callback (those of jobs of several processes left out)."""
    return {k for k in key_tables.history_keys(cls.__name__) if not k.startswith(schema.JOB_PREFIX)}


@pytest.mark.multibackend
def test_history_keeps_every_documented_key_with_the_progress_bar_on_or_off(tmp_path):
    def keys(verbose, sub):
        callbacks = all_callbacks(str(tmp_path / sub), verbose=0, flops_per_step=1e6, peak_flops=1e12)
        if verbose and keras.backend.backend() == "tensorflow":  # (Keras's writes through TensorFlow)
            callbacks.append(keras.callbacks.TensorBoard(log_dir=str(tmp_path / sub)))
        model, history = fit(callbacks, verbose=verbose, epochs=2)
        assert model.history is history
        assert all(len(v) == 2 for v in history.history.values())
        return set(history.history)

    shown, silent = keys(1, "bar"), keys(0, "silent")
    assert shown == silent
    # (dispatch is told apart on a GPU under JAX, collectives with several devices: neither on this CPU)
    assert documented_keys(InputBoundDetector) - {schema.STEP_DISPATCH_MS, schema.STEP_COLLECTIVE_MS} <= shown
    assert documented_keys(OOMBatchSizeReducer) <= shown
    logged = {schema.gpu_key(0, "utilization_percent"), schema.gpu_key(0, "memory_used_mib"), schema.HOST_RSS_MIB}
    assert logged <= shown and {"loss", "val_loss"} <= shown


def tensorboard_runs(log_dir):
    """Every run of ``log_dir``, loaded with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {}
    for root, dirs, files in os.walk(log_dir):
        dirs[:] = [d for d in dirs if d != "plugins"]
        if any(".tfevents." in f for f in files):
            acc = EventAccumulator(root, size_guidance={"scalars": 0, "tensors": 0})
            acc.Reload()
            runs[os.path.relpath(root, log_dir)] = acc
    return runs


def plugin_tags(acc, plugin):
    try:
        return acc.PluginTagToContent(plugin)
    except KeyError:  # no tag of that plugin in the run
        return {}


def test_tensorboard_has_each_figure_once_and_no_json_among_its_texts_with_kerass_callback(tmp_path):
    pytest.importorskip("tensorflow", reason="Keras's TensorBoard callback writes through TensorFlow")
    from keras_gpu_tools.reporting.from_logdir import gather_log_dir

    log_dir = str(tmp_path)
    # Keras's callback after ours: it sees every key ours put into the epoch logs.
    fit([*all_callbacks(log_dir, verbose=0), keras.callbacks.TensorBoard(log_dir=log_dir)], verbose=0)
    runs = tensorboard_runs(log_dir)
    assert {schema.KERAS_TRAIN_RUN, schema.KERAS_VALIDATION_RUN, "gpu", "input", "profile"} <= set(runs)
    figures: dict[str, list[str]] = {}
    for run, acc in runs.items():
        tags = set(acc.Tags()["scalars"]) | set(plugin_tags(acc, "scalars"))  # ours, and Keras's tensors
        for tag in tags:
            name = tag.removeprefix(schema.KERAS_EPOCH_PREFIX) if run in ("train", "validation") else tag
            figures.setdefault(name, []).append(run)
        texts = set(plugin_tags(acc, schema.TEXT_PLUGIN))
        assert not [t for t in texts if t.endswith(schema.DATA_SUFFIX)], run
    twice = {name: where for name, where in figures.items() if len(where) > 1 and name != "loss"}
    assert twice == {}
    assert sorted(figures["loss"]) == [schema.KERAS_TRAIN_RUN, schema.KERAS_VALIDATION_RUN]  # loss and val_loss
    assert schema.INPUT_WAIT_FRACTION in figures and schema.gpu_key(0, "utilization_percent") in figures
    assert schema.INPUT_VERDICT in plugin_tags(runs["input"], schema.TEXT_PLUGIN)
    assert schema.INPUT_VERDICT_DATA in plugin_tags(runs["input"], schema.DATA_PLUGIN)
    data = gather_log_dir(log_dir)  # the report still reads the JSON
    assert data.verdict is not None and data.gpus and data.profiles


@pytest.mark.multibackend
def test_summary_prints_nothing_and_the_end_of_fit_is_two_plain_lines(tmp_path, capfd):
    detector = InputBoundDetector(log_dir=str(tmp_path), window=4, sample_every=2)  # verbose=1
    fit([detector], verbose=0)
    wrapped = capfd.readouterr().out.splitlines()
    assert [line for line in wrapped if len(line) > 100 and len(line.split()) > 1] == []  # wrapped at 100
    printed: list[str] = []
    for line in wrapped:  # a continuation (its hanging indent) joined to its line
        if line.startswith(" ") and printed:
            printed[-1] += " " + line.strip()
        else:
            printed.append(line)
    assert len(printed) == 2, printed
    # the verdict and its scope (a warm-up left out reads "steady state, epoch 2"; which epochs are left out
    # depends on the machine's speed, so the test reads the scope the verdict has)
    head = printed[0].split("): ")[0]
    assert head.startswith(f"InputBoundDetector: {detector.verdict.category} (") and head.endswith(
        detector.verdict.scope
    ), printed[0]
    assert "detector.summary()" in printed[1] and printed[1].endswith(f"keras-gpu-tools report {tmp_path}")
    assert not any("|" in line or len(line) > WIDEST for line in printed)  # no Markdown table in the terminal
    text = detector.summary()
    assert capfd.readouterr().out == ""
    assert "| figure |" in text and detector.verdict.category in text
    quiet = InputBoundDetector(log_dir=None, window=4, sample_every=2, verbose=0)
    fit([quiet], verbose=0)
    quiet.summary()
    assert capfd.readouterr().out == ""


# A fresh process with TensorFlow's native logging on (the suite's conftest turns it down): the
# profiler's lines from our start and stop must reach the logger, not descriptor 2 (the terminal).
NATIVE_SCRIPT = """
import logging, sys
import numpy as np, keras
from keras_gpu_tools import ProfilerWindow
handler = logging.FileHandler(sys.argv[2])
logging.getLogger("keras_gpu_tools").addHandler(handler)
logging.getLogger("keras_gpu_tools").setLevel(logging.DEBUG)
x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile("sgd", "mse")
profiler = ProfilerWindow(log_dir=sys.argv[1], start_step=2, num_steps=2, verbose=0, analyze=False)
model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[profiler])
assert len(profiler.captures) == 1 and profiler.captures[0].files, profiler.captures
sys.stderr.write("stderr is the terminal's again\\n")
"""


@pytest.mark.slow
def test_the_profilers_native_log_lines_never_reach_the_terminal(tmp_path, capfd):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's profiler writes the native log lines")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="0")
    log = tmp_path / "keras_gpu_tools.log"
    args = [sys.executable, "-c", NATIVE_SCRIPT, str(tmp_path / "logs"), str(log)]
    proc = subprocess.run(args, env=env, timeout=300)  # its descriptors are this test's: capfd reads them
    out = capfd.readouterr()
    assert proc.returncode == 0, out.err[-3000:]
    native = [line for line in out.err.splitlines() if NATIVE_LINE.match(line.encode())]
    # TensorFlow's import logs lines of its own; those of the profiler's start and stop must not be there.
    assert [line for line in native if re.search("profil|session_manager|xplane", line, re.I)] == []
    assert "Profiler session initializing" in log.read_text()  # written by TensorFlow, kept for the logger
    assert out.err.endswith("stderr is the terminal's again\n")
