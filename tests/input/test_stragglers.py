"""The job's figures and the straggler rule, from rows as the processes exchange them."""

import pytest

from keras_gpu_tools.input import stragglers as sg


def row(i, wait=0.02, step=20.0, samples=800.0, category="not input-bound", advice=(), peak=None, host="h"):
    figs = {
        "input/steps": 90.0,
        "input/step_ms": step,
        "input/wait_fraction": wait,
        "input/wait_ms": wait * step,
        "throughput/samples_per_sec": samples,
    }
    return sg.process_row(i, host, figs, figs, scope="epochs 2-3", category=category, advice=advice, peak_flops=peak)


def test_job_keys_are_the_same_maxima_and_sums_for_every_process():
    rows = [row(0, wait=0.02, step=20.0), row(1, wait=0.40, step=20.5), row(2, wait=0.03, step=21.0)]
    keys = sg.job_logs(rows)
    assert keys == {
        "job/step_ms_max": 21.0,
        "job/step_ms_slowest_process": 2.0,
        "job/input_wait_fraction_max": 0.40,
        "job/input_wait_process": 1.0,
        "job/samples_per_sec": 2400.0,
    }
    # A process that does not know its rate: the sum would be wrong, so it is left out (never a partial sum).
    rows[2]["epoch"]["samples_per_sec"] = None
    assert "job/samples_per_sec" not in sg.job_logs(rows)
    assert sg.job_logs([{"process": 0, "epoch": {}}]) == {}


def test_a_process_waiting_far_more_than_the_others_is_named_with_its_own_advice():
    tip = "Raise `workers` to 6 (now workers=1, ...)."
    rows = [
        row(0, wait=0.02),
        row(1, wait=0.40, category="highly input-bound", advice=[tip], host="node-b"),
        row(2, wait=0.03),
        row(3, wait=0.01),
    ]
    v = sg.job_verdict(rows)
    assert v.straggler_processes == [1] and v.stragglers[0].kind == "input wait"
    assert v.stragglers[0].others_median == pytest.approx(0.02)
    assert "Process 1 holds the job back" in v.message and "40.0%" in v.message and "2.0% (median)" in v.message
    assert "all-reduce" in v.message and "inflated too" in v.message
    assert v.advice[0] == f"Process 1: {tip}" and "node-b" in v.advice[1]
    text = v.text()
    assert "| 1 (straggler) | node-b |" in text and "| 0 | h |" in text and "What to change:" in text
    # Every process computes the same from the same rows, in whatever order they came.
    assert sg.job_verdict(list(reversed(rows))) == v


@pytest.mark.parametrize(
    "waits",
    [
        [0.02, 0.11],  # 9 points above: noise of a busy host
        [0.30, 0.45],  # 15 points above, but not twice: both wait, one a bit more
        [0.50, 0.52, 0.55],  # every process input-bound alike
        [0.0, 0.0],
    ],
)
def test_no_straggler_where_no_wait_stands_out(waits):
    v = sg.job_verdict([row(i, wait=w) for i, w in enumerate(waits)])
    assert v.stragglers == [] and v.message.startswith("No process stands out")


def test_the_boundaries_of_the_wait_rule():
    assert sg.find_stragglers([row(0, wait=0.05), row(1, wait=0.15)])[0].process == 1  # 10 points, 3x
    assert sg.find_stragglers([row(0, wait=0.10), row(1, wait=0.199)]) == []  # under 2x
    assert sg.find_stragglers([row(0, wait=0.0), row(1, wait=0.099)]) == []  # under 10 points


def test_a_slow_step_is_named_where_the_wait_is_not_what_stands_out():
    rows = [row(0, step=10.0), row(1, step=10.4), row(2, step=14.0)]
    v = sg.job_verdict(rows)
    assert v.straggler_processes == [2] and v.stragglers[0].kind == "step time"
    assert "Process 2 is slower" in v.message and "10.20 ms (median)" in v.message
    # 1.25x but under a millisecond: the noise of short steps.
    assert sg.find_stragglers([row(0, step=1.0), row(1, step=1.9)]) == []
    assert sg.find_stragglers([row(0, step=10.0), row(1, step=12.4)]) == []  # under 1.25x


def test_every_process_input_bound_alike_says_so():
    rows = [row(i, wait=0.5, category="highly input-bound") for i in range(2)]
    assert "input-bound as a whole" in sg.job_verdict(rows).message


def test_job_peak_sums_each_process_share_of_the_devices():
    # Two processes with 2 devices each: 2 x 1e12 + 2 x 3e12.
    assert sg.job_peak([row(0, peak=1e12), row(1, peak=3e12)], devices_in_step=4) == pytest.approx(8e12)
    assert sg.job_peak([row(0, peak=1e12), row(1, peak=1e12)], devices_in_step=2) == pytest.approx(2e12)
    assert sg.job_peak([row(0, peak=1e12), row(1)], devices_in_step=2) is None  # one does not know: no MFU
