"""Which training steps to profile: one window, a list, every N steps, every N epochs, or on request.

Steps are global: counted across epochs and fit() calls from 0. At most one
of ``windows``, ``every_n_steps`` and ``every_n_epochs`` is given; without
any, one window of ``num_steps`` steps starts at ``start_step``. With
``every_n_epochs`` a window starts ``start_step`` steps into every N-th
epoch (:meth:`WindowSchedule.epoch_begins`). ``triggered`` asks for a window
at the next step.

With ``steps_per_execution=N`` a call of the train function runs N steps, so a
window can only start where a call starts: it starts at the first call whose
first step is at or past its ``start_step`` (:meth:`WindowSchedule.starting_at`
with ``n=N``), and the caller runs whole calls until it has its steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_gpu_tools.errors import ProfilerWarning
from keras_gpu_tools.profiling.capture import steps_name
from keras_gpu_tools.profiling.trace import Window, validate_windows
from keras_gpu_tools.runtime import validation as check
from keras_gpu_tools.runtime.warn_once import WarnOnce


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

    @classmethod
    def checked(
        cls,
        start_step: int,
        num_steps: int,
        windows: Sequence[tuple[int, int]] | None = None,
        every_n_steps: int | None = None,
        every_n_epochs: int | None = None,
    ) -> WindowSchedule:
        """The schedule of ProfilerWindow's arguments, each checked (an error names the argument and the value)."""
        start_step = check.check_int("start_step", start_step, low=0)
        num_steps = check.check_int("num_steps", num_steps, low=1)
        given = [
            n
            for n, v in (("windows", windows), ("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs))
            if v is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"Invalid arguments: {' and '.join(f'`{g}`' for g in given)} were both given. "
                "Expected at most one of `windows`, `every_n_steps` and `every_n_epochs`."
            )
        checked = None if windows is None else validate_windows(check.check_pairs("windows", windows, non_empty=True))
        every = check.check_int("every_n_steps", every_n_steps, low=1, allow_none=True)
        if every is not None and every < num_steps:
            raise ValueError(
                f"Invalid value for argument `every_n_steps`. Received: every_n_steps={every_n_steps} with "
                f"num_steps={num_steps}: the windows would overlap. Expected every_n_steps >= num_steps."
            )
        epochs = check.check_int("every_n_epochs", every_n_epochs, low=1, allow_none=True)
        if num_steps > 500:
            WarnOnce(ProfilerWarning)(
                "big",
                f"ProfilerWindow: num_steps={num_steps} may produce a trace of over 1 GB, which TensorBoard "
                "is known to crash loading. Profile a few steps instead.",
            )
        return cls(start_step, num_steps, checked, every, epochs)

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

    def fires(self, step: int, n: int = 1) -> bool:
        """Whether a scheduled window starts in the call of ``n`` steps that begins at global ``step``."""
        start = self.next_start(step - n + 1)
        return start is not None and start <= step

    def first_call(self, step: int, n: int = 1) -> int | None:
        """How many calls of ``n`` steps from the one at ``step`` until the next window starts (None: none to come)."""
        start = self.next_start(step - n + 1)
        return None if start is None else max(0, -(-(start - step) // n))

    def starting_at(self, step: int, n: int = 1) -> tuple[Window | None, str]:
        """The window that starts in the call of ``n`` steps beginning at ``step``, and why; (None, "") if none.

        Its start is the scheduled one (at most ``n - 1`` steps before ``step``); the reason is
        ``"scheduled"``, ``"triggered"``, ``"every N steps"`` or ``"every N epoch(s)"``.
        """
        if self.triggered is not None:
            k, self.triggered = self.triggered, None
            return Window(step, k), "triggered"
        start = self.next_start(step - n + 1)
        if start is None or start > step:
            return None, ""
        step = start
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

    def unreached_report(self, fit_start: int, step: int, captured_in_fit: bool) -> tuple[list[str], str]:
        """At the end of a fit() begun at global ``fit_start``: :meth:`unreached_lines`, and a warning where it reached none."""
        lines = self.unreached_lines(step, captured_in_fit)
        if not lines or captured_in_fit:
            return lines, ""
        return lines, (
            f"ProfilerWindow: no window was reached in this fit() ({steps_name(fit_start, step - fit_start)}); "
            "lower `start_step` (or `every_n_steps`) to profile it."
        )

    def unreached_lines(self, step: int, captured_in_fit: bool) -> list[str]:
        """:meth:`unreached` in words, one line a window."""
        return [
            f"ProfilerWindow: {steps_name(w.start, w.steps)} were not captured: training ended at step {step}. "
            "A later fit() with this callback continues the count."
            for w in self.unreached(step, captured_in_fit)
        ]
