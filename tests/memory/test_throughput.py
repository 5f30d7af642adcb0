"""The throughput plan's rules with made-up measurements: the candidates, the knee, the budget, a job's merge.

Every figure here is given (step times, uncertainties, a clock moved by hand): the rules are tested, never a speed.
"""

import pytest

from keras_gpu_tools.memory.throughput import (
    STOP_CAP,
    STOP_KNOWN,
    STOP_SHARE,
    Budget,
    Candidate,
    candidate_sizes,
    could_refine,
    expected_compile,
    expected_seconds,
    finer_grid,
    finer_size,
    format_table,
    knee,
    saturation,
    slowest,
    spread,
    table_rows,
    timing_stop,
    within,
)
from keras_gpu_tools.memory.throughput_run import SMALLEST_SHARE


def row(b, sps, compile_s=1.0, measured=True, reason="", u=None, stopped="", windows=0):
    return Candidate(
        b,
        b,
        True,
        measured=measured,
        samples_per_sec=sps if measured else None,
        compile_seconds=compile_s,
        step_seconds=b / sps if measured else None,
        reason=reason,
        uncertainty=u,
        stopped=stopped,
        windows=windows,
    )


def planned_sizes(largest):
    """The first candidates for a memory maximum of ``largest`` per device, as the planner asks for them."""
    return candidate_sizes(largest, smallest=max(1, largest // SMALLEST_SHARE))


def test_candidates_are_powers_of_two_and_the_maximum_as_users_pick_them():
    # A memory maximum of 4672: powers of two, not its halvings (73, 146, 292, ...), and the maximum itself.
    assert planned_sizes(4672) == [64, 128, 256, 512, 1024, 2048, 4096, 4672]
    assert planned_sizes(1000) == [8, 16, 32, 64, 128, 256, 512, 1000]
    assert planned_sizes(1001) == planned_sizes(1007) == [8, 16, 32, 64, 128, 256, 512, 1000]  # down to a multiple of 8
    assert candidate_sizes(1984, smallest=31) == [16, 32, 64, 128, 256, 512, 1024, 1984]
    assert candidate_sizes(40) == [2, 4, 8, 16, 32, 40]
    assert candidate_sizes(7) == [2, 4, 6] and candidate_sizes(5) == [2, 4]  # below 8: even sizes
    assert candidate_sizes(3) == candidate_sizes(2) == [2] and candidate_sizes(1) == [1]  # 1 only where it is all
    assert candidate_sizes(0) == []
    for largest in (1, 2, 3, 9, 73, 292, 1000, 4672, 10**5 + 1):  # never an odd size (but a lone 1)
        sizes = planned_sizes(largest)
        assert sizes == sorted(set(sizes)) and sizes[-1] <= largest
        assert all(b % 2 == 0 for b in sizes) or sizes == [1]
        assert all(b & (b - 1) == 0 or b % 8 == 0 for b in sizes)


def test_a_fixed_batch_gets_its_divisors_that_are_multiples_of_eight_or_as_before_where_it_has_none():
    # 96: 8, 16, 32 (each at least twice the one before), then 96 itself; 24 and 48 are for finer steps
    assert candidate_sizes(200, divides=96) == [8, 16, 32, 96]
    assert candidate_sizes(50, divides=96) == [8, 16, 32, 48]  # the largest that fits
    assert candidate_sizes(50, smallest=16, divides=96) == [16, 32, 48]
    assert candidate_sizes(24, divides=24) == [8, 24]
    assert candidate_sizes(2000, divides=1920) == [8, 16, 32, 64, 128, 320, 640, 1920]
    # no divisor a multiple of 8 (or none that fits): powers of two among the divisors, and the largest
    assert candidate_sizes(12, divides=12) == [1, 2, 4, 12]
    assert candidate_sizes(6, divides=96) == [1, 2, 4, 6]
    assert finer_grid(8, 96, divides=96) == [16, 24, 32, 48] and finer_grid(1, 12, divides=12) == []


def test_a_finer_step_bisects_towards_the_knee_while_it_pays():
    coarse = [row(64, 3000, u=0.01), row(128, 4000, u=0.01), row(256, 6000, u=0.01), row(512, 6100, u=0.01)]
    assert knee(coarse)[0].batch_size == 256 and finer_size(coarse) == 192  # between 128 and 256
    # 192 within 5%: the knee moves down, and the next step halves 128..192
    assert finer_size([*coarse, row(192, 5950, u=0.01)]) == 160
    # 192 not within: the knee stays at 256, the next step halves 192..256
    assert finer_size([*coarse, row(192, 5000, u=0.01)]) == 224
    # a step that would cut the plan by less than an eighth does not pay
    assert finer_size([*coarse, row(192, 5000, u=0.01), row(224, 5200, u=0.01)]) is None
    assert finer_size([*coarse, row(192, 5950, u=0.01), row(160, 5000, u=0.01)]) is None
    # nothing measured below the knee, or no multiple of 8 between: no finer step
    assert finer_size([row(64, 6000), row(128, 6000)]) is None
    assert finer_size([row(8, 1000), row(16, 2000)]) is None
    # a fixed batch of 96: only its divisors
    assert finer_size([row(32, 1000), row(96, 3000)], divides=96) == 48
    assert could_refine([64, 128, 256]) and not could_refine([2, 4, 8, 16]) and not could_refine([8, 16])
    assert could_refine([8, 16, 32])  # 24 lies between 16 and 32


def test_the_step_time_spread_and_when_timing_stops():
    mean, rel = spread([0.010, 0.010, 0.010, 0.010])
    assert mean == pytest.approx(0.010) and rel == pytest.approx(0.0)
    mean, rel = spread([0.009, 0.011])  # stdev 0.001414 over sqrt(2), over the mean
    assert rel == pytest.approx(0.001 / 0.010)
    assert spread([0.01])[1] is None
    steady, noisy = [0.0100, 0.0101, 0.0099, 0.0100], [0.010, 0.014, 0.008, 0.012]
    kw = {"min_windows": 4, "max_windows": 40}
    assert timing_stop(steady, elapsed=1.0, share=10.0, **kw) == STOP_KNOWN
    assert timing_stop(steady[:3], elapsed=1.0, share=10.0, **kw) == ""  # known, but under min_windows
    assert timing_stop(noisy, elapsed=1.0, share=10.0, **kw) == ""  # ±12%: timed on
    assert timing_stop(noisy, elapsed=1.0, share=None, **kw) == ""  # no budget: until known or the most windows
    assert timing_stop(noisy * 10, elapsed=99.0, share=None, **kw) == STOP_CAP
    assert timing_stop(noisy[:1], elapsed=11.0, share=10.0, **kw) == ""  # one window: no spread yet
    assert timing_stop(noisy, elapsed=11.0, share=10.0, **kw) == STOP_SHARE
    # One more window of 1 s would pass the share: the timing ends within it, not a window past it.
    assert timing_stop(noisy, elapsed=9.5, share=10.0, window=1.0, **kw) == STOP_SHARE
    assert timing_stop(noisy, elapsed=9.5, share=10.0, window=0.4, **kw) == ""


def test_the_stop_rule_with_a_clock_moved_by_hand():
    # Windows of 0.25 s whose step times alternate ±10%: the mean is known to ±2% after about 25 windows.
    now, windows, stopped = 0.0, [], ""
    while not stopped:
        now += 0.25
        windows.append(0.010 * (1.1 if len(windows) % 2 else 0.9))
        stopped = timing_stop(windows, elapsed=now, share=4.0, min_windows=4, max_windows=40, window=0.25)
    assert stopped == STOP_SHARE and len(windows) == 15 and now <= 4.0  # its share of 4 s went first, not overrun
    now, windows, stopped = 0.0, [], ""
    while not stopped:
        now += 0.25
        windows.append(0.010 * (1.1 if len(windows) % 2 else 0.9))
        stopped = timing_stop(windows, elapsed=now, share=20.0, min_windows=4, max_windows=40)
    assert stopped == STOP_KNOWN and spread(windows)[1] <= 0.02 and now < 20.0


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
    # A timing's next window, as long as its last: one of 5.9 s still ends in time, one of 6 s would not.
    assert not budget.overrun(5.9) and budget.overrun(6.0) and not Budget(None).overrun(1e9)
    now[0] = 11.0
    assert "spent" in budget.refuses(0.0)
    assert budget.elapsed() == 11.0


def test_a_doubling_known_to_gain_under_one_percent_saturates_the_device():
    # A conv net's figures: 128 -> 256 gained 0.4% (±0.5%): under 1% even with its uncertainty.
    assert "device is saturated" in saturation([row(128, 26495, u=0.004), row(256, 26597, u=0.003)])
    assert "batch 256 ran +0.4% (±0.5%) against 128" in saturation([row(128, 26495, u=0.004), row(256, 26597, u=0.003)])
    assert "saturated" in saturation([row(256, 6000, u=0.01), row(512, 5000, u=0.01)])  # slower: saturated too
    assert saturation([row(128, 26495, u=0.004), row(256, 26597, u=0.01)]) == ""  # ±1.1%: a gain not ruled out
    assert saturation([row(128, 1000, u=0.001), row(256, 1100, u=0.001)]) == ""  # +10%: still climbing
    assert saturation([row(128, 1000, u=0.001), row(192, 1001, u=0.001)]) == ""  # not a doubling
    assert saturation([row(128, 1000, u=0.001), row(256, 0, measured=False, reason="x")]) == ""  # one measured
    unmeasured_last = [row(64, 1000, u=0.001), row(128, 1000, u=0.001), row(256, 0, measured=False, reason="x")]
    assert saturation(unmeasured_last) != ""
    assert saturation([row(64, 1000), row(128, 1000)]) == ""  # no uncertainty: not known to be flat


def test_a_candidate_starts_only_where_twice_its_expected_compile_fits():
    # A compile cannot be cut short and can jump past its growth: twice the expected compile is kept for it.
    now = [0.0]
    budget = Budget(110.0, clock=lambda: now[0])
    now[0] = 60.0  # 50 s left
    reason = budget.refuses(27.0, compile_seconds=25.0)
    assert reason and "about 27.0 s" in reason and "52.0 s with its compile counted 2 times" in reason
    assert "50.0 s left of max_seconds=110" in reason
    assert budget.refuses(27.0, compile_seconds=20.0) is None  # 47 s with the margin: it fits
    assert budget.refuses(45.0) is None  # no compile expected: no margin (the first candidate, torch)
    assert expected_compile([]) == 0.0 and expected_compile([(2.0, 3.0), (4.0, 5.0)]) == 8.0


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


def test_the_table_marks_the_plan_shows_each_uncertainty_and_says_why_a_row_was_not_measured():
    rows = [
        row(64, 5000, u=0.012, stopped=STOP_KNOWN),
        row(128, 6000, u=0.031, stopped=STOP_CAP, windows=8),
        row(256, 0, measured=False, reason="over budget"),
    ]
    lines = format_table(rows, 128).splitlines()
    assert lines[0].split()[:4] == ["batch", "per", "device", "samples/s"] and lines[0].split()[4] == "±"
    assert "5,000  1.2%" in lines[1] and lines[1].rstrip().endswith(" -")  # known to ±2%: no note
    assert lines[2].strip().startswith("*128") and "6,000  3.1%" in lines[2]
    assert lines[2].rstrip().endswith("not within ±2% after 8 windows (the most timed)")
    assert lines[3].rstrip().endswith("over budget") and " - " in lines[3]


def test_the_choice_counts_each_figures_uncertainty():
    best = row(512, 10000, u=0.02)
    # the ratio less its uncertainty (the two added in quadrature) must reach 95%
    assert within(row(256, 9700), row(512, 10000)) and within(row(256, 9750, u=0.002), best)  # 97.5% - 2.0%
    assert not within(row(256, 9700, u=0.01), best)  # 97.0% - 2.2% = 94.8%
    # two figures known to the timing's target (±2%) need 97.8%
    assert within(row(256, 9800, u=0.02), best) and not within(row(256, 9750, u=0.02), best)
    chosen, why = knee([row(128, 7000, u=0.01), row(256, 9800, u=0.01), best])
    assert chosen.batch_size == 256 and "uncertainties counted" in why and "±1.0%" in why and "±2.0%" in why
    # a noisy reading of a smaller batch (±4%) is not planned: within 5% nominally, perhaps 9% slower
    assert knee([row(256, 9500, u=0.04), row(512, 9800, u=0.01)])[0].batch_size == 512
    # the fastest, and any figure as fast (a copy of it, a tie), is always within, however uncertain
    assert knee([row(256, 5000, u=0.01), row(512, 9800, u=0.2)])[0].batch_size == 512
    assert within(row(512, 10000, u=0.3), best) and within(row(256, 10000, u=0.3), best)


def test_a_flat_curve_plans_the_smallest_and_says_so():
    chosen, why = knee([row(64, 5000, u=0.01), row(128, 5100, u=0.01), row(256, 5050, u=0.01)])
    assert chosen.batch_size == 64 and "the curve is flat" in why
    assert "flat" not in knee([row(64, 3000), row(128, 5000)])[1]


def test_one_candidate_measured_before_the_budget_ran_out_is_planned_and_said():
    spent = "the budget of 5 s was spent"
    chosen, why = knee(
        [row(64, 3000, u=0.05, stopped=STOP_SHARE, windows=2), row(128, 0, measured=False, reason=spent)]
    )
    assert chosen.batch_size == 64 and "only batch 64 was measured" in why and spent in why
    assert "not a knee" in why and "(64) reached no ±2% before its share of max_seconds was spent" in why
    cells = table_rows([row(64, 3000, u=0.05, stopped=STOP_SHARE, windows=2)], 64)[0]
    assert cells[3] == "5.0%" and "share of max_seconds was spent before ±2% (2 windows)" in cells[-1]


@pytest.mark.parametrize("bad", [[], [row(1, 0, measured=False)]])
def test_no_measured_candidate_gives_no_knee(bad):
    assert knee(bad)[0] is None
