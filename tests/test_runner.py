"""``python -m tests``: which session outcomes count as failures."""

import os

from tests.__main__ import NO_TESTS, mark_expression, settled
from tests.helpers.session import ALLOCATOR_STATS, files_marked


def test_a_session_the_users_marks_leave_empty_passes_and_says_why():
    assert settled(NO_TESTS, "", "slow") == (0, "no test of this session matches -m 'slow'")


def test_a_session_that_collects_nothing_on_its_own_still_fails():
    assert settled(NO_TESTS, "no tests ran", None) == (NO_TESTS, "no tests ran")
    assert settled(1, "1 failed", "slow") == (1, "1 failed")


def test_the_users_marks_narrow_each_sessions_own():
    assert mark_expression("multibackend", "not slow") == "multibackend and (not slow)"
    assert mark_expression(None, "slow") == "slow"
    assert mark_expression("multibackend", None) == "multibackend"


def test_the_allocator_session_collects_only_the_files_that_hold_its_tests():
    files = [os.path.relpath(f) for f in files_marked(ALLOCATOR_STATS)]
    assert os.path.join("tests", "test_planner.py") in files
    assert os.path.join("tests", "test_runner.py") not in files  # it names the mark's constant, marks no test
