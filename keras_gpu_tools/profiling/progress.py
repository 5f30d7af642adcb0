"""ProfilerWindow's count of steps: the global step each call of the train function starts at, and the running window.

Steps are batches. With ``steps_per_execution=N`` one call runs N steps: call
``i`` of the step hook starts at global step ``step0 + (i - index0) * N``, and
at each epoch's end the count is set to where Keras says the epoch ended (its
last call may run fewer than N steps). A window starts at the first call that
starts at or past its scheduled step and runs whole calls until it has its
steps; each call adds the steps it really ran (the backend's caller sets them).
"""

from __future__ import annotations

from keras_gpu_tools.profiling.schedule import WindowSchedule
from keras_gpu_tools.profiling.trace import Window


class WindowSteps:
    """The step count of one fit and the running window's tally (``window``: None between windows)."""

    def __init__(self, schedule: WindowSchedule) -> None:
        self.schedule = schedule
        self.spe = 1  # steps per call (steps_per_execution)
        self.index0 = self.step0 = self.epoch_step0 = 0  # the hook's call `index0` starts at global `step0`
        self.window: Window | None = None
        self.asked: Window | None = None  # the window as scheduled, where it starts or ends elsewhere
        self.reason = ""
        self.done = self.calls = 0  # steps and calls the running window ran
        self.wall = 0.0  # seconds from its first call's start to its latest call's end, what ran between them in
        self.first: float | None = None  # the clock at its first call's start
        self.staging = ""  # the folder this process's profiler writes it to

    def start_fit(self, next_index: int, step: int, steps_per_execution: int) -> None:
        self.spe = max(int(steps_per_execution), 1)
        self.index0, self.step0, self.epoch_step0 = next_index, step, step

    def step_of(self, index: int) -> int:
        """The global step that the hook's call ``index`` starts at."""
        return self.step0 + (index - self.index0) * self.spe

    def end_epoch(self, next_index: int, steps: int | None) -> int:
        """The global step after an epoch that ended before call ``next_index``; ``steps``: Keras's count of it."""
        step = self.step_of(next_index)
        if steps and 0 < int(steps) < step - self.epoch_step0:  # its last call ran fewer than N steps
            step = self.epoch_step0 + int(steps)
        self.index0, self.step0, self.epoch_step0 = next_index, step, step
        return step

    def wants(self, index: int, second_call: bool) -> bool:
        """Whether call ``index`` is synced: a window's first and last calls (``second_call``: one asks for it)."""
        if self.window is None:
            return self.schedule.triggered is not None or self.schedule.fires(self.step_of(index), self.spe)
        return self.window.steps - self.done <= self.spe or second_call

    def next_call(self, index: int) -> int | None:
        """The next call this count needs from ``index`` on: every call of a window, else the next window's first."""
        if self.window is not None or self.schedule.triggered is not None:
            return index
        calls = self.schedule.first_call(self.step_of(index), self.spe)
        return None if calls is None else index + calls

    def starting(self, step: int) -> tuple[Window | None, Window | None, str]:
        """The window that starts in the call at ``step`` (its steps from there), as scheduled, and why."""
        asked, reason = self.schedule.starting_at(step, self.spe)
        return (None, None, "") if asked is None else (Window(step, asked.steps), asked, reason)

    def begin(self, window: Window, asked: Window, reason: str, staging: str) -> None:
        """``window`` starts (``asked``: as scheduled), its trace written under ``staging``."""
        self.window, self.reason, self.done, self.calls, self.wall, self.first = window, reason, 0, 0, 0.0, None
        self.staging = staging
        self.asked = asked if asked.start != window.start or asked.steps % self.spe else None

    def add(self, steps: int) -> bool:
        """A call of the running window ran ``steps`` steps; whether the window has all of its steps."""
        self.done += max(int(steps), 1)
        self.calls += 1
        return self.window is not None and self.done >= self.window.steps

    def end(self) -> Window | None:
        """The running window, which ends (None: none ran)."""
        window, self.window = self.window, None
        return window
