"""What the package's callbacks of one fit() show: the progress bar's fields of ours, and the lines they print.

Our callbacks add their epoch figures to Keras's epoch ``logs``, so that
``History``, ``CSVLogger`` and the user's callbacks get them. Keras's progress
bar and its TensorBoard callback read the same logs; :class:`FitOutput` gives
them a view of their own (``keras_internals.view_epoch_end``):

- the progress bar shows Keras's metrics and one short field of ours at most
  (the callbacks' brief fields, the one of the lowest priority; none of a
  callback made with ``progress_bar="none"``), and every key of a callback
  made with ``progress_bar="all"``;
- ``keras.callbacks.TensorBoard`` gets none of our keys: each callback of ours
  writes its figures to its own run, so Keras's would write them a second
  time (``epoch_input/wait_fraction`` next to ``input/wait_fraction``).

Lines our callbacks print (:meth:`FitOutput.say`, wrapped by :func:`wrap`) wait for the end of the
epoch's progress bar line and are printed right under it, never inside it;
those said after the last epoch when the fit ends. The session's end puts
the callbacks back as they were.
"""

from __future__ import annotations

import math
import shutil
import sys
import textwrap
import threading
from collections.abc import Mapping
from typing import Any

from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.validation import check_choice

#: The values of a callback's ``progress_bar`` argument.
PROGRESS_BAR_CHOICES = ("brief", "all", "none")
_KEY = "fit_output"  # in FitSession.shared
NO_TERMINAL_WIDTH = 100  # characters: where our lines wrap when stdout is no terminal


class FitOutput:
    """One fit()'s progress-bar fields of ours and the lines waiting to be printed (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hidden_from_bar: set[str] = set()
        self._shown_on_bar: set[str] = set()  # keys of callbacks made with progress_bar="all"
        self._brief: dict[str, int] = {}  # brief key -> its priority (the lowest is shown)
        self._ours: set[str] = set()
        self._lines: list[str] = []
        self._restore: list = []
        self.closed = False

    @classmethod
    def of(cls, session: Any, callbacks: list[Any]) -> FitOutput:
        """The output of ``session``'s fit (``FitSession``), made and attached to ``callbacks`` by the first caller."""
        output = session.shared.get(_KEY)  # (on_train_begin: the training thread, one callback at a time)
        if output is None:
            output = session.shared[_KEY] = cls()
            output._attach(callbacks)
            session.on_close(output.close)
        return output

    def _attach(self, callbacks: list[Any]) -> None:
        bars, boards, last = ki.epoch_log_readers(callbacks)
        for bar in bars:
            self._restore.append(ki.view_epoch_end(bar, self.for_bar))
        for board in boards:
            self._restore.append(ki.view_epoch_end(board, self.for_board))
        if last is not None:  # the lines of the epoch go under its bar's line: after the bar's epoch end
            self._restore.append(ki.view_epoch_end(last, None, after=self.flush))

    # -- the epoch's figures ---------------------------------------------------------------------
    def figures(self, keys: Any, progress_bar: str, brief: str | None = None, priority: int = 0) -> None:
        """Keys a callback put into the epoch logs, and how its ``progress_bar`` argument shows them."""
        keys = set(keys)
        with self._lock:
            self._ours |= keys
            if progress_bar == "all":
                self._shown_on_bar |= keys
            else:
                self._hidden_from_bar |= keys
            if progress_bar != "none" and brief is not None and brief in keys:
                self._brief[brief] = min(priority, self._brief.get(brief, priority))

    def for_bar(self, logs: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """What the progress bar shows: Keras's metrics, our keys shown by choice, one brief field at most."""
        if logs is None:
            return None
        with self._lock:
            briefs = sorted((p, k) for k, p in self._brief.items() if _measured(logs.get(k)))
            hidden = self._hidden_from_bar - self._shown_on_bar - {k for _, k in briefs[:1]}
            ours = set(self._ours)
        shown = {k: v for k, v in logs.items() if k not in hidden and (k not in ours or _measured(v))}
        return {k: _BarFigure(v) if k in ours and isinstance(v, (int, float)) else v for k, v in shown.items()}

    def for_board(self, logs: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """What Keras's TensorBoard callback writes: every key but ours (they are in our runs already)."""
        if logs is None:
            return None
        with self._lock:
            ours = set(self._ours)
        return {k: v for k, v in logs.items() if k not in ours}

    # -- lines -------------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        """Prints ``line`` under the progress bar's line of the epoch (at the fit's end, after the last one)."""
        with self._lock:
            if not self.closed:
                self._lines.append(line)
                return
        print(line, flush=True)  # the fit has ended (a background job finishing late): nothing to wait for

    def flush(self) -> None:
        """Prints the lines said so far."""
        with self._lock:
            lines, self._lines = self._lines, []
        if lines:
            print("\n".join(lines), flush=True)

    def close(self) -> None:
        """The fit has ended: Keras's callbacks as they were, and the lines left printed."""
        restore, self._restore = self._restore, []
        for fn in reversed(restore):
            fn()
        with self._lock:
            self.closed = True
        self.flush()


class _BarFigure(float):
    """A figure of ours on Keras's bar, printed as its metrics are but never in e-notation (0.0: 0.0000)."""

    def __truediv__(self, other: Any) -> _BarFigure:  # (the bar divides by its count, 1 at an epoch end)
        return _BarFigure(float(self) / other)

    def __format__(self, spec: str) -> str:
        return format(float(self), spec.replace("e", "f"))


def wrap(text: str) -> str:
    """A line of ours at the terminal's width (100 characters without one), continued with a hanging indent.

    Only long lines are wrapped, and never inside a word or a path.
    """
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stdout
        tty = False
    width = shutil.get_terminal_size((NO_TERMINAL_WIDTH, 24)).columns if tty else NO_TERMINAL_WIDTH
    out = []
    for part in text.split("\n"):
        indent = " " * (len(part) - len(part.lstrip()) + 4)
        fits = len(part) <= width
        out.append(part if fits else textwrap.fill(part, width, subsequent_indent=indent, **_WHOLE_WORDS))
    return "\n".join(out)


_WHOLE_WORDS: dict[str, Any] = {"break_long_words": False, "break_on_hyphens": False}


def _measured(value: Any) -> bool:
    """Whether an epoch figure is known: present and not NaN ("not yet measured")."""
    try:
        return value is not None and not math.isnan(value)
    except TypeError:  # not a number: shown as it is
        return True


def check_progress_bar(value: Any) -> str:
    """A callback's ``progress_bar`` argument, checked early: one of :data:`PROGRESS_BAR_CHOICES`."""
    return check_choice("progress_bar", value, PROGRESS_BAR_CHOICES)
