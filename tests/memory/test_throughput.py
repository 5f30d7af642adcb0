"""The throughput plan's rules with made-up measurements: the candidates, the knee, the budget, a job's merge."""

import pytest

from keras_gpu_tools.memory.throughput import (
    Budget,
    Candidate,
    candidate_sizes,
    expected_seconds,
    format_table,
    knee,
    slowest,
)


def row(b, sps, compile_s=1.0, measured=True, reason=""):
    return Candidate(
        b,
        b,
        True,
        measured=measured,
        samples_per_sec=sps if measured else None,
        compile_seconds=compile_s,
        step_seconds=b / sps if measured else None,
        reason=reason,
    )


def test_candidates_are_powers_of_two_and_the_largest_or_divisors_of_a_fixed_batch():
    assert candidate_sizes(1984, smallest=31) == [31, 62, 124, 248, 496, 992, 1984]
    assert candidate_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert candidate_sizes(0) == []
    # a fixed per-device batch of 96: powers of two that divide it, and the largest divisor that fits
    assert candidate_sizes(200, divides=96) == [1, 2, 4, 8, 16, 32, 96]
    assert candidate_sizes(50, divides=96) == [1, 2, 4, 8, 16, 32, 48]
    assert candidate_sizes(50, smallest=8, divides=96) == [8, 16, 32, 48]


def test_the_knee_is_the_smallest_batch_within_five_percent_of_the_fastest():
    rows = [row(64, 3000), row(128, 5000), row(256, 5900, 8.0), row(512, 6048, 31.6), row(1984, 5797, 322.0)]
    chosen, why = knee(rows)
    assert chosen.batch_size == 256  # 5900 >= 0.95 * 6048; 128's 5000 is not
    assert "smallest within 5% of the fastest" in why and "batch 512" in why
    assert "1984" in why and "322.0 s" in why  # the largest: slower, and its compile
    chosen, why = knee([row(64, 3000), row(128, 6000)])
    assert chosen.batch_size == 128 and "trains fastest" in why
    # ties go to the smaller batch; unmeasured rows never win
    chosen, _ = knee([row(32, 100), row(64, 100), row(128, 1e9, measured=False, reason="budget")])
    assert chosen.batch_size == 32
    assert knee([row(8, 0, measured=False, reason="x")]) == (None, "no candidate was measured")


def test_the_budget_refuses_a_candidate_that_would_not_finish_in_what_is_left():
    now = [0.0]
    budget = Budget(10.0, clock=lambda: now[0])
    assert budget.refuses(9.0) is None and Budget(None).refuses(1e9) is None
    now[0] = 4.0
    reason = budget.refuses(7.0)
    assert reason and "7.0 s" in reason and "6.0 s left of max_seconds=10" in reason
    now[0] = 11.0
    assert "spent" in budget.refuses(0.0)
    assert budget.elapsed() == 11.0


def test_the_next_candidate_is_expected_to_compile_as_much_longer_as_the_last_did():
    assert expected_seconds([]) == 0.0  # the first candidate is always measured
    assert expected_seconds([(3.0, 5.0)]) == 5.0  # one compile: as long again, plus the steady part
    # The planner's JAX conv net on an H200 (compiles 11.7, 22.3 s): the next about 43 s, as it was (43.8 s).
    assert expected_seconds([(11.7, 14.0), (22.3, 24.6)]) == pytest.approx(22.3 * 22.3 / 11.7 + 2.3)
    assert expected_seconds([(5.0, 7.0), (4.0, 6.0)]) == 6.0  # a shorter compile: never expected to shrink
    assert expected_seconds([(0.001, 1.0), (1.0, 2.0)]) == 5.0  # growth capped at 4x (noise of tiny compiles)


def test_a_job_takes_each_candidates_slowest_process_and_agrees_on_the_knee():
    fast = [row(64, 5000).as_dict(), row(128, 6000).as_dict(), row(256, 6100).as_dict()]
    slow = [row(64, 4000).as_dict(), row(128, 4100).as_dict(), row(256, 6000).as_dict()]
    merged = slowest([fast, slow])
    assert [r.samples_per_sec for r in merged] == [4000, 4100, 6000]
    assert knee(merged)[0].batch_size == 256  # not 128, which one process alone would pick
    missing = [*slow[:2], row(256, 0, measured=False, reason="budget").as_dict()]
    merged = slowest([fast, missing])
    assert not merged[2].measured and merged[2].reason == "budget"


def test_the_table_marks_the_plan_and_says_why_a_row_was_not_measured():
    text = format_table([row(64, 5000), row(128, 6000), row(256, 0, measured=False, reason="over budget")], 128)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["batch", "per", "device"]
    assert lines[2].strip().startswith("*128") and "6,000" in lines[2]
    assert lines[3].rstrip().endswith("over budget") and " - " in lines[3]


@pytest.mark.parametrize("bad", [[], [row(1, 0, measured=False)]])
def test_no_measured_candidate_gives_no_knee(bad):
    assert knee(bad)[0] is None
