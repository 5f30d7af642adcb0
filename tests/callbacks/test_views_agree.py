"""One fit, one figure per span: the detector, ProfilerWindow, LiveView, the report and TensorBoard agree.

Real fits on TensorFlow with a slow input (a Python generator that sleeps per
batch; a tf.data map that sleeps, beside a slow callback), the three callbacks
attached, ProfilerWindow's trace converted by xprof. For the steps
ProfilerWindow traced (steps 21-25) every view shows the same input-wait figure
and category, naming the span; where xprof concludes otherwise, the sentence
saying why is there; the run's verdict is the detector's, named by its span,
and every view that shows it shows it alike.
"""

import html
import time

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow
from keras_gpu_tools.input import categories, xprof
from keras_gpu_tools.input.span import SpanFigure
from keras_gpu_tools.live.drawer import Drawer
from keras_gpu_tools.reporting.report import report
from tests.helpers.xprof import tensorflow_with_xprof

SPAN = "steps 21-25"  # ProfilerWindow(start_step=20, num_steps=5): the 21st to the 25th step


@pytest.fixture
def tf(backend):
    return tensorflow_with_xprof(backend, "xprof converts the TensorFlow trace here")


def sleepy_batches(seconds, batch=16, features=8):
    """A Python generator that sleeps ``seconds`` before each batch: input the step waits for."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 8, features)).astype("float32")
    y = rng.normal(size=(batch * 8, 1)).astype("float32")
    while True:
        for i in range(0, len(x), batch):
            time.sleep(seconds)
            yield x[i : i + batch], y[i : i + batch]


def texts_of(tf, run_dir):
    """The last text written of every tag of a TensorBoard run, as TensorBoard reads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    last = {t: max(acc.Tensors(t), key=lambda e: e.wall_time) for t in acc.Tags()["tensors"]}
    return {t: tf.make_ndarray(e.tensor_proto).item().decode() for t, e in last.items()}


def _no_drawing_thread(self, every):
    raise RuntimeError("drawn on the training thread in this test")


def fit_with_every_view(tmp_path, monkeypatch, data, **thresholds):
    """A fit of 2 epochs of 15 steps with the detector (``thresholds``), ProfilerWindow (steps 21-25) and LiveView."""
    # LiveView draws on the training thread (its fallback without a session thread): a picture after every
    # step (each sleeps longer than the interval), not whenever a loaded machine schedules the drawing thread.
    monkeypatch.setattr(Drawer, "start", _no_drawing_thread)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    shown: list[str] = []
    # Windows of 5 steps from each epoch's start, each with a synced step: one of them is steps 21-25.
    det = InputBoundDetector(log_dir=tmp_path, window=5, sample_every=5, verbose=0, **thresholds)
    prof = ProfilerWindow(log_dir=tmp_path, start_step=20, num_steps=5, verbose=1)
    view = LiveView(interval=1e-3, display=shown.append)  # redrawn after every step
    model.fit(data, steps_per_epoch=15, epochs=2, verbose=0, callbacks=[det, prof, view])
    prof.wait_for_analysis()
    return det, prof, shown


def assert_every_view_agrees(tf, tmp_path, det, prof, shown, printed):
    """The same figure for steps 21-25 in every view, xprof's beside it (why, where it differs); one run verdict."""
    # The detector's window and ProfilerWindow's: the same steps, so the same figure and category.
    (window,) = [v for _, v in det.window_verdicts if v.scope == SPAN]
    cap = prof.captures[0]
    assert cap.input is not None and cap.input.span == SPAN
    assert cap.input.wait_fraction == window.wait_fraction is not None
    assert cap.input.category == window.category
    fig = window.figure()
    assert fig.text().endswith(f"), {SPAN}") and fig.category != "unknown"

    # ProfilerWindow's line, its TensorBoard text and LiveView name the span and give that figure.
    line = next(ln for ln in printed.splitlines() if ln.startswith(f"ProfilerWindow: {fig.text()}, this window only"))
    profile_texts = texts_of(tf, tmp_path / "profile")
    assert profile_texts["profile/steps_21_25/input_pipeline"].startswith(line)
    assert any(f"input wait, {SPAN}" in h and html.escape(fig.short()) in h for h in shown)

    # xprof: its conclusion is beside ours, and where it differs the one sentence says why.
    x = xprof.read_conclusion(cap.analysis.conclusion, cap.analysis.input_percent, cap.analysis.step_time_ms)
    assert x.word, cap.analysis
    thresholds = (det.moderate_threshold, det.high_threshold)
    why = xprof.reason(SpanFigure(fig.span, fig.wait_fraction, fig.category, 0, cap.input.step_ms, thresholds), x)
    assert cap.input.reason == why
    # Our lines are wrapped at the terminal's width, where the figure's own length puts the break.
    flat = " ".join(printed.split())
    if xprof.differs(fig, x):
        assert why and f"xprof differs: {why}" in flat
        assert why in profile_texts["profile/steps_21_25/input_pipeline"]
    else:
        assert f"ProfilerWindow: {fig.text()}, this window only; xprof agrees: " in flat

    # The run's verdict is one: the detector's, named by its span, alike in its summary, LiveView and the report.
    run = det.verdict.figure()
    assert det.summary().startswith(f"InputBoundDetector: {run.category} ({run.span})")
    assert f"over {run.span}." in det.verdict.message
    assert f"run verdict ({html.escape(run.span)})" in shown[-1] and html.escape(run.short()) in shown[-1]
    verdict_text = texts_of(tf, tmp_path / "input")["input/verdict"]
    assert verdict_text.startswith(f"InputBoundDetector: {run.category} ({run.span})")
    for r in (report(det, prof), report(str(tmp_path))):
        text = r.text()
        assert f"Verdict: {run.category} ({run.span})" in text
        (p,) = r.data.profiles
        assert (p["span"], p["input_wait_fraction"], p["input_category"]) == (SPAN, fig.wait_fraction, fig.category)
        assert f"{SPAN} (scheduled): " in text
        assert f"  input wait: {fig.short()}, this window only; the run's verdict: {run.category} ({run.span})" in text
        assert (f"  why xprof differs: {why}" in text) == bool(why)
    return fig, x, why


def test_every_view_gives_the_same_figure_for_the_same_steps(tf, tmp_path, capsys, monkeypatch):
    det, prof, shown = fit_with_every_view(tmp_path, monkeypatch, sleepy_batches(0.004))
    assert_every_view_agrees(tf, tmp_path, det, prof, shown, capsys.readouterr().out)


def test_where_xprof_differs_both_are_shown_with_why(tf, tmp_path, capsys, monkeypatch):
    # Thresholds of the user's (a step is highly input-bound from 95% waiting): the generator's wait,
    # most of each step by both measures, is moderately input-bound to the detector, HIGHLY to xprof.
    det, prof, shown = fit_with_every_view(
        tmp_path, monkeypatch, sleepy_batches(0.004), moderate_threshold=0.05, high_threshold=0.95
    )
    fig, x, why = assert_every_view_agrees(tf, tmp_path, det, prof, shown, capsys.readouterr().out)
    # The real fit: the detector's category is its figure's by the user's thresholds (which category the
    # measured share falls in depends on the machine's load; every view showing the "why" is checked above).
    assert fig.category == categories.classify(fig.wait_fraction, 0.05, 0.95), fig
    # The decision on fixed figures: 80% waiting is moderate by the user's thresholds, HIGHLY by xprof's.
    ours = SpanFigure(SPAN, 0.80, categories.classify(0.80, 0.05, 0.95), 0, 5.0, (0.05, 0.95))
    sentence = "Your program is HIGHLY input-bound because 80.0% of the total step time sampled is waiting for input"
    fixed = xprof.read_conclusion(sentence, 80.0, 5.0)
    assert (ours.category, fixed.word) == ("moderately input-bound", "HIGHLY") and xprof.differs(ours, fixed)
    fixed_why = xprof.reason(ours, fixed)
    assert fixed_why.startswith("by xprof's thresholds (5%, 20%) our ")
    assert "the detector's thresholds (5%, 95%)" in fixed_why
