"""Which training steps to profile: one window, a list, every N steps, every N epochs, or on request.

Steps are global: counted across epochs and fit() calls from 0. At most one
of ``windows``, ``every_n_steps`` and ``every_n_epochs`` is given; without
any, one window of ``num_steps`` steps starts at ``start_step``. With
``every_n_epochs`` a window starts ``start_step`` steps into every N-th
epoch (:meth:`WindowSchedule.epoch_begins`). :meth:`WindowSchedule.trigger`
asks for a window at the next step.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_gpu_tools.profiling.trace import Window


class WindowSchedule:
    """The windows still to come, and the steps skipped (a window whose profiler could not start)."""

    def __init__(
        self,
        start_step: int,
        num_steps: int,
        windows: Sequence[Window] | None = None,
        every_n_steps: int | None = None,
        every_n_epochs: int | None = None,
    ):
        self.start_step, self.num_steps = start_step, num_steps
        self.windows, self.every_n_steps, self.every_n_epochs = windows, every_n_steps, every_n_epochs
        self.epoch_windows: list[Window] = []
        self.triggered: int | None = None  # steps of a window asked for at the next step
        self.skip_until = -1  # steps up to this one are not profiled

    def epoch_begins(self, epoch: int, step: int) -> bool:
        """Epoch ``epoch`` of a fit begins at global ``step``; whether it brings a window."""
        if self.every_n_epochs and epoch % self.every_n_epochs == 0:
            self.epoch_windows.append(Window(step + self.start_step, self.num_steps))
            return True
        return False

    def next_start(self, step: int) -> int | None:
        """The first step from ``step`` on where a scheduled window starts (None: none to come)."""
        low = max(step, self.skip_until + 1)
        if self.windows is not None:
            return min((w.start for w in self.windows if w.start >= low), default=None)
        if self.every_n_epochs:
            return min((w.start for w in self.epoch_windows if w.start >= low), default=None)
        if self.every_n_steps:
            if low <= self.start_step:
                return self.start_step
            k = -(-(low - self.start_step) // self.every_n_steps)
            return self.start_step + k * self.every_n_steps
        return self.start_step if self.start_step >= low else None

    def starting_at(self, step: int) -> tuple[Window | None, str]:
        """The window that starts at ``step``, and why (``"scheduled"``, ``"triggered"``, ...); (None, "") if none."""
        if self.triggered is not None:
            n, self.triggered = self.triggered, None
            return Window(step, n), "triggered"
        if step <= self.skip_until:
            return None, ""
        if self.windows is not None:
            for w in self.windows:
                if w.start == step:
                    return w, "scheduled"
            return None, ""
        if self.every_n_epochs:
            for w in self.epoch_windows:
                if w.start == step:
                    self.epoch_windows.remove(w)
                    return w, f"every {self.every_n_epochs} epoch(s)"
            return None, ""
        if self.every_n_steps:
            if step >= self.start_step and (step - self.start_step) % self.every_n_steps == 0:
                return Window(step, self.num_steps), f"every {self.every_n_steps} steps"
            return None, ""
        if step == self.start_step:
            return Window(step, self.num_steps), "scheduled"
        return None, ""

    def unreached(self, step: int, captured_in_fit: bool) -> list[Window]:
        """At the end of a fit() at global ``step``: the windows it did not reach (the epoch ones are dropped)."""
        pending = [w for w in (self.windows or []) if w.start >= step]
        pending += [w for w in self.epoch_windows if w.start >= step]
        self.epoch_windows = []
        if self.windows is None and not self.every_n_epochs and not captured_in_fit:
            first = max(self.start_step, step)
            if self.start_step >= step or self.every_n_steps:
                if self.every_n_steps and self.start_step < step:
                    k = -(-(step - self.start_step) // self.every_n_steps)
                    first = self.start_step + k * self.every_n_steps
                pending.append(Window(first, self.num_steps))
        return pending

    def unreached_lines(self, step: int, captured_in_fit: bool) -> list[str]:
        """:meth:`unreached` in words, one line a window."""
        return [
            f"ProfilerWindow: steps [{w.start}, {w.end}) were not captured: training ended at step {step}. "
            "A later fit() with this callback continues the count."
            for w in self.unreached(step, captured_in_fit)
        ]
