"""How the report writes what it shows: windows over their real steps, numbers, code in prose."""

import re

import pytest

from keras_gpu_tools.input.advice import advise
from keras_gpu_tools.input.categories import HIGH
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Verdict
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.mixed_precision.check import MixedPrecisionFinding
from keras_gpu_tools.reporting.figures import draw
from keras_gpu_tools.reporting.markup import prose
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.report import report
from keras_gpu_tools.reporting.sections.step_time import BARS_AT_MOST
from keras_gpu_tools.runtime.units import format_metric, format_number, format_rate

pytest.importorskip("matplotlib")

# The detector's windows: uneven, one of 22 steps, and the one ending at 423 with no split measured.
ENDS = [140, 282, 401, 423, 564, 705]
# The first window starts at step 10, where its count says; the third counts a step less than
# the steps since the second (a step counted outside any window): it still starts at 282.
STEPS = [130, 142, 118, 22, 141, 141]
SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")


def _write_run(log_dir):
    """A log dir as the callbacks write it: windows, their figures, the verdict with real advice, a finding."""
    w = EventWriter(str(log_dir / "input"))
    for i, (end, n) in enumerate(zip(ENDS, STEPS)):
        values = {schema.INPUT_STEPS: float(n), schema.INPUT_WAIT_FRACTION: 0.6}
        if end != 423:
            values |= {
                schema.INPUT_WAIT_MS: 2.5 + 0.1 * i,
                schema.INPUT_COMPUTE_MS: 0.25,
                schema.INPUT_OTHER_MS: 0.125,
                schema.INPUT_STEP_MS: 2.875 + 0.1 * i,
            }
        values |= {schema.SAMPLES_PER_SEC: 38650.3 + i, schema.STEPS_PER_SEC: 301.95, schema.MFU: 0.41234}
        w.scalars(values, step=end)
    m = Measurement(
        steps=565,
        step=0.0029,
        wait=0.0026,
        compute=0.00025,
        other=0.000125,
        wait_fraction=0.934,
        samples_per_sec=38650.3,
        steps_per_sec=301.95,
        flops_per_sec=3.2e13,
    )
    advice = advise(HIGH, m, {"kind": "tf.data", "ops": ["map"], "sequential_map": True}, {"cpu_count": 2})
    assert any("`" in a for a in advice)  # the detector's advice marks code as Markdown does
    verdict = Verdict(HIGH, 0.934, "Waiting for `next(iterator)` takes 93.4% of each step.", ["SM `idle`."], advice)
    w.text(schema.INPUT_VERDICT, "Input: highly input-bound", step=705)
    w.json(schema.INPUT_VERDICT_DATA, {"scope": "fit", "verdict": verdict, "figures": m.logs()}, step=705)
    w.close()
    gpu = EventWriter(str(log_dir / "gpu"))
    for i in range(3):
        gpu.scalars(
            {"gpu/0/memory_used_mib": 81559.0 + i, "gpu/0/utilization_percent": 93.4}, step=i, wall_time=5.0 + i
        )
    gpu.close()
    rep = EventWriter(str(log_dir / "report"))
    finding = MixedPrecisionFinding("output_dtype", "Output `dense_1` is float16: pass `dtype='float32'`.", "dense_1")
    rep.json(schema.MIXED_PRECISION_FINDINGS_DATA, [finding], step=0)
    rep.close()
    train = EventWriter(str(log_dir / schema.KERAS_TRAIN_RUN))
    for epoch, loss in enumerate([2.5e-5, 1.25e-6]):
        train.scalars({"epoch_loss": loss}, step=epoch)
    train.close()
    return advice


def test_each_window_is_drawn_over_the_steps_it_covered(tmp_path):
    _write_run(tmp_path)
    r = report(str(tmp_path))
    (ax,) = r.figures()["step_time"].axes
    spans = [(10.0, 140.0), (140.0, 282.0), (282.0, 401.0), (401.0, 423.0), (423.0, 564.0), (564.0, 705.0)]
    bars = [(bar.get_x(), bar.get_x() + bar.get_width()) for bar in ax.patches]
    assert len(bars) == 3 * len(ENDS)  # wait, compute, other: a bar each per window
    for part in range(3):
        assert bars[part * len(ENDS) : (part + 1) * len(ENDS)] == spans
    assert [b.get_height() for b in ax.patches[: len(ENDS)]] == pytest.approx([2.5, 2.6, 2.7, 0.0, 2.9, 3.0])
    # The window whose split was not measured says so, in the middle of its own steps.
    (na,) = [t for t in ax.texts if t.get_text() == "n/a"]
    assert na.get_position()[0] == pytest.approx(412.0)
    assert ax.get_xlim() == pytest.approx((10.0, 705.0))


def test_many_windows_leave_gaps_and_unmeasured_windows_blank(tmp_path):
    w = EventWriter(str(tmp_path / "input"))
    n = BARS_AT_MOST + 10
    for i in range(n):
        end = 10 * (i + 1)
        if i == 30:  # never written: a gap over (300, 310]
            continue
        values = {schema.INPUT_STEPS: 10.0, schema.INPUT_WAIT_FRACTION: 0.5}
        if i != 40:  # (400, 410]: written, but its split was not measured
            values |= {schema.INPUT_WAIT_MS: 1.0, schema.INPUT_COMPUTE_MS: 2.0, schema.INPUT_OTHER_MS: 0.5}
        w.scalars(values, step=end)
    w.close()
    (ax,) = report(str(tmp_path)).figures()["step_time"].axes
    assert not ax.patches and len(ax.collections) == 3
    title = ax.get_title(loc="left")
    assert f"{n - 1} windows, 1 not measured" in title
    for part in ax.collections:
        extents = sorted((min(p.vertices[:, 0]), max(p.vertices[:, 0])) for p in part.get_paths())
        assert extents == [(0.0, 300.0), (310.0, 400.0), (410.0, 10.0 * n)]


def test_epochs_are_drawn_one_bar_each_labelled_at_its_middle():
    data = ReportData(split_axis="epoch", split_x=[1.0, 2.0, 3.0])
    data.split = {
        schema.INPUT_WAIT_MS: [3.0, None, 2.0],
        schema.INPUT_COMPUTE_MS: [1.0, None, 1.5],
        schema.INPUT_OTHER_MS: [0.5, None, 0.25],
    }
    (ax,) = draw(data)["step_time"].axes
    assert [(b.get_x(), b.get_x() + b.get_width()) for b in ax.patches[:3]] == [(0, 1), (1, 2), (2, 3)]
    assert list(ax.get_xticks()) == [0.5, 1.5, 2.5]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3"]
    assert [(t.get_text(), t.get_position()[0]) for t in ax.texts] == [("n/a", 1.5)]
    assert ax.get_xlabel() == "epoch"


def test_the_report_writes_numbers_plainly_and_code_as_code(tmp_path):
    advice = _write_run(tmp_path)
    r = report(str(tmp_path))
    text = r.text()
    page = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]*", "", r.html(full_page=True))
    for what in (text, page):
        assert not SCIENTIFIC.search(what), SCIENTIFIC.search(what)
        assert "38,650 samples/s" in what and "301.9 steps/s" in what and "41.2%" in what
    assert "throughput/samples_per_sec: 38,650 samples/s" in text and "loss: 0.000025, 0.00000125" in text
    assert "<td>throughput/flops_per_sec</td><td>32.00 TFLOP/s</td>" in page
    assert "81,559.0" in text and "81,559.0" in page  # the series table: thousands separated
    # Code spans: <code> in the page (escaped), never a raw backtick; the text keeps them as written.
    assert "`" not in page
    assert "<code>next(iterator)</code>" in page and "<code>dtype=&#x27;float32&#x27;</code>" in page
    assert "<code>num_parallel_calls=tf.data.AUTOTUNE</code>" in page
    assert "<code>.prefetch(tf.data.AUTOTUNE)</code>" in page
    assert all(a in text for a in advice) and "`next(iterator)`" in text


def test_prose_renders_code_spans_escaped():
    assert prose("a <b> & `x<y>` then ``a`b`` and `c`") == (
        "a &lt;b&gt; &amp; <code>x&lt;y&gt;</code> then <code>a`b</code> and <code>c</code>"
    )
    assert prose("no code: 5 < 6") == "no code: 5 &lt; 6"


@pytest.mark.parametrize(
    ("value", "digits", "expected"),
    [
        (38650.3, 4, "38,650"),
        (3.865e4, 4, "38,650"),
        (0.25, 4, "0.25"),
        (93.4, 4, "93.4"),
        (0.000123456, 4, "0.0001235"),
        (1234567.8, 4, "1,234,568"),
        (9.99996, 4, "10"),
        (0.0, 4, "0"),
        (-0.00001, 4, "-0.00001"),
        (None, 4, "n/a"),
        (float("nan"), 4, "n/a"),
    ],
)
def test_format_number(value, digits, expected):
    assert format_number(value, digits) == expected


def test_format_metric_writes_the_unit_its_key_names():
    assert format_metric(schema.SAMPLES_PER_SEC, 38650.3) == "38,650 samples/s" == format_rate(38650.3, "samples")
    assert format_metric(schema.INPUT_WAIT_MS, 0.25) == "0.25 ms"
    assert format_metric(schema.INPUT_WAIT_FRACTION, 0.934) == "93.4%" == format_metric(schema.MFU, 0.934)
    assert format_metric(schema.FLOPS_PER_SEC_PER_DEVICE, 1.6e13) == "16.00 TFLOP/s per device"
    assert format_metric("gpu/0/memory_used_mib", 1536.0) == "1.5 GiB"
    assert format_metric(schema.INPUT_STEPS, 282.0) == "282"
    assert format_metric(schema.INPUT_WAIT_MS, float("inf")) == "n/a"
    assert format_number(81559.04, decimals=1) == "81,559.0"
