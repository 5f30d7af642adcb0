"""ProfilerWindow end to end: real fits, real profiler traces, read back with xprof."""

import glob
import json
import os
import sys
import time

import keras
import pytest

from keras_gpu_tools import backends
from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
from keras_gpu_tools.errors import ProfilerWarning
from keras_gpu_tools.input.categories import classify
from keras_gpu_tools.input.xprof import read_conclusion
from keras_gpu_tools.runtime.session import session_of
from tests.helpers.callbacks import InterruptAt
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_live import wait_until

pytestmark = pytest.mark.multibackend

BACKEND = keras.backend.backend()
JAX_UNAVAILABLE = BACKEND == "jax" and sys.version_info < (3, 12)
needs_profiler = pytest.mark.skipif(JAX_UNAVAILABLE, reason="Keras disables JAX profiling on Python < 3.12")
tf_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="xprof analysis of TensorFlow traces")


def fit(model, cb, steps=12, epochs=1, extra=()):
    x, y = regression_data(steps * 8)
    return model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False, callbacks=[cb, *extra])


def step_names(capture):
    """The profiled steps as recorded in the trace file."""
    if BACKEND == "torch":
        events = json.load(open(capture.files[0]))["traceEvents"]
        return sorted(
            {int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        )
    from keras_gpu_tools.profiling.trace import analyze_input_pipeline

    rows = analyze_input_pipeline(capture.files).step_rows
    return sorted(int(str(r["step"]).split()[-1]) for r in rows)


@needs_profiler
def test_window_is_captured_with_exactly_its_steps(tmp_path):
    cb = ProfilerWindow(log_dir=tmp_path, start_step=3, num_steps=4, verbose=0)
    fit(tiny_dense_model(), cb)
    cb.wait_for_analysis()
    assert len(cb.captures) == 1
    cap = cb.captures[0]
    assert (cap.start_step, cap.num_steps, cap.reason) == (3, 4, "scheduled")
    pattern = "*.pt.trace.json" if BACKEND == "torch" else "*.xplane.pb"
    on_disk = glob.glob(os.path.join(str(tmp_path), "profile", "plugins", "profile", "*", pattern))
    assert on_disk == cap.files and cap.size_bytes == os.path.getsize(on_disk[0]) > 0
    assert step_names(cap) == [3, 4, 5, 6]
    assert cap.mean_step_ms > 0


@needs_profiler
def test_two_windows_and_one_across_an_epoch_boundary(tmp_path):
    cb = ProfilerWindow(log_dir=tmp_path, windows=[(1, 2), (4, 3)], verbose=0)
    fit(tiny_dense_model(), cb, steps=5, epochs=2)  # steps 0-4 in epoch 0, 5-9 in epoch 1
    assert [(c.start_step, c.num_steps) for c in cb.captures] == [(1, 2), (4, 3)]
    assert step_names(cb.captures[0]) == [1, 2]
    assert step_names(cb.captures[1]) == [4, 5, 6]


@needs_profiler
def test_window_reached_in_a_second_fit_and_one_never_reached(tmp_path, capsys):
    cb = ProfilerWindow(log_dir=tmp_path, windows=[(7, 2), (100, 2)], verbose=1)
    model = tiny_dense_model()
    fit(model, cb, steps=5)
    assert not cb.captures
    assert "steps 8-9 were not captured: training ended at step 5" in capsys.readouterr().out
    fit(model, cb, steps=5)
    assert [(c.start_step, c.num_steps) for c in cb.captures] == [(7, 2)]
    assert step_names(cb.captures[0]) == [7, 8]
    assert "steps 101-102 were not captured: training ended at step 10" in capsys.readouterr().out


@needs_profiler
def test_every_n_steps_and_trigger(tmp_path):
    cb = ProfilerWindow(log_dir=tmp_path, start_step=2, num_steps=2, every_n_steps=5, verbose=0)
    fit(tiny_dense_model(), cb, steps=12)
    assert [c.start_step for c in cb.captures] == [2, 7]

    class TriggerAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                manual.trigger(3)

    manual = ProfilerWindow(log_dir=tmp_path / "manual", start_step=1000, verbose=0)
    fit(tiny_dense_model(), manual, steps=12, extra=[TriggerAt()])
    assert [(c.start_step, c.num_steps, c.reason) for c in manual.captures] == [(5, 3, "triggered")]


@needs_profiler
def test_every_n_epochs(tmp_path):
    cb = ProfilerWindow(log_dir=tmp_path, start_step=1, num_steps=2, every_n_epochs=2, verbose=0)
    fit(tiny_dense_model(), cb, steps=4, epochs=3)
    assert [c.start_step for c in cb.captures] == [1, 9]  # epochs 0 and 2


class RaiseAt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise RuntimeError("user callback failed")


def profiler_can_start_again(tmp_path):
    from keras_gpu_tools.profiling import trace as prof

    backend = backends.get(BACKEND).profiler()
    backend.start(str(tmp_path / "again"), prof.TracerOptions())
    backend.stop()
    return True


@needs_profiler
def test_fit_that_raises_inside_a_window_stops_the_profiler(tmp_path):
    cb = ProfilerWindow(log_dir=tmp_path, start_step=2, num_steps=6, verbose=0)
    model = tiny_dense_model()
    with pytest.raises(RuntimeError, match="user callback failed"):
        fit(model, cb, extra=[RaiseAt(4)])
    if BACKEND == "torch" and sys.version_info < (3, 12):
        # torch's profiler stops only on the thread that started it: without
        # sys.monitoring the cleanup waits for the next fit() or close().
        time.sleep(0.5)
        assert not cb.captures
        cb.close()
    # stopping the profiler and writing the trace may take a while on a loaded machine: a generous deadline
    assert wait_until(lambda: cb.captures, timeout=60)
    assert cb.captures[0].reason == "cut short"
    assert profiler_can_start_again(tmp_path)
    assert not hasattr(model.train_function or (lambda: 0), "_keras_gpu_tools_step_hook")


@tf_only
def test_busy_profiler_is_left_alone(tmp_path):
    import tensorflow as tf

    tf.profiler.experimental.start(str(tmp_path / "mine"))
    try:
        cb = ProfilerWindow(log_dir=tmp_path, start_step=1, num_steps=2, verbose=0)
        with pytest.warns(ProfilerWarning, match="another profiler session is already running"):
            history = fit(tiny_dense_model(), cb)
        assert not cb.captures and len(history.history["loss"]) == 1
    finally:
        tf.profiler.experimental.stop()  # ours is still running: ProfilerWindow did not stop it


@tf_only
def test_slow_input_pipeline_is_reported_input_bound(tmp_path):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = regression_data(12 * 8)

    def slow(a, b):
        def sleep(a):
            time.sleep(0.02)
            return a

        a = tf.numpy_function(sleep, [a], tf.float32)
        a.set_shape([None, 8])
        return a, b

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).map(slow)
    cb = ProfilerWindow(log_dir=tmp_path, start_step=3, num_steps=5, verbose=0)
    tiny_dense_model().fit(ds, epochs=1, verbose=0, callbacks=[cb])
    cb.wait_for_analysis()
    analysis = cb.captures[0].analysis
    assert len(analysis.step_rows) == 5
    assert "No step time measured" not in analysis.conclusion
    # xprof's category comes from the shares this machine measured (its load moves them): the real trace is
    # checked for structure, a conclusion in the category of its own figure, and the same sentence in TensorBoard.
    x = read_conclusion(analysis.conclusion)
    assert x.word and 0.0 <= x.figure <= 1.0, analysis.conclusion
    if x.word != "POTENTIALLY":  # xprof's thresholds, 5% and 20%, are the detector's defaults
        assert x.category == classify(x.figure), analysis.conclusion
    acc = EventAccumulator(str(tmp_path / "profile"))
    acc.Reload()
    texts = {tag: tf.make_ndarray(acc.Tensors(tag)[0].tensor_proto).item().decode() for tag in acc.Tags()["tensors"]}
    assert f"{x.word} input-bound" in texts["profile/steps_4_8/input_pipeline"]
    assert analysis.conclusion.split(" because ")[0] in texts["profile/steps_4_8/input_pipeline"]
    assert "steps 4-8 (scheduled)" in texts["profile/steps_4_8"]


# A line as xprof's converter writes it from C++ to descriptor 2, dozens a window on a GPU trace.
XPROF_LINE = b"I0000 00:00:1764331200.123456    4242 xplane_to_op_stats.cc:218] Processing device plane /device:GPU:0\n"


@tf_only
@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_xprofs_native_log_lines_stay_out_of_the_terminal_unless_verbose_2(tmp_path, capfd, monkeypatch, verbose):
    from xprof.convert import raw_to_tool_data

    convert = raw_to_tool_data.xspace_to_tool_data

    def logging_convert(*args, **kwargs):  # the real conversion, with the native line its C++ logs
        os.write(2, XPROF_LINE)
        return convert(*args, **kwargs)

    monkeypatch.setattr(raw_to_tool_data, "xspace_to_tool_data", logging_convert)
    cb = ProfilerWindow(log_dir=tmp_path, start_step=3, num_steps=4, verbose=verbose, layers=False)
    fit(tiny_dense_model(), cb)
    cb.wait_for_analysis()
    assert len(cb.captures[0].analysis.step_rows) == 4  # converted in the background, as ever
    err = capfd.readouterr().err
    native = [line for line in err.splitlines() if line.startswith(("I0000", "W0000"))]
    if verbose == 2:
        assert XPROF_LINE.decode().strip() in native
    else:
        assert not native and "xplane_to_op_stats" not in err, err


def test_jax_on_old_python_says_it_cannot_profile(tmp_path):
    if not JAX_UNAVAILABLE:
        pytest.skip("only where JAX profiling is unavailable")
    cb = ProfilerWindow(log_dir=tmp_path, start_step=1, num_steps=2, verbose=0)
    with pytest.warns(ProfilerWarning, match="Python < 3.12"):
        history = fit(tiny_dense_model(), cb)
    assert not cb.captures and len(history.history["loss"]) == 1


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"num_steps": 0}, "num_steps=0"),
        ({"start_step": -1}, "start_step=-1"),
        ({"windows": [(0, 5), (3, 2)]}, "overlap"),
        ({"windows": [(0, 0)]}, "num_steps=0"),
        ({"windows": []}, "windows=[]"),
        ({"every_n_steps": 2, "num_steps": 5}, "every_n_steps=2"),
        ({"every_n_epochs": 0}, "every_n_epochs=0"),
        ({"windows": [(0, 1)], "every_n_steps": 5}, "at most one"),
        ({"host_tracer_level": 7}, "host_tracer_level=7"),
        ({"log_dir": None}, "log_dir=None"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, fragment, tmp_path):
    kwargs.setdefault("log_dir", tmp_path)
    with pytest.raises(ValueError) as info:
        ProfilerWindow(**kwargs)
    assert fragment in str(info.value)


def test_unwritable_log_dir(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="log_dir"):
        ProfilerWindow(log_dir=blocker / "sub")


def profiler_is_running() -> bool:
    if BACKEND == "torch":
        import torch

        return bool(torch.autograd.profiler._is_profiler_enabled)
    try:
        return not profiler_can_start_again_quietly()
    except Exception:
        return True


def profiler_can_start_again_quietly() -> bool:
    import tempfile

    from keras_gpu_tools.profiling import trace as prof

    session = backends.get(BACKEND).profiler()
    try:
        session.start(tempfile.mkdtemp(), prof.TracerOptions())
    except prof.ProfilerBusy:
        return False
    session.stop()
    return True


@needs_profiler
def test_a_plain_fit_after_an_interrupted_window_is_untouched(tmp_path, monkeypatch):
    """Defect 1: after a KeyboardInterrupt from a callback mid-window, a plain fit() on the same
    model ran through the dead hook (counted, captured, crashed). It must be untouched, also when
    the exception is kept alive (as IPython keeps the last traceback) and before any watchdog ran."""
    from keras_gpu_tools import InputBoundDetector
    from keras_gpu_tools.runtime.session import FitSession

    monkeypatch.setattr(FitSession, "interval", 60.0)  # the watchdog must not be what saves us
    kept = []
    for attempt in range(5):
        model = tiny_dense_model()
        window = ProfilerWindow(log_dir=tmp_path / str(attempt), start_step=2, num_steps=50, verbose=0)
        detector = InputBoundDetector(log_dir=None, verbose=0)
        try:
            fit(model, window, steps=12, extra=[detector, InterruptAt(4)])
        except KeyboardInterrupt as e:
            kept.append(e)  # keeps the dead fit's frames alive
        steps_counted = detector._global_step
        model.fit(*regression_data(30 * 8), batch_size=8, verbose=0)  # no callbacks
        assert detector._global_step == steps_counted
        assert not hasattr(model.train_function, "_keras_gpu_tools_step_hook")
        assert [c.reason for c in window.captures] == ["cut short"]
        assert window.captures[0].num_steps == 3  # steps 2, 3 and 4: what the trace holds
        assert not profiler_is_running()


@needs_profiler
def test_a_schedule_beyond_the_end_of_training_is_not_silent(tmp_path):
    """Defect 6: a start_step or every_n_steps past the end said nothing."""
    for kwargs, first in (({"start_step": 50}, 50), ({"start_step": 2, "every_n_steps": 40, "num_steps": 2}, 2)):
        cb = ProfilerWindow(log_dir=tmp_path, verbose=0, **kwargs)
        steps = 12 if first == 50 else 1
        with pytest.warns(ProfilerWarning, match=r"no window was reached in this fit\(\) \((steps 1-\d+|step 1)\)"):
            fit(tiny_dense_model(), cb, steps=steps)
        assert not cb.captures


@pytest.mark.skipif(BACKEND != "torch", reason="torch's profiler is the one that can only stop on its own thread")
def test_torch_profiler_stops_at_the_next_fit_after_a_failed_one(tmp_path, monkeypatch):
    """Defect 8: after a fit that raised mid-window, torch's profiler ran on through later fits
    (+32 MiB per 300 steps, a trace labelled with the wrong steps)."""
    model = tiny_dense_model()
    cb = ProfilerWindow(log_dir=tmp_path, start_step=1, num_steps=100, verbose=0)
    with pytest.raises(KeyboardInterrupt):
        fit(model, cb, steps=12, extra=[InterruptAt(3)])
    # the watchdog notices (it closes the fit's session); it may not stop torch's profiler from its thread
    assert wait_until(lambda: session_of(model) is None, timeout=60)
    model.fit(*regression_data(30 * 8), batch_size=8, verbose=0)  # a plain fit: its first step stops it
    assert not profiler_is_running()
    assert [(c.start_step, c.num_steps) for c in cb.captures] == [(1, 3)]
    assert step_names(cb.captures[0]) == [1, 2, 3]
    assert cb.captures[0].files[0].split(os.sep)[-2].endswith("steps_2_4")
