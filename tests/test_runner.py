"""``python -m tests``: which session outcomes count as failures."""

from tests.__main__ import NO_TESTS, mark_expression, settled


def test_a_session_the_users_marks_leave_empty_passes_and_says_why():
    assert settled(NO_TESTS, "", "slow") == (0, "no test of this session matches -m 'slow'")


def test_a_session_that_collects_nothing_on_its_own_still_fails():
    assert settled(NO_TESTS, "no tests ran", None) == (NO_TESTS, "no tests ran")
    assert settled(1, "1 failed", "slow") == (1, "1 failed")


def test_the_users_marks_narrow_each_sessions_own():
    assert mark_expression("multibackend", "not slow") == "multibackend and (not slow)"
    assert mark_expression(None, "slow") == "slow"
    assert mark_expression("multibackend", None) == "multibackend"
