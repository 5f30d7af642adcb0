"""Drawer: the newest snapshot drawn on the fit session's thread; nothing queues up behind a slow display."""

import threading
import time

from keras_gpu_tools.live.drawer import Drawer, Snapshot
from keras_gpu_tools.live.render import LiveState
from keras_gpu_tools.runtime.ticker import Ticker
from tests.helpers.timing_live import wait_until


def make(display):
    drawn, failed = [], []
    drawer = Drawer(LiveState(), display, drawn.append, failed.append)
    return drawer, drawn, failed


def test_snapshots_handed_over_during_a_draw_are_coalesced_into_the_newest():
    entered, release, returned, shown = threading.Event(), threading.Event(), threading.Event(), []

    def display(html):
        shown.append((threading.get_ident(), html))
        if len(shown) == 1:
            entered.set()
            release.wait(60)
            returned.set()

    ticker = Ticker("test-drawer-coalesce")
    drawer, drawn, failed = make(display)
    drawer.start(ticker.every)
    drawer.hand_over(Snapshot(time.monotonic(), 0, 1, {"loss": 1.0}))
    assert entered.wait(30)
    for step in range(2, 12):  # while the display holds the first picture
        drawer.hand_over(Snapshot(time.monotonic(), 0, step, {"loss": 1.0 / step}))
    # The hand-overs never waited for the blocked display: all returned while it still holds the first picture.
    assert not returned.is_set()
    hand_over = drawer.hand_over

    def final_then_release(snap):  # the display is released once the final snapshot is pending, never before
        hand_over(snap)
        release.set()

    drawer.hand_over = final_then_release  # type: ignore[method-assign]
    assert drawer.finish(Snapshot(time.monotonic(), 0, 12, {"loss": 0.05}, done=True), timeout=30)
    ticker.close(timeout=30)
    # The first picture, then only the newest: the final one (the ten in between were replaced).
    assert len(shown) == 2 and "step 1 " in shown[0][1] and "<b>Done</b>" in shown[1][1] and "step 12" in shown[1][1]
    assert {tid for tid, _ in shown} == {ticker.thread.ident} and len(drawn) == 2 and failed == []
    assert drawer.state.loss_points == [1.0, 0.05]


def test_finish_gives_up_on_a_display_that_blocks():
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def blocked(html):
        entered.set()
        release.wait(60)
        returned.set()

    ticker = Ticker("test-drawer-blocked")
    drawer, drawn, failed = make(blocked)
    drawer.start(ticker.every)
    drawer.hand_over(Snapshot(time.monotonic(), 0, 1))
    assert entered.wait(30)
    assert not drawer.finish(Snapshot(time.monotonic(), 0, 2, done=True), timeout=0.2)  # given up, not drawn
    drawer.stop()  # never waits for the draw under way
    # Both returned while the display was still blocked: neither waited for it.
    assert not returned.is_set()
    release.set()
    ticker.close(timeout=30)
    assert returned.is_set() and len(drawn) == 1 and failed == []  # the final one, given up, was never drawn


def test_a_failing_display_is_reported_once_and_nothing_is_drawn_after():
    calls = []

    def display(html):
        calls.append(html)
        raise RuntimeError("no frontend")

    ticker = Ticker("test-drawer-fails")
    drawer, drawn, failed = make(display)
    drawer.start(ticker.every)
    drawer.hand_over(Snapshot(time.monotonic(), 0, 1))
    assert wait_until(lambda: failed)
    drawer.hand_over(Snapshot(time.monotonic(), 0, 2))
    assert drawer.finish(Snapshot(time.monotonic(), 0, 3, done=True), timeout=30)  # nothing to wait for: off
    ticker.close()
    assert len(calls) == 1 and len(drawn) == 1 and [str(e) for e in failed] == ["no frontend"] and drawer.off


def test_without_a_session_thread_it_draws_on_the_callers_thread():
    shown = []
    drawer, drawn, _ = make(lambda html: shown.append(threading.get_ident()))
    drawer.hand_over(Snapshot(time.monotonic(), 0, 1))
    assert drawer.finish(Snapshot(time.monotonic(), 0, 2, done=True), timeout=1)
    assert shown == [threading.get_ident()] * 2 and len(drawn) == 2
