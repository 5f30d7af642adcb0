"""One fit, one figure: every view of InputBoundDetector gives the same step time, samples/s and wait share.

A real fit() of 1,000 samples at batch 64 (16 steps an epoch, the last of 40
samples) on a fake clock (tests.helpers.timing_input): each batch taken costs
FETCH seconds and each step COMPUTE, so the epoch's time is known and the figures
are exact. History, the TensorBoard events, summary(), the verdict, the step
breakdown and the report of the log directory must agree, and samples/s must be
the samples trained over the seconds they took (the partial batch counted).
"""

import re

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.live_view import LiveView
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import find_runs, read_run
from keras_gpu_tools.reporting.report import report
from tests.helpers.timing_input import install

SAMPLES, BATCH, EPOCHS = 1000, 64, 3
STEPS = -(-SAMPLES // BATCH)  # 16: the last batch holds 40 samples
FETCH, COMPUTE = 0.001, 0.004


class EpochSeconds(keras.callbacks.Callback):
    """Each epoch's seconds on the fit's clock, from its begin to its end."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.seconds = clock, []

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = self.clock()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(self.clock() - self.t0)


def _same(a, b, rel=0.01):
    return a == pytest.approx(b, rel=rel)


def _scalar(acc, tag, i):
    """The ``i``-th value of ``tag`` as TensorBoard reads it (a scalar event or a scalar tensor)."""
    if tag in acc.Tags().get("scalars", []):
        return acc.Scalars(tag)[i].value
    from tensorboard.util import tensor_util

    return float(tensor_util.make_ndarray(acc.Tensors(tag)[i].tensor_proto))


def _events(log_dir, run):
    """The detector's scalars as the package's reader reads them back: tag -> values in written order."""
    ((name, directory, files),) = [r for r in find_runs(str(log_dir)) if r[0] == run]
    values = read_run(name, directory, files, [])
    return {tag: list(series.values) for tag, series in values.scalars.items()}


@pytest.mark.multibackend
def test_every_view_gives_one_step_time_rate_and_wait_share(tmp_path, monkeypatch):
    fake = install(monkeypatch, compute=COMPUTE, fetch=lambda k: FETCH)
    rng = np.random.default_rng(0)
    x, y = rng.random((SAMPLES, 8), dtype="float32"), rng.random((SAMPLES, 1), dtype="float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    det = InputBoundDetector(log_dir=tmp_path, verbose=0)
    timer = EpochSeconds(fake.clock)
    pictures: list[str] = []
    live = LiveView(interval=3600.0, display=pictures.append)  # one picture: the fit's end
    callbacks = [det, timer, live]
    h = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks).history

    # History: one step time (input/ and step/), steps/s its inverse, samples/s the samples over the seconds.
    for e in range(1, EPOCHS):  # the first epoch's compilation costs nothing on this clock, but is left out
        step_ms = h[schema.INPUT_STEP_MS][e]
        assert _same(h[schema.STEP_STEP_MS][e], step_ms, rel=1e-9)
        assert _same(h[schema.STEPS_PER_SEC][e], 1e3 / step_ms, rel=1e-9)
        assert _same(h[schema.SAMPLES_PER_SEC][e], SAMPLES / timer.seconds[e])
        assert _same(h[schema.SAMPLES_PER_SEC][e], SAMPLES / (STEPS * step_ms / 1e3))
        assert _same(h[schema.STEP_INPUT_MS][e], h[schema.INPUT_WAIT_MS][e], rel=1e-9)
        assert "input/fetch_ms" not in h  # one series per figure
    m = det.measurement
    assert _same(m.step * 1e3, h[schema.INPUT_STEP_MS][-1]) and _same(m.steps_per_sec, 1 / m.step, rel=1e-9)
    assert _same(m.samples_per_sec, SAMPLES / timer.seconds[-1])
    assert _same(m.wait_fraction, h[schema.INPUT_WAIT_FRACTION][-1])

    # TensorBoard: the run's scalars, one point per epoch (a window of 100 steps closes with its epoch).
    ev = _events(tmp_path, "input")
    for tag in (schema.INPUT_STEP_MS, schema.STEP_STEP_MS, schema.SAMPLES_PER_SEC, schema.INPUT_WAIT_FRACTION):
        assert len(ev[tag]) == EPOCHS and all(_same(a, b) for a, b in zip(ev[tag], h[tag])), tag
    assert "input/fetch_ms" not in ev  # written by earlier versions only: the fetch is in the summary's table
    # ... and as TensorBoard's own reader reads them.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "input"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for tag in (schema.INPUT_STEP_MS, schema.SAMPLES_PER_SEC, schema.INPUT_WAIT_FRACTION):
        tb = [_scalar(acc, tag, i) for i in range(EPOCHS)]
        assert all(_same(a, b) for a, b in zip(tb, h[tag])), tag

    # summary(), the verdict's sentence and the step breakdown: the steady state's figures, alike.
    text = det.summary()
    step = float(re.search(r"of a ([0-9.]+) ms step\)", text).group(1))
    table = dict(re.findall(r"^\| (step|steps/s|samples/s) \| ([0-9.]+)", text, re.M))
    assert _same(step, m.step * 1e3) and _same(float(table["step"]), step)
    assert _same(float(table["steps/s"]), 1e3 / step) and _same(float(table["samples/s"]), m.samples_per_sec)
    assert _same(det.breakdown.step * 1e3, step)
    assert re.search(rf"^\| step \| {step:.2f} ms \| 100% \|$", text, re.M), text

    # The report of the log directory reads the same figures.
    data = report(str(tmp_path)).data
    assert all(_same(a, b) for a, b in zip(data.split[schema.INPUT_STEP_MS], h[schema.INPUT_STEP_MS]))
    assert _same(data.throughput[schema.SAMPLES_PER_SEC], m.samples_per_sec)
    assert _same(data.throughput[schema.STEPS_PER_SEC], m.steps_per_sec)
    assert _same(data.breakdown["step"] * 1e3, step)
    assert f"of a {step:.2f} ms step" in data.verdict["message"]
    page = report(str(tmp_path)).html()
    assert f"of a {step:.2f} ms step" in page

    # LiveView's last picture: the last epoch's step time and samples/s, as History has them.
    last = pictures[-1]
    assert f"{h[schema.INPUT_STEP_MS][-1]:.2f} ms" in last and "step time (last epoch)" in last
    assert f"{h[schema.SAMPLES_PER_SEC][-1]:,.0f}" in last
