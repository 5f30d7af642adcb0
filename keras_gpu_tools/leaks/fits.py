"""The process's record of every fit() with a MemoryLeakDetector: the same figures per fit, across fit() calls.

Notebooks and tuning loops call fit() many times, often with a new model and a
new callback each time; the record lives in this module, once per process, so
the growth per fit is seen whichever detector instance asks. Each fit keeps
its memory at the end, a weak reference to its model (never keeping it alive)
and the count of Keras objects named since the last ``clear_session()``, which
tells a model built in a loop without ``clear_session()``.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import Slope, theil_sen

MIN_FITS = 3  # fits after the first before a growth per fit is claimed
MAX_FITS = 1000  # the record keeps the first and the last fits beyond this


@dataclasses.dataclass
class FitRecord:
    """One fit() of this process."""

    index: int  # 1, 2, ... in this process
    model_name: str
    named_at_start: int | None  # Keras objects named since the last clear_session(), at the fit's start
    model_ref: Any = None  # weakref.ref to the model, or None where it takes none
    end: Reading | None = None  # the memory at the fit's end
    epochs: int = 0

    def model(self) -> Any:
        return self.model_ref() if self.model_ref is not None else None

    def row(self) -> dict[str, Any]:
        """The fit's figures for the report (MiB)."""
        out: dict[str, Any] = {"fit": self.index, "model": self.model_name, "epochs": self.epochs}
        if self.end is not None:
            out.update({k.split("/", 1)[1]: v for k, v in self.end.figures().items()})
        if self.named_at_start is not None:
            out["keras_objects_named"] = self.named_at_start
        return out


@dataclasses.dataclass
class FitGrowth:
    """The growth per fit over the fits after the first, and what the fits say of clear_session()."""

    fits: int  # fits recorded (ended), this one included
    host: Slope | None = None  # MiB per fit
    device: Slope | None = None
    new_models: int = 0  # fits that trained a model other than the previous fit's
    uncleared: int = 0  # of those, fits whose model was built without clear_session() since the previous fit
    cleared: int = 0  # fits after a clear_session() (Keras's name counters went down)
    named_per_fit: float | None = None  # Keras objects named per such fit


class FitStore:
    """Every fit of this process, in order (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[FitRecord] = []
        self.epochs_seen = 0  # epochs of every fit: the event files' step, increasing across fits

    def begin(self, model: Any, named: int | None) -> FitRecord:
        with self._lock:
            try:
                ref = weakref.ref(model)
            except TypeError:
                ref = None
            index = self.records[-1].index + 1 if self.records else 1
            rec = FitRecord(index, str(getattr(model, "name", type(model).__name__)), named, ref)
            self.records.append(rec)
            if len(self.records) > MAX_FITS:
                del self.records[1]  # the first fit is the baseline: kept
            return rec

    def next_epoch(self) -> int:
        with self._lock:
            self.epochs_seen += 1
            return self.epochs_seen

    def ended(self) -> list[FitRecord]:
        with self._lock:
            return [r for r in self.records if r.end is not None]

    def clear(self) -> None:
        """Forgets every fit (a new experiment in the same process)."""
        with self._lock:
            self.records.clear()
            self.epochs_seen = 0

    def growth(self) -> FitGrowth:
        done = self.ended()
        g = FitGrowth(fits=len(done))
        named = []
        for prev, cur in zip(done, done[1:]):
            if cur.model() is None or cur.model() is not prev.model():
                g.new_models += 1
                a, b = prev.named_at_start, cur.named_at_start
                if a is not None and b is not None and b > a:
                    g.uncleared += 1
                    named.append(b - a)
            if prev.named_at_start is not None and cur.named_at_start is not None:
                g.cleared += cur.named_at_start <= prev.named_at_start
        if named:
            g.named_per_fit = sorted(named)[len(named) // 2]
        if len(done) >= MIN_FITS + 1:
            xs = [float(r.index) for r in done]
            g.host = _per_fit(xs, [r.end.host_rss if r.end else None for r in done])
            g.device = _per_fit(xs, [r.end.device_in_use if r.end else None for r in done])
        return g


def _per_fit(xs: list[float], values: list[float | None]) -> Slope | None:
    pts = [(x, v / MIB) for x, v in zip(xs, values) if v is not None]
    if len(pts) < MIN_FITS + 1:
        return None
    return theil_sen([p[0] for p in pts], [p[1] for p in pts])


#: The fits of this process.
PROCESS = FitStore()
