"""The batch size plan in the report: from the log dir a real plan_batch_size(log_dir=...) wrote, or the plan itself."""

import base64
import math
import os
import re

import keras
import numpy as np
import pytest

from keras_gpu_tools import plan_batch_size
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.reporting.report import report

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.multibackend  # the plan is planned on each backend; its JSON and the report are the same

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A real throughput plan of a tiny model on the CPU (candidates 2, 4), written to a log dir."""
    logs = tmp_path_factory.mktemp("plan_logs")
    r = np.random.default_rng(0)
    x, y = r.random((16, 8), dtype="float32"), r.random((16, 1), dtype="float32")
    plan = plan_batch_size(
        _model(), x, y, objective="throughput", max_seconds=math.inf, max_batch_size=4, log_dir=str(logs)
    )
    return plan, logs


@pytest.mark.slow
def test_the_report_of_the_log_dir_shows_the_plan_its_table_and_figure(planned):
    plan, logs = planned
    r = report(str(logs))
    row = r.data.plan
    assert row is not None and row["objective"] == "throughput" and row["chosen"] == plan.batch_size
    assert row["candidates"] == plan.candidates  # the JSON read back: every figure of every candidate
    assert row["why"] == plan.why and row["method"] == plan.method
    # The text: the plan as print(plan) shows it, under its heading.
    text = r.text()
    assert "Batch size plan (throughput)\n----------------------------" in text
    assert str(plan) in text
    assert re.search(rf"^\s*\*{plan.batch_size}\s", text, re.M)  # the chosen row, marked
    assert re.search(r"samples/s\s+±\s", text)  # each figure's uncertainty, in its own column
    # The HTML: the same table as cells, the figure of samples/s and memory against the batch, a badge.
    page = r.html()
    assert "<h3>Batch size plan (throughput)</h3>" in page
    assert f"batch plan: {plan.batch_size} (throughput)" in page
    for c in plan.candidates:
        assert f"<td>{'*' if c.batch_size == plan.batch_size else ''}{c.batch_size}</td>" in page
        assert f"<td>{c.samples_per_sec:,.0f}</td>" in page
        assert f"<td>{100 * c.uncertainty:.1f}%</td>" in page
    (b64,) = re.findall(r'data-figure="plan"><img alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(b64).startswith(PNG_MAGIC)
    assert "plan" in r.figures()


@pytest.mark.slow
def test_the_figure_is_drawn_from_the_candidates(planned):
    plan, logs = planned
    fig = report(str(logs)).figures()["plan"]
    ax = fig.axes[0]
    samples = next(line for line in ax.get_lines() if line.get_label() == "samples/s")
    assert list(samples.get_xdata()) == [c.batch_size for c in plan.candidates]
    assert list(samples.get_ydata()) == pytest.approx([c.samples_per_sec for c in plan.candidates])
    assert ax.get_xlabel() == "batch size (global)"


@pytest.mark.slow
def test_a_plan_passed_to_report_shows_as_from_the_log_dir(planned):
    plan, logs = planned
    from_plan, from_logs = report(plan), report(str(logs))
    assert from_plan.data.plan == from_logs.data.plan
    assert "plan_batch_size" in from_plan.data.sources
    assert str(plan) in from_plan.text()
    # Callbacks and the log dir: the log dir fills in the plan.
    history = keras.callbacks.History()
    history.history = {"loss": [1.0, 0.5]}
    both = report(history, log_dir=str(logs)).data
    assert both.plan == from_logs.data.plan and "loss" in both.training


def test_a_memory_plan_is_shown_in_one_line(tmp_path):
    # Written as plan_batch_size writes it; a memory plan has no candidates, so no table and no figure.
    from keras_gpu_tools.memory.search import BatchPlan, Trial

    plan = BatchPlan(
        256, 128, 2, [900.0, 910.0], [1024.0, 1024.0], 0.1, "XLA's memory analysis", [Trial(128, [1.0], True)]
    )
    plan.write(str(tmp_path))
    r = report(str(tmp_path))
    assert r.data.plan["objective"] == "memory" and r.data.plan["candidates"] == []
    assert "Batch size plan (memory)" in r.text() and str(plan) in r.text()
    assert "plan" not in r.figures()
    assert "<table" not in r.html().split("Batch size plan (memory)")[1].split("<h3>")[0]


def test_the_plan_run_is_read_next_to_a_job_and_a_bad_record_is_noted(tmp_path):
    from keras_gpu_tools.memory.search import BatchPlan

    BatchPlan(64, 64, 1, [], [], 0.1, "timed", objective="throughput").write(str(tmp_path))
    w = EventWriter(str(tmp_path / "input" / "process_0"))  # a job's run, written after the plan
    w.scalars({schema.INPUT_STEPS: 5.0}, 5)
    w.close()
    os.utime(tmp_path / "input" / "process_0", None)
    data = report(str(tmp_path)).data
    assert data.plan is not None and data.plan["chosen"] == 64  # the plan belongs to neither layout
    assert not any("leaves them out" in n for n in data.notes)

    bad = tmp_path / "bad"
    w = EventWriter(str(bad / schema.PLAN_RUN))
    w.json(schema.PLAN_SUMMARY_DATA, ["not", "a", "plan"], 0)
    w.close()
    data = report(str(bad)).data
    assert data.plan is None
    assert any(schema.PLAN_SUMMARY_DATA in n and "not as expected" in n for n in data.notes)
