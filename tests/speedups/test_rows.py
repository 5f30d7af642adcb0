"""The decisions of find_speedups on fixed figures, and its report's text, Markdown and compile arguments."""

import dataclasses
import math

import pytest

from keras_gpu_tools.speedups import rows as R
from keras_gpu_tools.speedups.report import HEADER, SpeedupReport
from keras_gpu_tools.speedups.rows import SpeedupRow


def test_a_change_pays_beyond_min_gain_and_twice_the_noise():
    assert R.paid(1000.0, 0.01, 1100.0, 0.01)  # +10% against ±1.4%
    assert not R.paid(1000.0, 0.01, 1020.0, 0.0)  # +2%: under MIN_GAIN
    assert not R.paid(1000.0, 0.05, 1100.0, 0.05)  # +10% against twice ±7.1%: noise
    assert R.paid(1000.0, None, 1040.0, None)  # no uncertainty known: MIN_GAIN alone
    assert not R.paid(0.0, None, 10.0, None)


def test_decide_sets_the_status_and_unsafe_wins_over_any_speed_up():
    row = SpeedupRow("jit_compile=True", "jit_compile", before=1000.0, before_uncertainty=0.01)
    assert R.decide(row, 2000.0, 0.01).status == R.PAID
    assert R.decide(row, 1010.0, 0.01).status == R.NO_GAIN
    unsafe = R.decide(row, 3000.0, 0.01, safe=False)
    assert unsafe.status == R.UNSAFE and not unsafe.paid
    assert R.decide(row, 2000.0, 0.01).speedup == pytest.approx(2.0)


def test_a_loss_that_diverges_is_unsafe_a_close_or_lower_one_is_safe():
    safe, text = R.loss_check(0.50, 0.52, steps=8)
    assert safe and text == "loss after 8 steps 0.52 vs 0.5 (float32), +4.0%"
    assert R.loss_check(0.50, 0.30)[0]  # lower: never unsafe
    safe, text = R.loss_check(0.50, 0.70)
    assert not safe and "diverged" in text and "+40.0%" in text
    for bad in (math.nan, math.inf):
        safe, text = R.loss_check(0.50, bad)
        assert not safe and "diverged" in text


def test_a_loss_is_judged_against_what_the_baselines_steps_gained_where_the_start_is_known():
    # From 0.27 the baseline's steps reached 0.049: 0.073 is 49% above it, but 11% of the 0.221 gained (dropout
    # drawn another way), not a divergence; 0.11 (28% of the gain lost) is one.
    safe, text = R.loss_check(0.049, 0.073, initial=0.27)
    assert safe and text == "loss after 8 steps 0.073 vs 0.049 (float32), +49.0% (from 0.27)"
    safe, text = R.loss_check(0.049, 0.11, initial=0.27)
    assert not safe and text.endswith("above it by more than 25% of what its steps gained, it diverged")
    # steps that gained less than the loss itself: judged on the loss, as without a start
    assert R.loss_check(0.50, 0.70, initial=0.55) == R.loss_check(0.50, 0.70)
    assert not R.loss_check(0.049, math.nan, initial=0.27)[0]


def test_the_per_call_host_time_is_the_intercept_of_step_time_over_batch():
    # 2 ms per call plus 0.1 ms per sample
    points = [(b, 0.002 + 0.0001 * b) for b in (8, 16, 32, 64)]
    assert R.dispatch_seconds(points) == pytest.approx(0.002)
    assert R.dispatch_seconds([(8, 0.01)]) is None  # one size: no intercept
    assert R.dispatch_seconds([(8, 0.001), (16, 0.003)]) == 0.0  # proportional or steeper: none
    # 2 ms per call over a step of 2.1 ms: the rest, 0.1 ms, needs 200 steps per call to bring it under a tenth
    assert abs(R.steps_per_execution(0.002, 0.0021) - 200) <= 1  # (a ceiling over floats)
    assert R.steps_per_execution(0.0001, 0.0101) == 2  # at least 2


def _report():
    base = dict(before=1000.0, before_uncertainty=0.01)
    return SpeedupReport(
        [
            SpeedupRow(
                "baseline: the fit as given", R.BASELINE, status=R.BASELINE, after=1000.0, after_uncertainty=0.01
            ),
            SpeedupRow("input-free ceiling: one batch repeated", R.CEILING, status=R.CEILING, after=1500.0, **base),
            SpeedupRow(
                "steps_per_execution=16",
                "steps_per_execution",
                code="model.compile(..., steps_per_execution=16)",
                status=R.PAID,
                after=1400.0,
                after_uncertainty=0.02,
                compile_args={"steps_per_execution": 16},
                **base,
            ),
            SpeedupRow(
                "jit_compile=True",
                "jit_compile",
                code="model.compile(..., jit_compile=True)",
                status=R.UNSAFE,
                check="loss after 8 steps nan vs 0.5 (float32): it diverged",
                compile_args={"jit_compile": True},
                **base,
            ),
            SpeedupRow(
                "batch size 128",
                "batch_size",
                code="model.fit(x, y, batch_size=128)",
                status=R.PAID,
                after=1200.0,
                cost="scale the learning rate",
                **base,
            ),
            SpeedupRow("mixed precision", "mixed_precision", reason="no tensor cores: not measured", **base),
            SpeedupRow("combined: a + b", R.COMBINED, status=R.PAID, after=1700.0, **base),
        ],
        backend="jax",
        device="cpu",
        seconds=12.0,
    )


def test_the_report_shows_every_row_and_applies_only_compile_time_changes_that_paid():
    report = _report()
    assert report.compile_args == {"steps_per_execution": 16}  # jit_compile was unsafe; the batch is code
    assert [r.change for r in report.paid] == ["steps_per_execution=16", "batch size 128"]  # never the combination
    assert report.combined.speedup == pytest.approx(1.7)
    assert report.code() == ["model.compile(..., steps_per_execution=16)", "model.fit(x, y, batch_size=128)"]
    text = str(report)
    assert text.startswith("find_speedups (jax, cpu, 12.0 s): baseline 1,000 ±1.0% samples/s")
    assert "combined 1.70x" in text and "1.40x" in text and "unsafe" in text and "To apply:" in text
    markdown = report.to_markdown().splitlines()
    assert markdown[2] == "| " + " | ".join(HEADER) + " |"
    assert len(markdown) == 4 + len(report.rows)
    assert "`model.compile(..., steps_per_execution=16)`" in markdown[6]
    assert "no tensor cores: not measured" in markdown[9]
    assert [r["speedup"] for r in report.as_dict()["rows"]][2] == pytest.approx(1.4)


def test_a_combination_slower_than_one_of_its_parts_leaves_that_part_alone_to_take_and_apply():
    found = _report()
    rows = list(found.rows)
    rows[-1] = R.against_parts(rows[-1], [rows[2], rows[4]])
    assert rows[-1] == found.rows[-1]  # 1700 beats both parts: it stands
    faster = dataclasses.replace(rows[2], after=2000.0)  # steps_per_execution=16 alone beats the combination
    rows[2], rows[-1] = faster, R.against_parts(rows[-1], [faster, rows[4]])
    assert rows[-1].status == R.NO_GAIN and rows[-1].settings == {"instead": "steps_per_execution=16"}
    assert rows[-1].reason.startswith("slower than steps_per_execution=16 alone (2,000 samples/s)")
    report = dataclasses.replace(found, rows=rows)
    assert [r.change for r in report.paid] == ["steps_per_execution=16", "batch size 128"]  # each paid alone
    assert report.taken == [faster] and report.code() == ["model.compile(..., steps_per_execution=16)"]
    assert "combined 1.70x (no gain): take steps_per_execution=16 alone" in report.summary()
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    assert report.apply(model) == {"steps_per_execution": 16} and model.steps_per_execution == 16
    assert SpeedupReport.from_dict(report.as_dict()).taken == [faster]


def test_the_report_is_written_to_a_log_dir_and_tensorboard_reads_its_table_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    import json

    from keras_gpu_tools.logdir import schema
    from keras_gpu_tools.logdir.reader import find_runs, read_run

    report = _report()
    report.write(str(tmp_path))
    runs = {name: (d, files) for name, d, files in find_runs(str(tmp_path))}
    directory, files = runs[schema.SPEEDUPS_RUN]
    written = read_run(schema.SPEEDUPS_RUN, directory, files, [])
    assert written.texts[schema.SPEEDUPS_SUMMARY][-1].text == report.to_markdown()
    rows = json.loads(written.texts[schema.SPEEDUPS_SUMMARY_DATA][-1].text)["rows"]
    assert [r["change"] for r in rows] == [r.change for r in report.rows]
    measured = [r.speedup for r in report.rows if r.speedup is not None]
    assert list(written.scalars[schema.SPEEDUPS_SPEEDUP].values) == pytest.approx(measured)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(directory, size_guidance={"images": 4})
    acc.Reload()
    (image,) = acc.Images(schema.SPEEDUPS_FIGURE)
    assert image.encoded_image_string.startswith(b"\x89PNG") and image.width > 100


def test_the_training_report_shows_the_speed_ups_from_a_log_dir_and_from_the_report_itself(tmp_path):
    pytest.importorskip("matplotlib")
    from keras_gpu_tools import report as training_report
    from keras_gpu_tools.reporting.text import SPEEDUPS_HEADING

    found = _report()
    found.write(str(tmp_path))
    for source in (str(tmp_path), found):
        shown = training_report(source)
        text = str(shown)
        assert SPEEDUPS_HEADING in text and "steps_per_execution=16" in text and "no tensor cores: not measured" in text
        html = shown.html()
        assert f"<h3>{SPEEDUPS_HEADING}</h3>" in html and "<th>numerical check</th>" in html
        assert "<td>batch size 128</td>" in html and "speedups" in shown.figures()


def test_the_baseline_between_its_two_timings_is_on_their_line_and_held_at_the_nearer_outside_them():
    first, second = (10.0, 100.0), (60.0, 80.0)  # a host that slowed 20% over 50 s
    assert R.between(first, second, 35.0) == pytest.approx(90.0)
    assert R.between(first, second, 5.0) == 100.0 and R.between(first, second, 99.0) == 80.0
    # Where a time is not known, or the two are not apart in time: their mean.
    assert R.between(first, second, None) == 90.0 and R.between((None, 100.0), second, 35.0) == 90.0
    assert R.between((60.0, 100.0), second, 60.0) == 90.0
