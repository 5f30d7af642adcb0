"""One figure per span: its name, its category, xprof's conclusion beside it, and a profiled window's own figure."""

from types import SimpleNamespace

import pytest

from keras_gpu_tools.input import categories, verdict, xprof
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.profiled import ProfiledWindows
from keras_gpu_tools.input.span import WHOLE_FIT, SpanFigure, span_figure, span_name, steps_label
from keras_gpu_tools.input.timing import StepStats
from keras_gpu_tools.profiling.capture import steps_name
from tests.helpers.step_records import FakeClock, run_steps

HIGHLY = "Your program is HIGHLY input-bound because 30.8% of the total step time sampled is waiting for input."
MODERATELY = "Your program is MODERATELY input-bound because 9.8% of the total step time sampled is waiting for input."
NOT = "Your program is NOT input-bound because only 2.0% of the total step time sampled is waiting for input."
POTENTIALLY = (
    "Your program is POTENTIALLY input-bound because 38.0% of the total step time sampled is spent on "
    "'All Others' time (which could be due to I/O or Python execution or both)."
)


def test_steps_are_named_from_one_as_keras_counts_batches():
    assert steps_name(20, 5) == steps_label(21, 25) == "steps 21-25"
    assert steps_name(6, 1) == steps_label(7, 7) == "step 7"


def test_span_figure_is_classified_by_the_thresholds_and_names_its_span():
    fig = span_figure("steps 21-25", Measurement(steps=5, wait_fraction=0.093))
    assert fig.category == categories.MODERATE
    assert fig.text() == "9.3% waiting for input (moderately input-bound), steps 21-25"
    assert fig.short() == "9.3% (moderately input-bound)"
    assert span_figure("steps 1-5", Measurement(wait_fraction=0.093), moderate=0.1, high=0.3).category == categories.NOT
    unknown = span_figure("steps 1-5", None)
    assert unknown.category == categories.UNKNOWN and unknown.text() == "input wait not measured, steps 1-5"


def test_a_verdict_names_its_steady_state():
    phases = [
        verdict.Phase("epoch 1", 10, 0.4, 0.03, steady=False, reason="while the cache filled"),
        verdict.Phase("epoch 2", 10, 0.02, 0.01, steady=True),
        verdict.Phase("epoch 3", 10, 0.03, 0.01, steady=True),
    ]
    m = Measurement(steps=20, wait=0.00025, step=0.01, compute=0.009, wait_fraction=0.025)
    v = verdict.verdict_for(m, scope="epochs 2-3", phases=phases)
    assert v.span == "steady state, epochs 2-3" and "over steady state, epochs 2-3." in v.message
    assert v.figure().text() == "2.5% waiting for input (not input-bound), steady state, epochs 2-3"
    whole = verdict.verdict_for(m, scope=WHOLE_FIT, phases=[phases[1], phases[2]])
    assert whole.span == "the whole fit, warm-up included" and span_name("epoch 2", left_out=False) == "epoch 2"


def test_xprof_conclusions_read_back():
    assert xprof.read_conclusion(HIGHLY) == xprof.XprofConclusion("HIGHLY", categories.HIGH, 0.308, 0.308)
    assert xprof.read_conclusion(NOT, input_percent=1.5).input_fraction == pytest.approx(0.015)
    p = xprof.read_conclusion(POTENTIALLY, input_percent=1.2)
    assert (p.word, p.category, p.figure) == ("POTENTIALLY", categories.NOT, 0.38)
    assert p.input_fraction == pytest.approx(0.012)
    assert xprof.read_conclusion("No step time measured.").word == ""


@pytest.mark.parametrize(
    "ours, conclusion, why",
    [
        (0.093, MODERATELY, ""),  # same category, shares within 2 points: xprof agrees
        (0.169, MODERATELY, xprof.LESS_REASON),  # same category, 16.9% against 9.8%: said why
        (0.05, MODERATELY, xprof.MORE_REASON),  # same category, 5.0% against 9.8%
        (0.093, HIGHLY, xprof.MORE_REASON),  # xprof's input is higher
        (0.093, NOT, xprof.LESS_REASON),  # xprof's input is lower
        (0.02, POTENTIALLY, xprof.POTENTIALLY_REASON),  # its 'All Others' is not our input
        (0.093, POTENTIALLY, xprof.LESS_REASON),  # under 5% input by xprof, over by us
    ],
)
def test_where_xprof_differs_one_sentence_says_why(ours, conclusion, why):
    fig = span_figure("steps 21-25", Measurement(wait_fraction=ours))
    lines = xprof.window_lines(fig, xprof.read_conclusion(conclusion))
    assert lines[0].startswith(f"ProfilerWindow: {fig.text()}, this window only; xprof")
    assert all(len(line) <= 200 for line in lines)
    if why:
        assert xprof.reason(fig, xprof.read_conclusion(conclusion)) == why
        assert lines[1] == f"  xprof differs: {why}" and why.count(". ") == 0  # one sentence
    else:
        assert len(lines) == 1 and "xprof agrees: MODERATELY input-bound, 9.8% input." in lines[0]


@pytest.mark.parametrize(
    "ours_ms, xprof_ms, conclusion, why",
    [
        (
            22.3,
            1.9,
            HIGHLY,
            "xprof's step is the train function's call alone (1.90 ms), ours the time between steps (22.30 ms",
        ),
        (2.0, 1.9, HIGHLY, xprof.MORE_REASON),  # the same steps: what each counts as input
        (2.0, 3.1, NOT, "xprof's traced steps took 3.10 ms, ours 2.00 ms"),
        (2.0, 2.1, NOT, xprof.LESS_REASON),
    ],
)
def test_step_times_far_apart_are_the_reason_they_give(ours_ms, xprof_ms, conclusion, why):
    fig = span_figure("steps 21-25", Measurement(wait_fraction=0.093, step=ours_ms / 1e3))
    x = xprof.read_conclusion(conclusion, step_ms=xprof_ms)
    assert xprof.reason(fig, x).startswith(why)
    assert all(len(line) <= 200 for line in xprof.window_lines(fig, x))


def test_thresholds_of_the_users_are_the_reason_where_they_alone_differ():
    fig = span_figure("steps 21-25", Measurement(wait_fraction=0.81, step=0.005), moderate=0.05, high=0.95)
    x = xprof.read_conclusion(HIGHLY, step_ms=2.0)  # a much shorter step too: the thresholds explain it first
    assert fig.category == categories.MODERATE and xprof.differs(fig, x)
    assert xprof.reason(fig, x) == (
        "by xprof's thresholds (5%, 20%) our 81.0% is highly input-bound too: the categories differ by the "
        "detector's thresholds (5%, 95%), not by the measure."
    )


def test_window_join_reports_once_when_both_halves_are_in():
    fig = SpanFigure("steps 21-25", 0.02, categories.NOT)
    analysis = SimpleNamespace(conclusion=POTENTIALLY, error="", input_percent=1.2, step_time_ms=2.0)
    for ours_first in (True, False):
        reports: list = []
        join = xprof.WindowJoin(True, lambda lines, result, out=reports: out.append((lines, result)))
        if ours_first:
            join.ours(fig)
        else:
            join.xprof(analysis)
        assert not reports
        if ours_first:
            join.xprof(analysis)
        else:
            join.ours(fig)
        join.ours(fig)  # a late repeat reports nothing more
        ((lines, result),) = reports
        assert (result.span, result.wait_fraction, result.category) == ("steps 21-25", 0.02, categories.NOT)
        assert result.reason == xprof.POTENTIALLY_REASON and result.xprof.startswith("POTENTIALLY input-bound, 1.2%")
        assert result.text.startswith("\n".join(lines)) and result.text.endswith(POTENTIALLY)
    reports = []
    alone = xprof.WindowJoin(False, lambda lines, result: reports.append(lines))
    alone.ours(fig)
    assert reports == [[f"ProfilerWindow: {fig.text()}, this window only."]]


def _records(n, fetch, compute, rest, first_index):
    """``n`` step records of serial steps (the first and last synced), from a fake clock."""
    out = []
    run_steps(
        SimpleNamespace(add=out.append), FakeClock(), n, fetch, compute, rest, lambda i: i in (20, 24), first_index
    )
    return out


def test_a_profiled_window_is_measured_as_the_detector_measures_its_windows():
    records = _records(7, fetch=0.004, compute=0.003, rest=0.001, first_index=19)  # steps 19-25: the window 20-24
    windows, reports = ProfiledWindows(), []
    windows.start(20, 5)
    for r in records[:-2]:  # up to step 23; the window stops at step 24, before its record comes
        windows.on_step(r, r.index)
    windows.stop(20, 5, xprof.WindowJoin(False, lambda lines, result: reports.append(result)), complete=True)
    assert not reports  # step 24's record is still to come
    windows.on_step(records[-2], 24)
    windows.on_step(records[-1], 25)  # after the window: nobody's
    (result,) = reports
    window = [r for r in records if 20 <= r.index < 25]
    assert result.span == "steps 21-25"
    stats = StepStats()
    for r in window:
        stats.add(r)
    assert result.wait_fraction == stats.measurement().wait_fraction == pytest.approx(0.5)
    assert result.category == categories.HIGH


def test_a_window_cut_short_is_reported_with_the_steps_it_has():
    records = _records(3, fetch=0.0002, compute=0.0098, rest=0.0, first_index=20)
    windows, reports = ProfiledWindows(moderate=0.05, high=0.2), []
    windows.start(20, 5)
    for r in records:
        windows.on_step(r, r.index)
    windows.stop(20, 3, xprof.WindowJoin(False, lambda lines, result: reports.append(result)), complete=False)
    (result,) = reports
    assert result.span == "steps 21-23" and result.category == categories.NOT
    windows.start(30, 5)
    windows.stop(30, 0, xprof.WindowJoin(False, lambda lines, result: reports.append(result)), complete=False)
    assert reports[-1].span == "step 31" and reports[-1].category == categories.UNKNOWN
