"""The input wait of each profiled window, measured from its steps' records as the detector measures its windows.

ProfilerWindow hands every step record here (:meth:`ProfiledWindows.on_step`);
the records of a window's steps go to a :class:`~keras_gpu_tools.input.timing.StepStats`
of its own. The window's first and last calls of the train function are
synced (ProfilerWindow asks the hook): the first ends the call before it, the
last makes its interval end where the next call starts, and on TensorFlow
both time the fetch. Steps are batches: a record of a call with
``steps_per_execution=N`` counts its N steps. When the last
step's record is in (or the window ends early), its figure goes to the
window's :class:`~keras_gpu_tools.input.xprof.WindowJoin`, which waits for
xprof's conclusion where one is coming.
"""

from __future__ import annotations

import dataclasses

from keras_gpu_tools.input.categories import XPROF_HIGH, XPROF_MODERATE
from keras_gpu_tools.input.span import span_figure
from keras_gpu_tools.input.timing import StepStats
from keras_gpu_tools.input.xprof import WindowJoin
from keras_gpu_tools.profiling.capture import steps_name
from keras_gpu_tools.runtime.step_record import StepRecord


@dataclasses.dataclass
class _Open:
    start: int  # 0-based global step
    end: int  # exclusive; the steps captured once the window stopped
    stats: StepStats = dataclasses.field(default_factory=StepStats)
    join: WindowJoin | None = None  # set when the window stops
    seen: int = 0  # steps of the window whose record came


class ProfiledWindows:
    """The profiled windows whose figure is not reported yet; ``moderate``/``high``: the category thresholds."""

    def __init__(self, moderate: float = XPROF_MODERATE, high: float = XPROF_HIGH) -> None:
        self.moderate, self.high = moderate, high
        self._open: list[_Open] = []

    def start(self, start: int, steps: int) -> None:
        """A window of ``steps`` steps begins at global step ``start``."""
        self._open.append(_Open(start, start + steps))

    def waiting(self) -> bool:
        """Whether a stopped window waits for its last step's record."""
        return any(o.join is not None for o in self._open)

    def stop(self, start: int, done: int, join: WindowJoin, complete: bool) -> None:
        """The window begun at ``start`` stopped after ``done`` steps; ``complete``: its last record is still to come."""
        for o in self._open:
            if o.start == start and o.join is None:
                o.end, o.join = start + done, join
                if not complete or o.seen >= done:
                    self._finish(o)
                return

    def on_step(self, record: StepRecord, step: int) -> None:
        """The record of the call that starts at global ``step`` (its ``steps`` steps), for its window."""
        for o in list(self._open):
            if o.start <= step < o.end:
                o.stats.add(record)
                o.seen += max(int(record.steps), 1) + max(int(record.covers), 0)  # covers counts steps too
                if o.join is not None and o.seen >= o.end - o.start:
                    self._finish(o)

    def finish_all(self) -> None:
        """Reports every stopped window with the records it has (fit() ended)."""
        for o in list(self._open):
            if o.join is not None:
                self._finish(o)
            else:
                self._open.remove(o)

    def _finish(self, o: _Open) -> None:
        self._open.remove(o)
        m = o.stats.measurement() if o.seen else None
        assert o.join is not None
        o.join.ours(span_figure(steps_name(o.start, o.end - o.start), m, self.moderate, self.high))
